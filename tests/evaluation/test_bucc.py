"""The BUCC 2018 protocol against a by-hand recomputation; its files read, written
and built; every fault in them named (file, line, id); every F1 with its gold pairs."""

import json

import numpy as np
import pytest
from conftest import SHARED_DATA, TINY_PAIRS, OracleEmbedder, assert_one_line_stderr

from lealla_tf.cli import evaluate
from lealla_tf.evaluation.bucc import (
    FEW_GOLD_PAIRS,
    bucc_candidates,
    build_bucc_like_split,
    evaluate_bucc,
    gold_pairs_note,
    read_bucc_split,
    score_against_gold,
    write_bucc_split,
)
from lealla_tf.evaluation.retrieval import embed_sentences
from lealla_tf.mining.margins import best_threshold
from lealla_tf.parallel_corpus import DataFileError, find_parallel_files, read_pairs


def real_or_fixture_pairs(language="deu", count=300):
    if (SHARED_DATA / "parallel").is_dir():
        files = [f for f in find_parallel_files([str(SHARED_DATA / "parallel" / "ntrex")])
                 if f.language == language]
        return list(read_pairs(files[0].path))[:count]
    base = [p for ps in TINY_PAIRS.values() for p in ps]
    # numbered one by one: every side unique (the English sides repeat across languages)
    return [(f"{s} #{k}", f"{e} #{k}") for k, (s, e) in
            enumerate(base[k % len(base)] for k in range(count))]


