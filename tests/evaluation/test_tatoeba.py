"""Tatoeba P@1 by cosine and by margin, against numpy and on an oracle; the
metrics of one pass, which embeds each different text once; incomplete
languages named; scored in blocks of rows, with the whole matrix's results and
bounded memory; a loaded model embeds it with each tf.function traced once, and
TensorFlow warns of no retracing."""

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import TINY_PAIRS, OracleEmbedder

from lealla_tf.evaluation.tatoeba import (
    TATOEBA_PRIMARY_METRIC,
    best_and_worst,
    embed_tatoeba,
    evaluate_tatoeba,
    first_pairs,
    format_tatoeba_table,
    margin_nearest,
    nearest_candidates,
    neighbourhood_averages,
    per_language,
    tatoeba_accuracy,
    tatoeba_margin_accuracy,
    tatoeba_metrics_with_margin,
    tatoeba_with_margin,
)
from lealla_tf.mining.margins import margin_scores
from lealla_tf.parallel_corpus import find_tatoeba_languages

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
    assert metrics["tatoeba/sentences"] == 2 * len(pairs)  # both sides of every pair
    limited = evaluate_tatoeba(OracleEmbedder(pairs), tiny_tatoeba_dir, max_pairs=1)
    assert limited["tatoeba/average_p_at_1"] == 1.0 and limited["tatoeba/sentences"] == 8


def test_the_first_pairs_of_one_pass_score_as_a_pass_over_the_first_pairs(tiny_tatoeba_dir):
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


def test_a_pass_embeds_each_different_text_once_and_times_those(tiny_tatoeba_dir):
    pairs = [p for ps in TINY_PAIRS.values() for p in ps]
    oracle, seen = OracleEmbedder(pairs), []

    def counting(strings):
        seen.extend(s.decode("utf-8") for s in strings.numpy())
        return oracle(strings)

    embedded = embed_tatoeba(counting, tiny_tatoeba_dir)
    texts = [text for pair in pairs for text in pair]
    assert len(set(texts)) < len(texts)  # the fixture's English sides repeat
    assert sorted(seen) == sorted(set(texts)) and embedded.distinct_sentences == len(set(texts))
    for language, language_pairs in TINY_PAIRS.items():  # every row is its own text's
        source, english = embedded[language]
        for row, (source_text, english_text) in enumerate(language_pairs):
            np.testing.assert_array_equal(source[row], np.float32(oracle.vectors[source_text]))
            np.testing.assert_array_equal(english[row], np.float32(oracle.vectors[english_text]))
    metrics = tatoeba_metrics_with_margin(embedded, seconds=2.0)
    assert metrics["tatoeba/sentences"] == len(texts)
    assert metrics["tatoeba/sentences_per_second"] == len(set(texts)) / 2.0


def test_an_incomplete_tatoeba_language_is_named_not_dropped(tiny_tatoeba_dir, tmp_path):
    """With deu's .eng file gone the average was taken over the other three
    languages, exit 0. Each incomplete pair of files is now named."""
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
    languages = find_tatoeba_languages(str(shared_data / "tatoeba_dev"))
    assert len(languages) == len(list((shared_data / "tatoeba_dev").glob("tatoeba.*-eng.eng")))


