"""Evaluations: Tatoeba (cosine and margin), BUCC protocol, UN-style retrieval, CLI."""

import json

import numpy as np
import pytest
from conftest import SHARED_DATA, TINY_PAIRS, OracleEmbedder

from lealla_tf.evaluation.retrieval import (
    build_bucc_like_split,
    embed_sentences,
    evaluate_bucc,
    evaluate_tatoeba,
    evaluate_un_style,
    read_bucc_split,
    retrieval_accuracy,
    tatoeba_accuracy,
    tatoeba_margin_accuracy,
    write_bucc_split,
)
from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

RNG = np.random.default_rng(3)


def test_tatoeba_accuracy_against_numpy():
    source, english = RNG.normal(size=(30, 8)), RNG.normal(size=(30, 8))
    english[:20] = source[:20] + 0.01 * RNG.normal(size=(20, 8))
    scores = tatoeba_accuracy(source, english)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    similarity = unit(source) @ unit(english).T
    forward = np.mean(similarity.argmax(1) == np.arange(30))
    backward = np.mean(similarity.argmax(0) == np.arange(30))
    assert scores["xx_to_en"] == pytest.approx(forward)
    assert scores["en_to_xx"] == pytest.approx(backward)
    assert scores["p_at_1"] == pytest.approx((forward + backward) / 2)
    assert scores["xx_to_en"] >= 20 / 30


def test_margin_beats_cosine_on_a_hub():
    # Every source shares a component c; English sentence 0 is (almost) c itself,
    # a hub close to every source, which steals cosine retrieval but not margin.
    rng = np.random.default_rng(11)
    d = 16
    common = 1.5 * rng.normal(size=d)
    base = rng.normal(size=(20, d))
    source = base + common
    english = base + 0.5 * rng.normal(size=base.shape)
    english[0] = 3 * common + 0.1 * rng.normal(size=d)
    cosine = tatoeba_accuracy(source, english)["xx_to_en"]
    margin = tatoeba_margin_accuracy(source, english)["xx_to_en"]
    assert margin > cosine + 0.2


def test_evaluate_tatoeba_with_oracle(tiny_tatoeba_dir):
    pairs = [p for ps in TINY_PAIRS.values() for p in ps]
    metrics = evaluate_tatoeba(OracleEmbedder(pairs), tiny_tatoeba_dir)
    # English sentences repeat across languages but within a language are distinct.
    assert metrics["tatoeba/average_p_at_1"] == pytest.approx(1.0)
    assert metrics["tatoeba/languages"] == 4
    limited = evaluate_tatoeba(OracleEmbedder(pairs), tiny_tatoeba_dir, max_pairs=1)
    assert limited["tatoeba/average_p_at_1"] == 1.0


def test_embed_sentences_keeps_input_order():
    seen = []

    def embed(strings):
        values = [len(s) for s in strings.numpy()]
        seen.append(values)
        return np.array([[v, 1.0] for v in values], np.float32)

    sentences = ["ccc", "a", "bbbbbb", "dd", "e"]
    result = embed_sentences(embed, sentences, batch_size=2)
    assert result[:, 0].tolist() == [3, 1, 6, 2, 1]
    assert all(v == sorted(v) for v in seen)  # batches were length-sorted
    with pytest.raises(ValueError, match="no sentences"):  # its width is unknown
        embed_sentences(embed, [])


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
    from lealla_tf.evaluation.retrieval import bucc_candidates
    from lealla_tf.mining.margins import best_threshold

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
            embed_sentences(embedder, [t for _, t in s]), embed_sentences(embedder, [t for _, t in e]),
            [i for i, _ in s], [i for i, _ in e])
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


