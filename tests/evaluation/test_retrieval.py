"""Embedding sentences for an evaluation (length-sorted, in input order), the
blocks of rows scoring runs in, and UN-style retrieval over a large pool."""

import numpy as np
import pytest
from conftest import OracleEmbedder

from lealla_tf.evaluation.retrieval import (
    BLOCK_BYTES,
    UN_AVERAGE_P_AT_1,
    embed_sentences,
    evaluate_un_style,
    retrieval_accuracy,
    row_blocks,
)
from lealla_tf.inference.embedder import Embedder

RNG = np.random.default_rng(3)


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


def test_un_style_retrieval():
    queries = RNG.normal(size=(50, 16))
    pool = np.vstack([RNG.normal(size=(500, 16)), queries + 0.05 * RNG.normal(size=(50, 16))])
    gold = np.arange(500, 550)
    assert retrieval_accuracy(queries, pool, gold) == 1.0
    assert retrieval_accuracy(queries, pool, gold, index_type="ivf", nlist=8, nprobe=8) == 1.0
    pairs = {"deu": [(f"Satz {i}", f"sentence {i}") for i in range(60)],
             "fra": [(f"phrase {i}", f"line {i}") for i in range(40)]}
    distractors = [f"distractor sentence {i}" for i in range(300)]
    oracle = OracleEmbedder(pairs["deu"] + pairs["fra"])
    metrics = evaluate_un_style(oracle, pairs, distractors)
    assert metrics["un/pool_size"] == 400
    assert metrics["un/deu/p_at_1"] == metrics["un/fra/p_at_1"] == 1.0
    assert metrics[UN_AVERAGE_P_AT_1] == 1.0
    # A source that lands on another sentence's translation retrieves that one.
    pairs["fra"][0] = ("phrase sans traduction", "a translation of its own")
    oracle.vectors["phrase sans traduction"] = oracle.vectors["line 5"]
    metrics = evaluate_un_style(oracle, pairs, distractors)
    assert metrics["un/fra/p_at_1"] == pytest.approx(39 / 40)
    assert metrics[UN_AVERAGE_P_AT_1] == pytest.approx((1 + 39 / 40) / 2)


def test_an_embedder_embeds_through_its_encode_and_gives_empty_rows_for_none():
    """An `Embedder` batches by token length (its `encode`); no sentences give
    `[0, d]`, where a plain callable's width is unknown."""
    seen = []

    def lengths(batch):
        return np.array([len(s) for s in batch])

    def embed(batch):
        seen.append(list(batch))
        return np.array([[len(s), 1.0] for s in batch], np.float32)

    model = Embedder(embed, 2, "toy", token_lengths=lengths)
    rows = embed_sentences(model, ["ccc", "a", "bbbbbb"], batch_size=2)
    unit = np.array([[3, 1], [1, 1], [6, 1]], np.float32)
    np.testing.assert_allclose(rows, unit / np.linalg.norm(unit, axis=1, keepdims=True),
                               rtol=1e-6)
    assert seen == [["a", "ccc"], ["bbbbbb"]]
    assert embed_sentences(model, []).shape == (0, 2)


def test_blocks_are_even_and_cover_every_row():
    """`row_blocks` (the Tatoeba scoring's blocks, tests/evaluation/test_tatoeba.py):
    every row once, at most `block_rows` a block, and no block a sliver."""
    for rows, block_rows in ((3001, 1000), (10, 3), (5, 5), (5, 50), (0, 4)):
        blocks = row_blocks(rows, 7, block_rows)
        assert [i for block in blocks for i in range(block.start, block.stop)] == list(
            range(rows))
        sizes = [block.stop - block.start for block in blocks]
        assert max(sizes, default=0) <= block_rows and max(sizes, default=0) - min(
            sizes, default=0) <= 1  # no sliver of a row or two at the end
    # By default a block's float32 similarities fit BLOCK_BYTES, however many the pairs.
    for pairs in (10, 20_000, 35_000, 1_000_000):
        sizes = [block.stop - block.start for block in row_blocks(pairs, pairs)]
        assert sum(sizes) == pairs and max(sizes) * pairs * 4 <= max(BLOCK_BYTES, pairs * 4)
    with pytest.raises(ValueError, match="block_rows must be a positive integer, got 0"):
        row_blocks(10, 7, 0)