@pytest.mark.parametrize("noise", [0.0, 0.7])
def test_bucc_protocol_on_pairs_hidden_among_distractors(tmp_path, noise):
    pairs = real_or_fixture_pairs(count=300)
    for split, seed in (("training", 1), ("test", 2)):
        rows = build_bucc_like_split(pairs, num_gold=40, num_distractors=60, seed=seed)
        write_bucc_split(str(tmp_path), "deu", split, *rows)
    source, english, gold = read_bucc_split(str(tmp_path), "deu", "test")
    assert len(source) == len(english) == 100 and len(gold) == 40
    embedder = OracleEmbedder(pairs, noise=noise)
    metrics = evaluate_bucc(embedder, str(tmp_path), ["deu"])

    # Recompute the protocol by hand: threshold from training gold, P/R/F1 on test.
    def candidates(split):
        s, e, g = read_bucc_split(str(tmp_path), "deu", split)
        scores, s_ids, e_ids = bucc_candidates(
            embed_sentences(embedder, [t for _, t in s]),
            embed_sentences(embedder, [t for _, t in e]), [i for i, _ in s], [i for i, _ in e])
        return scores, [(a, b) in g for a, b in zip(s_ids, e_ids)], len(g)

    scores, correct, num_gold = candidates("training")
    training = best_threshold(np.asarray(scores), np.asarray(correct), num_gold)
    assert metrics["bucc/deu/threshold"] == pytest.approx(training["threshold"])
    scores, correct, num_gold = candidates("test")
    kept = [c for score, c in zip(scores, correct) if score >= training["threshold"]]
    precision, recall = sum(kept) / len(kept), sum(kept) / num_gold
    assert metrics["bucc/deu/precision"] == pytest.approx(precision)
    assert metrics["bucc/deu/recall"] == pytest.approx(recall)
    assert metrics["bucc/deu/f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    if noise == 0.0:
        assert training["f1"] == pytest.approx(1.0)  # the oracle separates gold from distractors
        assert metrics["bucc/deu/f1"] > 0.95
    else:
        assert metrics["bucc/deu/f1"] < 0.95
    assert metrics["bucc/average_f1"] == metrics["bucc/deu/f1"]


def test_bucc_split_needs_enough_pairs():
    with pytest.raises(ValueError, match="need 50 pairs"):
        build_bucc_like_split([(f"a{i}", f"b{i}") for i in range(10)], num_gold=10,
                              num_distractors=20)
    with pytest.raises(ValueError, match="got 0 with unique sides"):
        build_bucc_like_split([("a", "b")] * 100, num_gold=10, num_distractors=20)


def test_bucc_gold_faults_are_named(tmp_path):
    """Gold naming unknown ids halved recall (they counted in its denominator); a
    missing or empty gold file scored 0. Each is refused naming the file."""
    pairs = real_or_fixture_pairs(count=300)
    for split, seed in (("training", 1), ("test", 2)):
        rows = build_bucc_like_split(pairs, num_gold=20, num_distractors=20, seed=seed)
        write_bucc_split(str(tmp_path), "deu", split, *rows)
    assert len(read_bucc_split(str(tmp_path), "deu", "test")[2]) == 20
    gold = tmp_path / "deu-en.test.gold"
    known = gold.read_text().splitlines()[:2]
    gold.write_text("\n".join(known) + "\nde-7\ten-1\n\nsrc-00000000\ten-9\nde-2 en-2\n")
    with pytest.raises(ValueError) as raised:
        evaluate_bucc(OracleEmbedder(pairs), str(tmp_path), ["deu"])
    prefix = tmp_path / "deu-en.test"
    assert str(raised.value) == (
        f"BUCC gold file {gold}: line 3: source id 'de-7' unknown; line 3: English id 'en-1' "
        "unknown; line 5: English id 'en-9' unknown; line 6 is not source id<TAB>English id: "
        "'de-2 en-2' "
        f"(ids must be in {prefix}.deu and {prefix}.en)")
    gold.write_text("\n")
    with pytest.raises(ValueError, match=f"BUCC gold file {gold} holds no pairs"):
        read_bucc_split(str(tmp_path), "deu", "test")
    gold.unlink()
    with pytest.raises(FileNotFoundError, match=f"BUCC gold file {gold} not found"):
        evaluate_bucc(OracleEmbedder(pairs), str(tmp_path), ["deu"])


# === Issue 51, item 6: a BUCC id names one sentence; every F1 states its gold ===

def bucc_split_files(tmp_path, gold=20, distractors=20):
    pairs = real_or_fixture_pairs(count=300)
    for split, seed in (("training", 1), ("test", 2)):
        rows = build_bucc_like_split(pairs, num_gold=gold, num_distractors=distractors,
                                     seed=seed)
        write_bucc_split(str(tmp_path), "deu", split, *rows)
    return pairs


def test_a_duplicated_bucc_id_is_refused_naming_the_file_and_the_id(tmp_path):
    """A sentence file holding one id twice was read, and F1 moved: a candidate of
    either sentence counted for the gold id."""
    bucc_split_files(tmp_path)
    english = tmp_path / "deu-en.test.en"
    lines = english.read_text(encoding="utf-8").splitlines()
    first_id = lines[0].split("\t")[0]
    english.write_text("\n".join(lines + [f"{first_id}\tA different sentence."]) + "\n",
                       encoding="utf-8")
    with pytest.raises(DataFileError) as raised:
        read_bucc_split(str(tmp_path), "deu", "test")
    assert raised.value.path == str(english) and raised.value.line == len(lines) + 1
    assert str(raised.value) == (f"BUCC sentence file {english}: line {len(lines) + 1}: id "
                                 f"{first_id!r} again (first on line 1): each id names one "
                                 "sentence")
    with pytest.raises(DataFileError, match=first_id):
        evaluate_bucc(OracleEmbedder(real_or_fixture_pairs(count=300)), str(tmp_path), ["deu"])


def test_a_bucc_sentence_line_that_is_not_id_tab_sentence_is_refused(tmp_path):
    bucc_split_files(tmp_path)
    source = tmp_path / "deu-en.training.deu"
    source.write_bytes(source.read_bytes() + b"\nno tab on this line\n")
    with pytest.raises(DataFileError, match=f"{source}: line 42 is not id<TAB>sentence"):
        read_bucc_split(str(tmp_path), "deu", "training")
    source.write_bytes(source.read_bytes().replace(b"no tab on this line", b"s-x\t\xff"))
    with pytest.raises(DataFileError, match=f"{source}: line 42 is not UTF-8"):
        read_bucc_split(str(tmp_path), "deu", "training")


def test_a_gold_id_paired_twice_is_refused(tmp_path):
    bucc_split_files(tmp_path)
    gold = tmp_path / "deu-en.test.gold"
    lines = gold.read_text().splitlines()
    source_id, english_id = lines[0].split("\t")
    other_english = lines[1].split("\t")[1]
    gold.write_text("\n".join(lines + [lines[0], f"{source_id}\t{other_english}"]) + "\n")
    with pytest.raises(DataFileError) as raised:
        read_bucc_split(str(tmp_path), "deu", "test")
    assert raised.value.path == str(gold)
    message = str(raised.value)
    assert f"line 21: source id {source_id!r} again (first on line 1)" in message
    assert f"line 21: English id {english_id!r} again (first on line 1)" in message
    assert f"line 22: source id {source_id!r} again (first on line 1)" in message
    assert f"line 22: English id {other_english!r} again (first on line 2)" in message


def test_every_bucc_f1_states_its_gold_pairs(tmp_path):
    pairs = bucc_split_files(tmp_path, gold=30)
    metrics = evaluate_bucc(OracleEmbedder(pairs), str(tmp_path), ["deu"])
    assert metrics["bucc/deu/gold_pairs"] == 30 and metrics["bucc/gold_pairs"] == 30
    assert metrics["bucc/deu/training_gold_pairs"] == 30


def test_evaluate_refuses_a_duplicated_bucc_id_in_one_line(tmp_path, tiny_tatoeba_dir, capsys):
    bucc_split_files(tmp_path / "bucc")
    source = tmp_path / "bucc" / "deu-en.training.deu"
    first = source.read_text(encoding="utf-8").splitlines()[0]
    source.write_text(source.read_text(encoding="utf-8") + first + "\n", encoding="utf-8")
    code = evaluate.main([f"--model={tmp_path / 'no model'}", f"--tatoeba_dir={tiny_tatoeba_dir}",
                 f"--output_json={tmp_path / 'e.json'}", f"--bucc_dir={tmp_path / 'bucc'}",
                 "--bucc_languages=deu", "--no_progress"])
    assert_one_line_stderr(code, capsys.readouterr().err, str(source),
                           repr(first.split("\t")[0]))


def test_evaluate_prints_the_gold_pairs_behind_each_bucc_f1(tmp_path, tiny_tatoeba_dir,
                                                            monkeypatch, capsys):
    pairs = bucc_split_files(tmp_path / "bucc", gold=12, distractors=10)
    monkeypatch.setattr("lealla_tf.inference.loaders.load_embedder",
                        lambda model: OracleEmbedder(pairs + [p for ps in TINY_PAIRS.values()
                                                              for p in ps]))
    assert evaluate.main(["--model=oracle", f"--tatoeba_dir={tiny_tatoeba_dir}",
                          f"--output_json={tmp_path / 'e.json'}",
                          f"--bucc_dir={tmp_path / 'bucc'}", "--bucc_languages=deu",
                          "--no_progress"]) == 0
    out = capsys.readouterr().out
    line = [row for row in out.splitlines() if row.startswith("BUCC deu")][0]
    assert "over 12 gold pairs" in line and "few" in line
    metrics = json.loads((tmp_path / "e.json").read_text())["metrics"]
    assert metrics["bucc/deu/gold_pairs"] == 12


def test_scores_against_gold_count_what_clears_the_threshold():
    gold = {("s1", "e1"), ("s2", "e2"), ("s3", "e3"), ("s4", "e4")}
    scores = [1.5, 1.4, 1.2, 1.1, 0.9]
    sources, englishes = ["s1", "s2", "s9", "s3", "s4"], ["e1", "e2", "e9", "e3", "e4"]
    result = score_against_gold(scores, sources, englishes, gold, threshold=1.15)
    assert result == {"precision": 2 / 3, "recall": 2 / 4, "f1": pytest.approx(4 / 7),
                      "mined": 3}
    nothing = score_against_gold(scores, sources, englishes, gold, threshold=2.0)
    assert nothing == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "mined": 0}


def test_a_gold_pairs_note_warns_below_few_gold_pairs():
    assert gold_pairs_note(1) == (f"over 1 gold pair, too few: under {FEW_GOLD_PAIRS}, one "
                                  "pair moves it by about 100 points")
    assert gold_pairs_note(4).startswith("over 4 gold pairs, too few") and "25 points" in \
        gold_pairs_note(4)
    assert gold_pairs_note(FEW_GOLD_PAIRS) == f"over {FEW_GOLD_PAIRS} gold pairs"
    assert gold_pairs_note(1234) == "over 1,234 gold pairs"