def test_un_style_retrieval():
    queries = RNG.normal(size=(50, 16))
    pool = np.vstack([RNG.normal(size=(500, 16)), queries + 0.05 * RNG.normal(size=(50, 16))])
    gold = np.arange(500, 550)
    assert retrieval_accuracy(queries, pool, gold) == 1.0
    assert retrieval_accuracy(queries, pool, gold, index_type="ivf", nlist=8, nprobe=8) == 1.0
    pairs = real_or_fixture_pairs(count=60)
    distractors = [f"distractor sentence {i}" for i in range(300)]
    metrics = evaluate_un_style(OracleEmbedder(pairs), {"deu": pairs}, distractors)
    assert metrics["un/pool_size"] == 360 and metrics["un/deu/p_at_1"] == 1.0


def test_evaluate_cli_writes_table_json_and_png(tmp_path, tiny_tatoeba_dir, sentence_vocab_file,
                                                capsys):
    from lealla_tf.cli.evaluate import main
    from lealla_tf.configs import EncoderConfig
    from lealla_tf.inference.export import export_lealla_model
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    tokenizer = Tokenizer(sentence_vocab_file)
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=8, intermediate_dim=8))
    export_lealla_model(encoder, tokenizer, str(tmp_path / "model"))
    output = tmp_path / "report" / "eval.json"
    assert main([f"--model={tmp_path / 'model'}", f"--tatoeba_dir={tiny_tatoeba_dir}",
                 f"--output_json={output}", "--no_progress"]) == 0
    result = json.loads(output.read_text())
    assert result["primary_metric"] == "tatoeba/average_p_at_1"
    value = result["metrics"]["tatoeba/average_p_at_1"]
    assert 0.0 <= value <= 1.0 and "tatoeba_margin/average_p_at_1" in result["metrics"]
    assert (tmp_path / "report" / "eval.png").stat().st_size > 5000
    out = capsys.readouterr().out
    assert "average" in out and "deu" in out
    assert main([f"--model={tmp_path / 'nothing'}", f"--tatoeba_dir={tiny_tatoeba_dir}",
                 f"--output_json={output}"]) == 2


def test_the_first_pairs_of_one_pass_score_as_a_pass_over_the_first_pairs(tiny_tatoeba_dir):
    from lealla_tf.evaluation.retrieval import (
        embed_tatoeba,
        first_pairs,
        tatoeba_metrics_with_margin,
        tatoeba_with_margin,
    )

    pairs = [p for ps in TINY_PAIRS.values() for p in ps]
    embed = OracleEmbedder(pairs, noise=1.2, seed=4)  # noisy: some pairs are missed
    embedded = embed_tatoeba(embed, tiny_tatoeba_dir)
    sliced = tatoeba_metrics_with_margin(first_pairs(embedded, 2), seconds=1.0)
    direct = tatoeba_with_margin(embed, tiny_tatoeba_dir, max_pairs=2, progress=False)
    assert sliced["tatoeba/sentences"] == direct["tatoeba/sentences"] == 16
    assert sliced["tatoeba/sentences_per_second"] == 16.0
    for key, value in direct.items():
        if "second" not in key:
            assert sliced[key] == pytest.approx(value, abs=1e-6), key
    with pytest.raises(ValueError, match="positive"):
        first_pairs(embedded, 0)


def test_an_incomplete_tatoeba_language_is_named_not_dropped(tiny_tatoeba_dir, tmp_path):
    """With deu's .eng file gone the average was taken over the other three
    languages, exit 0. Each incomplete pair of files is now named."""
    import shutil

    from lealla_tf.parallel_corpus import find_tatoeba_languages

    pairs = [p for ps in TINY_PAIRS.values() for p in ps]
    complete = evaluate_tatoeba(OracleEmbedder(pairs), tiny_tatoeba_dir)
    assert complete["tatoeba/languages"] == 4 and complete["tatoeba/average_p_at_1"] == 1.0
    shutil.copytree(tiny_tatoeba_dir, tmp_path / "t")
    (tmp_path / "t" / "tatoeba.deu-eng.eng").unlink()
    (tmp_path / "t" / "tatoeba.rus-eng.rus").unlink()
    (tmp_path / "t" / "README.md").write_text("not a Tatoeba file")
    message = (f"incomplete Tatoeba languages in {tmp_path / 't'}: tatoeba.deu-eng.eng is "
               "missing (tatoeba.deu-eng.deu is there); tatoeba.rus-eng.rus is missing "
               "(tatoeba.rus-eng.eng is there) (add the missing files or remove the others)")
    for call in (lambda: find_tatoeba_languages(str(tmp_path / "t")),
                 lambda: evaluate_tatoeba(OracleEmbedder(pairs), str(tmp_path / "t"))):
        with pytest.raises(ValueError) as raised:
            call()
        assert str(raised.value) == message
    (tmp_path / "t" / "tatoeba.rus-eng.eng").unlink()
    (tmp_path / "t" / "tatoeba.deu-eng.deu").unlink()
    assert find_tatoeba_languages(str(tmp_path / "t")) == ["cmn", "fra"]


