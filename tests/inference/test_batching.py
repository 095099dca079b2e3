"""Length-aware batching: batches cut by sentences and padded tokens, each sentence
tokenized once and packed again per batch, rows back in input order."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import multilingual_sentences

from lealla_tf.inference import batching
from lealla_tf.inference.batching import (
    encode_in_length_order,
    length_batches,
    pack_rows,
    sentence_list,
    tokenize_once,
)


def numpy_tokenize(tokenizer):
    return lambda strings: {k: v.numpy() for k, v in tokenizer(tf.constant(strings)).items()}


def batch_recorder():
    """(sizes, embed_batch): an embed function that records each batch's size."""
    sizes = []

    def embed_batch(batch):
        sizes.append(len(batch))
        return np.ones((len(batch), 2), np.float32)

    return sizes, embed_batch


def test_pack_rows_rebuilds_the_tokenizers_own_batches(tokenizer):
    sentences = multilingual_sentences()
    tokenize = numpy_tokenize(tokenizer)
    # Chunks smaller than the input: the flat ids must join up across chunks.
    flat, lengths = tokenize_once(tokenize, sentences, chunk=7)
    assert flat.dtype == np.int32 and len(lengths) == len(sentences)
    assert flat.size == lengths.sum()
    assert [a.size for a in tokenize_once(tokenize, [])] == [0, 0]
    rng = np.random.default_rng(0)
    for _ in range(5):
        rows = rng.choice(len(sentences), size=9, replace=False)
        want = tokenize([sentences[i] for i in rows])
        got = pack_rows(flat, lengths, rows, tokenizer.pad_id)
        given_starts = pack_rows(flat, lengths, rows, tokenizer.pad_id,
                                 starts=np.cumsum(lengths) - lengths)
        for name in ("input_word_ids", "input_mask", "input_type_ids"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            np.testing.assert_array_equal(given_starts[name], want[name], err_msg=name)


def test_length_batches_cap_sentences_and_padded_tokens():
    lengths = [2, 2, 3, 3, 3, 5, 9, 40]
    assert length_batches(lengths, 3) == [(0, 3), (3, 6), (6, 8)]
    # sentences x the batch's longest (its last) within 10: 3 x 3, 2 x 3, then 5, 9
    # and 40 alone (40 is over the cap: a batch of its own, not an error)
    assert length_batches(lengths, 100, max_tokens=10) == [
        (0, 3), (3, 5), (5, 6), (6, 7), (7, 8)]
    assert length_batches(lengths, 2, max_tokens=10) == [
        (0, 2), (2, 4), (4, 6), (6, 7), (7, 8)]  # 2 x 5 = 10 fits
    assert length_batches(lengths, 2, max_tokens=1000) == length_batches(lengths, 2)
    assert length_batches([], 4, max_tokens=8) == []
    for bad in ({"batch_size": 0}, {"batch_size": 4, "max_tokens": 0}):
        with pytest.raises(ValueError, match=next(iter(k for k, v in bad.items() if v < 1))):
            length_batches(lengths, **bad)


def test_length_batches_come_in_whole_row_multiples_where_they_can():
    """An XLA-compiled export pads a batch to a multiple of its rows: each batch
    holds a whole multiple, the rest carried on, and only the last stays short."""
    lengths = [4] * 100 + [8] * 30
    assert length_batches(lengths, 1000, max_tokens=400) == [(0, 100), (100, 130)]
    assert length_batches(lengths, 1000, max_tokens=400, rows_multiple=32) == [
        (0, 96), (96, 128), (128, 130)]
    # fewer than the multiple fit under the cap: as without it; a sentence over the
    # cap still gets a batch of its own
    assert length_batches([40] * 5, 1000, 100, 32) == length_batches([40] * 5, 1000, 100)
    assert length_batches([2] * 40 + [500], 1000, 100, 32) == [(0, 32), (32, 40), (40, 41)]
    with pytest.raises(ValueError, match="rows_multiple"):
        length_batches(lengths, 8, rows_multiple=0)
    sizes, embed_batch = batch_recorder()
    encode_in_length_order(embed_batch, ["x"] * 70, 1000, [3] * 70, rows_multiple=32)
    assert sizes == [64, 6]


def test_a_token_cap_without_token_lengths_falls_back_to_plain_batches():
    sizes, embed_batch = batch_recorder()
    sentences = ["x" * (i % 50 + 1) for i in range(300)]
    encode_in_length_order(embed_batch, sentences, 1000, max_tokens=4)
    assert sizes == [batching.PLAIN_BATCH_SIZE] * 2 + [300 - 2 * batching.PLAIN_BATCH_SIZE]
    sizes.clear()
    encode_in_length_order(embed_batch, sentences, 1000)  # no cap asked: as given
    assert sizes == [300]


def test_sentence_list_takes_text_and_names_what_is_not():
    assert sentence_list(s for s in ["a", b"b"]) == ["a", b"b"]
    for bad, needle in (("one string", "got one string"), (b"bytes", "got one string"),
                        ({"a": 1}, "a dict: its keys would be embedded"),
                        ({"a"}, "a set, whose order is undefined"),
                        (["a", None], "sentence 1 is NoneType None"),
                        ([["nested"]], "sentence 0 is list")):
        with pytest.raises(TypeError, match=needle):
            sentence_list(bad)


def test_rows_come_back_in_input_order_with_the_padding_they_cost():
    sentences = ["cccc", "a", "bb", "dddddddd", "ee"]
    lengths = [len(s) for s in sentences]
    batches = []

    def embed_batch(batch):
        batches.append(list(batch))
        return np.array([[len(s), 0.0] for s in batch])

    rows, stats = encode_in_length_order(embed_batch, sentences, batch_size=2, lengths=lengths)
    assert rows.dtype == np.float32 and rows[:, 0].tolist() == lengths
    assert batches == [["a", "bb"], ["ee", "cccc"], ["dddddddd"]]  # stable, shortest first
    padded = 2 * 2 + 2 * 4 + 8
    assert (stats["sentences"], stats["batches"], stats["tokens"], stats["padded_tokens"]) == (
        5, 3, sum(lengths), padded)
    assert stats["padding_waste"] == pytest.approx(1 - sum(lengths) / padded)
    _, by_characters = encode_in_length_order(embed_batch, sentences, batch_size=2)
    assert "padding_waste" not in by_characters  # no token lengths: nothing to report
    with pytest.raises(ValueError, match="no sentences"):
        encode_in_length_order(embed_batch, [], batch_size=2)