def test_per_language_values_a_table_and_the_best_and_worst():
    metrics = {"tatoeba/deu/p_at_1": 0.9, "tatoeba/deu/xx_to_en": 0.8,
               "tatoeba/deu/en_to_xx": 1.0, "tatoeba/deu/pairs": 10,
               "tatoeba/fra/p_at_1": 0.5, "tatoeba/fra/xx_to_en": 0.5,
               "tatoeba/fra/en_to_xx": 0.5, "tatoeba/fra/pairs": 4,
               "tatoeba_margin/deu/p_at_1": 0.95, TATOEBA_PRIMARY_METRIC: 0.7,
               "tatoeba/languages": 2}
    assert per_language(metrics) == {"deu": 0.9, "fra": 0.5}
    assert per_language(metrics, "pairs") == {"deu": 10, "fra": 4}
    table = format_tatoeba_table(metrics).splitlines()
    assert table[0].split() == ["language", "pairs", "xx->en", "en->xx", "P@1", "margin"]
    assert table[1].split() == ["deu", "10", "80.0", "100.0", "90.0", "95.0"]
    assert table[2].split() == ["fra", "4", "50.0", "50.0", "50.0", "nan"]
    assert table[3].split() == ["average", "70.00", "nan"]
    values = {"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.5}
    assert best_and_worst(values, 2) == (["b", "c"], ["d", "a"])  # ties by name


# === Scoring in blocks of rows (issue 62) ===

def unit(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def matrix_scores(source, english, k, margin, dtype=np.float32):
    """The whole similarity matrix in `dtype`, each side's neighbourhood
    averages over its k nearest, and the margin scores."""
    similarities = unit(source).astype(dtype) @ unit(english).astype(dtype).T
    k = min(k, len(english))
    source_average = -np.sort(-similarities, axis=1)[:, :k].mean(axis=1)
    english_average = -np.sort(-similarities.T, axis=1)[:, :k].mean(axis=1)
    scores = margin_scores(similarities, source_average[:, None], english_average[None, :],
                           margin)
    return similarities, source_average, english_average, scores


def whole_matrix(source, english, k, margin):
    """The scoring as it was, on the whole similarity matrix: each side's
    nearest by cosine, the neighbourhood averages, and each side's nearest by
    margin (np.argmax: the first of ties)."""
    _, source_average, english_average, scores = matrix_scores(source, english, k, margin)
    return {"cosine": (np.argmax(unit(source) @ unit(english).T, axis=1),
                       np.argmax(unit(english) @ unit(source).T, axis=1)),
            "averages": (source_average, english_average),
            "margin": (np.argmax(scores, axis=1), np.argmax(scores, axis=0))}


def tied(n, d=16, seed=0):
    """Rows of four entries +-1 (unit rows of +-0.5): every cosine is a multiple
    of 0.25, exact in any order of summation, so ties abound; row 3 is NaN."""
    rng = np.random.default_rng(seed)
    rows = np.zeros((n, d), np.float32)
    for row in rows:
        row[rng.choice(d, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
    rows[3] = np.nan
    return rows


def reference_scores(source, english, k, margin):
    """The whole matrix's cosines and margin scores in float64, each side's rows
    its queries: what a choice between near-equal candidates is judged by."""
    similarities, _, _, scores = matrix_scores(source, english, k, margin, np.float64)
    return {"cosine": (similarities, similarities.T), "margin": (scores, scores.T)}


def assert_same_or_rounding_tie(have, want, scores, message):
    """`have` picks what `want` picks, or a candidate whose exact score is
    within float32 rounding of it: BLAS may round a product differently by
    the matrix's shape and the row's place in it, even for two equal candidate
    rows, so a tie between equal rows may go either way there."""
    assert have.shape == want.shape and have.dtype == want.dtype, message
    rows = np.flatnonzero(have != want)
    gap = np.abs(scores[rows, have[rows]] - scores[rows, want[rows]])
    assert np.all(gap <= 1e-6), f"{message}: rows {rows[gap > 1e-6]} pick other candidates"


@pytest.mark.parametrize("data", ["tied", "gaussian"])
def test_scoring_in_blocks_equals_the_whole_matrix_ties_included(data):
    """Blocks of rows smaller than the set give the whole matrix's nearest
    neighbours, neighbourhood averages and margin nearest, ties going to the
    first candidate as np.argmax breaks them (a NaN row too). Where every
    cosine is exact in any order of summation (`tied`), bit for bit; on
    Gaussian rows with repeats, to float32 rounding: a tie between two equal
    rows may go to either, and to nothing else."""
    exact = data == "tied"
    if exact:
        source, english = tied(61), tied(61, seed=1)
        block_sizes = (1, 2, 7, 16, 60, 61, 500)
    else:  # a language's sentences, some repeated (ties between equal rows)
        rng = np.random.default_rng(5)
        source = rng.normal(size=(203, 48)).astype(np.float32)
        english = (source + 0.8 * rng.normal(size=source.shape)).astype(np.float32)
        english[100:110], source[150:160] = english[:10], source[:10]
        block_sizes = (9, 50, 64, 202)
    for k in (1, 4, 8, 9):
        for margin in ("ratio", "ratio_shifted", "distance", "absolute"):
            expected = whole_matrix(source, english, k, margin)
            scores = None if exact else reference_scores(source, english, k, margin)
            for block_rows in block_sizes:
                got = {"cosine": (nearest_candidates(source, english, block_rows),
                                  nearest_candidates(english, source, block_rows)),
                       "averages": neighbourhood_averages(source, english, k, block_rows),
                       "margin": margin_nearest(source, english, k, margin, block_rows)}
                for name, pair in expected.items():
                    for side, (want, have) in enumerate(zip(pair, got[name])):
                        message = f"{data} k={k} {margin} block_rows={block_rows} {name}[{side}]"
                        if exact:
                            np.testing.assert_array_equal(have, want, err_msg=message)
                        elif name == "averages":
                            np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-7,
                                                       err_msg=message)
                        else:
                            assert_same_or_rounding_tie(have, want, scores[name][side], message)
                        assert have.dtype == want.dtype
            rows = np.arange(len(source))
            forward, backward = (expected["cosine"] if exact else
                                 (nearest_candidates(source, english, 7),
                                  nearest_candidates(english, source, 7)))
            assert tatoeba_accuracy(source, english, block_rows=7) == {
                "xx_to_en": np.mean(forward == rows), "en_to_xx": np.mean(backward == rows),
                "p_at_1": (np.mean(forward == rows) + np.mean(backward == rows)) / 2}
            forward, backward = (expected["margin"] if exact else
                                 margin_nearest(source, english, k, margin, 7))
            assert tatoeba_margin_accuracy(source, english, k, margin, block_rows=7) == {
                "xx_to_en": np.mean(forward == rows), "en_to_xx": np.mean(backward == rows),
                "p_at_1": (np.mean(forward == rows) + np.mean(backward == rows)) / 2}


def test_scoring_memory_stays_bounded_whatever_the_set_size(monkeypatch):
    """With blocks far smaller than the set, scoring never holds a matrix of all
    the pairs: the peak stays under a quarter of one's float32 bytes."""
    import tracemalloc

    from lealla_tf.evaluation import retrieval

    n = 2000
    rng = np.random.default_rng(0)
    source = rng.normal(size=(n, 8)).astype(np.float32)
    english = (source + rng.normal(size=source.shape)).astype(np.float32)
    monkeypatch.setattr(retrieval, "BLOCK_BYTES", 50 * n * 4, raising=False)
    for score in (tatoeba_accuracy, tatoeba_margin_accuracy):
        tracemalloc.start()
        try:
            score(source, english)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < n * n * 4 / 4, (score.__name__, peak)



# In a fresh process (TensorFlow's retracing detector is global, and warns twice at
# most): every tf.function made is kept; a model is loaded twice, as the main job
# loads its student after the teacher, and Tatoeba is embedded two sentences a call,
# so batches come in many shapes. Prints the most traces of any one function, then
# how many retracing warnings TensorFlow logged.
RETRACING_PROBE = textwrap.dedent("""
    import logging, sys
    import tensorflow as tf
    from lealla_tf.evaluation.tatoeba import embed_tatoeba
    from lealla_tf.inference.loaders import load_embedder

    made, tf_function = [], tf.function
    def keep(func=None, **options):
        if func is None:
            return lambda f: keep(f, **options)
        made.append(tf_function(func, **options))
        return made[-1]
    tf.function = keep
    warnings = []
    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())
    logging.getLogger("tensorflow").addHandler(Keep())
    for _ in range(2):
        embed_tatoeba(load_embedder(sys.argv[1]), sys.argv[2], batch_size=2)
    print(max([0] + [f.experimental_get_tracing_count() for f in made]),
          sum("triggered tf.function retracing" in w for w in warnings))
""")


def test_evaluating_a_loaded_model_traces_each_function_once_and_warns_of_none(
        sentencepiece_export, tiny_tatoeba_dir):
    done = subprocess.run([sys.executable, "-c", RETRACING_PROBE, sentencepiece_export,
                           tiny_tatoeba_dir], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    most_traces, warnings = map(int, done.stdout.split())
    assert most_traces == 1
    assert warnings == 0, done.stderr[-3000:]