def test_the_shared_tatoeba_dev_has_no_incomplete_language(shared_data):
    from lealla_tf.parallel_corpus import find_tatoeba_languages

    languages = find_tatoeba_languages(str(shared_data / "tatoeba_dev"))
    assert len(languages) == len(list((shared_data / "tatoeba_dev").glob("tatoeba.*-eng.eng")))


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
    """A sentence file holding one id twice was read, and F1 moved (60.0 to 72.7
    in the probe): a candidate of either sentence counted for the gold id."""
    from lealla_tf.parallel_corpus import DataFileError

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
    from lealla_tf.parallel_corpus import DataFileError

    bucc_split_files(tmp_path)
    source = tmp_path / "deu-en.training.deu"
    source.write_bytes(source.read_bytes() + b"\nno tab on this line\n")
    with pytest.raises(DataFileError, match=f"{source}: line 42 is not id<TAB>sentence"):
        read_bucc_split(str(tmp_path), "deu", "training")
    source.write_bytes(source.read_bytes().replace(b"no tab on this line", b"s-x\t\xff"))
    with pytest.raises(DataFileError, match=f"{source}: line 42 is not UTF-8"):
        read_bucc_split(str(tmp_path), "deu", "training")


def test_a_gold_id_paired_twice_is_refused(tmp_path):
    from lealla_tf.parallel_corpus import DataFileError

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
    from conftest import assert_one_line_stderr

    from lealla_tf.cli.evaluate import main

    bucc_split_files(tmp_path / "bucc")
    source = tmp_path / "bucc" / "deu-en.training.deu"
    first = source.read_text(encoding="utf-8").splitlines()[0]
    source.write_text(source.read_text(encoding="utf-8") + first + "\n", encoding="utf-8")
    code = main([f"--model={tmp_path / 'no model'}", f"--tatoeba_dir={tiny_tatoeba_dir}",
                 f"--output_json={tmp_path / 'e.json'}", f"--bucc_dir={tmp_path / 'bucc'}",
                 "--bucc_languages=deu", "--no_progress"])
    assert_one_line_stderr(code, capsys.readouterr().err, str(source),
                           repr(first.split("\t")[0]))


def test_evaluate_prints_the_gold_pairs_behind_each_bucc_f1(tmp_path, tiny_tatoeba_dir,
                                                            monkeypatch, capsys):
    from lealla_tf.cli import evaluate

    pairs = bucc_split_files(tmp_path / "bucc", gold=12, distractors=10)
    monkeypatch.setattr("lealla_tf.inference.embedder.load_embedder",
                        lambda model: OracleEmbedder(pairs + [p for ps in TINY_PAIRS.values()
                                                              for p in ps]))
    assert evaluate.main(["--model=oracle", f"--tatoeba_dir={tiny_tatoeba_dir}",
                          f"--output_json={tmp_path / 'e.json'}",
                          f"--bucc_dir={tmp_path / 'bucc'}", "--bucc_languages=deu",
                          "--no_progress"]) == 0
    out = capsys.readouterr().out
    line = [l for l in out.splitlines() if l.startswith("BUCC deu")][0]
    assert "over 12 gold pairs" in line and "few" in line
    metrics = json.loads((tmp_path / "e.json").read_text())["metrics"]
    assert metrics["bucc/deu/gold_pairs"] == 12
