"""The export formats: each written, reloaded in a fresh process with every loader its
contract names, and compared with the in-memory model."""

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from conftest import BAD_INPUTS, multilingual_sentences

from lealla_tf.configs import EncoderConfig, config_to_dict
from lealla_tf.inference import formats
from lealla_tf.inference.export_info import read_export_info
from lealla_tf.inference.loaders import load_embedder, model_kind
from lealla_tf.inference.reload_check import reload_in_fresh_process
from lealla_tf.models.encoder import build_encoder
from lealla_tf.models.model_dir import TokenizerConfig, save_encoder_checkpoint, write_model_config
from lealla_tf.tokenizers.tokenizer import Tokenizer

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model(sentence_vocab_file):
    tokenizer = Tokenizer(sentence_vocab_file, max_seq_length=32)
    encoder = build_encoder(EncoderConfig(
        vocabulary_size=tokenizer.vocab_size, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, dropout=0.1))
    return encoder, tokenizer


@pytest.fixture(scope="module")
def sentences():
    return multilingual_sentences() + list(BAD_INPUTS.values())


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    encoder, tokenizer = model
    root = tmp_path_factory.mktemp("exports")
    return {
        "lealla": formats.export_lealla_model(encoder, tokenizer, str(root / "lealla")),
        "labse": str(root / "labse"),
        "labse_paths": formats.export_labse_pair(encoder, tokenizer, str(root / "labse")),
        "encoder_only": formats.export_encoder_only(encoder, str(root / "encoder_only")),
    }


def probe(loader, export_format, path, sentences, tmp_path):
    """Runs the reload check in a fresh Python process and returns its arrays."""
    return reload_in_fresh_process(path, sentences, loader, export_format)


def expected_outputs(model, sentences):
    encoder, tokenizer = model
    return encoder(tokenizer(tf.constant(sentences)), training=False)


def assert_weights_equal(results, variables):
    loaded = [results[k] for k in sorted(results) if k.startswith("weight_")]
    assert len(loaded) == len(variables)
    for got, want in zip(loaded, variables):
        np.testing.assert_array_equal(got, np.asarray(want))


def assert_dropout_only_in_training(results, reference):
    assert np.abs(results["training_a"] - results["training_b"]).max() > 1e-4
    assert np.abs(results["training_a"] - reference).max() > 1e-4


def test_lealla_format_with_tf_saved_model_load(model, sentences, exported, tmp_path):
    results = probe("saved_model_load", "lealla", exported["lealla"], sentences, tmp_path)
    expected = expected_outputs(model, sentences)["sentence_embedding"].numpy()
    np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)
    np.testing.assert_allclose(results["signature"], expected, atol=TOLERANCE)
    # Batch invariance: alone (no padding) or among others, the same vector.
    np.testing.assert_allclose(results["single"], results["batch"], atol=TOLERANCE)
    assert np.isfinite(results["batch"]).all()
    np.testing.assert_allclose(np.linalg.norm(results["batch"], axis=1), 1.0, atol=1e-5)
    assert_dropout_only_in_training(results, results["batch"])
    assert_weights_equal(results, model[0].trainable_variables)
    assert int(results["variables_count"]) == len(model[0].weights)


def test_lealla_format_with_hub_keras_layer(model, sentences, exported, tmp_path):
    results = probe("hub_keras_layer", "lealla", exported["lealla"], sentences, tmp_path)
    expected = expected_outputs(model, sentences)["sentence_embedding"].numpy()
    np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)
    np.testing.assert_allclose(results["training_false"], expected, atol=TOLERANCE)
    assert_dropout_only_in_training(results, expected)
    assert_weights_equal(results, model[0].trainable_variables)


def test_the_main_jobs_batch_only_check_records_the_batch_alone(model, sentences, exported):
    """`only_batch`: the same hub.KerasLayer load and batch embeddings as the full
    check, and nothing else (no dropout runs, no weights, no fit)."""
    results = reload_in_fresh_process(exported["lealla"], sentences, "hub_keras_layer",
                                      only_batch=True)
    assert sorted(results) == ["batch"]
    expected = expected_outputs(model, sentences)["sentence_embedding"].numpy()
    np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)


def test_compiled_lealla_format_equals_the_model_in_a_fresh_process(model, sentences, tmp_path):
    encoder, tokenizer = model
    path = formats.export_lealla_model(encoder, tokenizer, str(tmp_path / "jit"),
                                          jit_compile=True)
    graph = str(tf.saved_model.load(path).signatures["serving_default"].graph.as_graph_def())
    assert "XlaMustCompile" in graph or "_XlaMustCompile" in graph
    results = probe("hub_keras_layer", "lealla", path, sentences, tmp_path)
    expected = expected_outputs(model, sentences)["sentence_embedding"].numpy()
    np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)
    np.testing.assert_allclose(results["training_false"], expected, atol=TOLERANCE)
    assert_dropout_only_in_training(results, expected)


def test_bfloat16_lealla_format_in_a_fresh_process(model, sentences, tmp_path):
    """`precision="bfloat16"`: the same contract (float32 unit rows, float32 weights
    as trained, dropout only in training), computed in bfloat16, within rounding
    of the float32 model; its record says so."""
    encoder, tokenizer = model
    path = formats.export_lealla_model(encoder, tokenizer, str(tmp_path / "bf16"),
                                       precision="bfloat16")
    results = probe("saved_model_load", "lealla", path, sentences, tmp_path)
    expected = expected_outputs(model, sentences)["sentence_embedding"].numpy()
    assert results["batch"].dtype == np.float32 and np.isfinite(results["batch"]).all()
    np.testing.assert_allclose(np.linalg.norm(results["batch"], axis=1), 1.0, atol=1e-5)
    assert (results["batch"] * expected).sum(axis=1).min() >= 0.995
    assert np.abs(results["batch"] - expected).max() > 1e-6  # not float32 after all
    np.testing.assert_allclose(results["signature"], results["batch"], atol=1e-6)
    assert_dropout_only_in_training(results, results["batch"])
    assert_weights_equal(results, encoder.trainable_variables)
    graph = str(tf.saved_model.load(path).signatures["serving_default"].graph.as_graph_def())
    assert "DT_BFLOAT16" in graph
    info = read_export_info(path)
    assert info["precision"] == "bfloat16" and not info["jit_compile"]
    assert info["encoder_config"] == config_to_dict(encoder.encoder_config)
    assert read_export_info(formats.export_lealla_model(
        encoder, tokenizer, str(tmp_path / "f32")))["precision"] == "float32"
    with pytest.raises(ValueError, match="--jit_compile exports compute in float32"):
        formats.export_lealla_model(encoder, tokenizer, str(tmp_path / "x"), jit_compile=True,
                                    precision="bfloat16")
    assert not (tmp_path / "x").exists()


def test_lealla_format_trains_inside_fit_in_both_keras(model, sentences, exported, tmp_path):
    """hub.KerasLayer in a tf.keras.Sequential (with TF_USE_LEGACY_KERAS=1, the one
    line the export prints), and LeallaSavedModelLayer in a Keras 3 model: fit
    changes the encoder's weights, and the layers embed as the model does."""
    expected = expected_outputs(model, sentences[:8])["sentence_embedding"].numpy()
    for loader in ("hub_keras_layer", "keras3_layer"):
        results = probe(loader, "lealla", exported["lealla"], sentences[:8], tmp_path)
        np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)
        assert int(results["fit_changed"]) >= len(model[0].trainable_variables) // 2, loader


def test_lealla_format_with_keras3_tfsm_layer(model, sentences, exported, tmp_path):
    results = probe("tfsm_layer", "lealla", exported["lealla"], sentences, tmp_path)
    expected = expected_outputs(model, sentences)["sentence_embedding"].numpy()
    np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)
    assert len([k for k in results if k.startswith("weight_")]) == len(model[0].weights)


def test_labse_pair_with_tf_saved_model_load(model, sentences, exported, tmp_path):
    results = probe("saved_model_load", "labse", exported["labse"], sentences, tmp_path)
    expected = expected_outputs(model, sentences)["pooled_output"].numpy()
    # `default` is the pooled output, not normalised; fixed-length padding changes nothing.
    np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)
    assert np.abs(np.linalg.norm(results["batch"], axis=1) - 1.0).max() > 1e-3
    np.testing.assert_allclose(results["via_tokenize"], expected, atol=TOLERANCE)
    np.testing.assert_allclose(results["single"], results["batch"], atol=TOLERANCE)
    assert not bool(results["do_lower_case"])
    assert int(results["encoder_outputs_count"]) == 2
    assert_dropout_only_in_training(results, results["batch"])
    assert_weights_equal(results, model[0].trainable_variables)


def test_labse_pair_with_hub_keras_layer(model, sentences, exported, tmp_path):
    results = probe("hub_keras_layer", "labse", exported["labse"], sentences, tmp_path)
    expected = expected_outputs(model, sentences)["pooled_output"].numpy()
    np.testing.assert_allclose(results["batch"], expected, atol=TOLERANCE)
    np.testing.assert_allclose(results["training_false"], expected, atol=TOLERANCE)
    assert_dropout_only_in_training(results, expected)


def test_encoder_from_module_rebuilds_the_network_whatever_its_name(model, exported):
    """The `encoder/` module of an encoder named otherwise (here Keras' default
    name, not the teacher converters' `teacher_encoder`) loads into a network of
    the same config with the same weights; a config it does not hold is refused."""
    encoder, _ = model
    network = formats.encoder_from_module(exported["labse_paths"]["encoder"],
                                             encoder.encoder_config)
    assert network.name == "teacher_encoder" and encoder.name != network.name
    for ours, theirs in zip(network.weights, encoder.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    with pytest.raises(ValueError, match="is of shape"):
        formats.encoder_from_module(exported["labse_paths"]["encoder"],
                                       encoder.encoder_config.replace(hidden_dim=8))


def test_labse_preprocessor_contract(model, exported):
    preprocessor = tf.saved_model.load(exported["labse_paths"]["preprocessor"])
    inputs = preprocessor(tf.constant(["The dog is nice.", ""]))
    assert set(inputs) == {"input_word_ids", "input_mask", "input_type_ids"}
    # Fixed length = the model's max_seq_length (32 here, LaBSE's 128 by default).
    assert all(v.shape == (2, 32) and v.dtype == tf.int32 for v in inputs.values())
    tokens = preprocessor.tokenize(tf.constant(["The dog is nice."]))
    assert isinstance(tokens, tf.RaggedTensor) and tokens.shape.rank == 3
    pair = preprocessor.bert_pack_inputs([tokens, tokens], seq_length=tf.constant(20))
    assert pair["input_word_ids"].shape == (1, 20)
    assert pair["input_type_ids"].numpy().max() == 1
    encoder = tf.saved_model.load(exported["labse_paths"]["encoder"])
    assert encoder.vocab_file.asset_path.numpy().decode().endswith("vocab.txt")


@pytest.mark.parametrize("name", ["lealla", "encoder_only"])
def test_no_lambda_layers_and_one_copy_of_the_weights(model, exported, name):
    path = pathlib.Path(exported[name])
    assert b"Lambda" not in (path / "saved_model.pb").read_bytes()
    weight_bytes = sum(int(np.prod(w.shape)) * 4 for w in model[0].weights)
    size = formats.saved_model_size(str(path))
    assert weight_bytes < size < 2 * weight_bytes + 5_000_000


def test_the_lealla_export_stores_each_network_graph_once(exported):
    """`__call__` at inference and both serving signatures call `embed_inputs`' graph
    instead of tracing the network again: one inference graph and one training
    graph, so a load (a Beam worker's start among them) rebuilds each once."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((pathlib.Path(exported["lealla"]) / "saved_model.pb").read_bytes())
    library = saved.meta_graphs[0].graph_def.library.function
    networks = [f.signature.name for f in library
                if any(node.op in ("MatMul", "BatchMatMulV2") for node in f.node_def)]
    assert len(networks) == 2, networks  # embed_inputs, and __call__ with training=True


def test_vocabulary_travels_as_an_asset(exported):
    for path in (exported["lealla"], exported["labse_paths"]["preprocessor"],
                 exported["labse_paths"]["encoder"]):
        assert os.listdir(os.path.join(path, "assets")) == ["vocab.txt"]


def test_encoder_only_converts_to_tflite(model, sentences, exported):
    encoder, tokenizer = model
    converter = tf.lite.TFLiteConverter.from_saved_model(exported["encoder_only"])
    interpreter = tf.lite.Interpreter(model_content=converter.convert())
    runner = interpreter.get_signature_runner("serving_default")
    for batch in (sentences[:20], sentences[:1]):  # one row: no empty part anywhere
        inputs = tokenizer(tf.constant(batch))
        got = runner(**{k: v.numpy() for k, v in inputs.items()})["default"]
        want = encoder(inputs)["sentence_embedding"].numpy()
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
    ops = str(tf.saved_model.load(exported["encoder_only"]).signatures["serving_default"]
              .graph.as_graph_def())
    assert "FastBert" not in ops and "Sentencepiece" not in ops


def test_encoder_only_applies_dropout_only_in_training(model, sentences, exported):
    encoder, tokenizer = model
    inputs = tokenizer(tf.constant(sentences[:8]))
    loaded = tf.saved_model.load(exported["encoder_only"])
    ids = [inputs[name] for name in formats.INPUT_NAMES]
    reference = loaded(*ids, training=False).numpy()
    np.testing.assert_allclose(reference, encoder(inputs)["sentence_embedding"].numpy(),
                               atol=TOLERANCE)
    results = {"training_a": loaded(*ids, training=True).numpy(),
               "training_b": loaded(*ids, training=True).numpy()}
    assert_dropout_only_in_training(results, reference)


def test_int8_tflite_export_embeds_text_close_to_float(model, sentences, tmp_path):
    encoder, tokenizer = model
    path = formats.export_int8_tflite(encoder, tokenizer, str(tmp_path / "int8"))
    assert model_kind(path) == "tflite"
    embedder = load_embedder(path)
    # Any batch size and length: the interpreter is resized to each batch.
    got = embedder.encode(sentences, batch_size=5)
    want = expected_outputs(model, sentences)["sentence_embedding"].numpy()
    assert got.shape == want.shape and np.isfinite(got).all()
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cosine = np.sum(got * want, axis=1)
    assert cosine.min() > 0.98, cosine.min()
    # Weights stored as int8: well under the float32 weights' bytes.
    float_bytes = 4 * encoder.count_params()
    assert os.path.getsize(os.path.join(path, formats.TFLITE_FILE)) < 0.5 * float_bytes
    assert embedder.last_stats["tokens"] > 0
    with pytest.raises(ValueError, match="truncates"):
        load_embedder(path, max_seq_length=8)
    os.remove(os.path.join(path, formats.TFLITE_FILE))
    with pytest.raises(FileNotFoundError, match="model.tflite"):
        model_kind(path)


def test_int8_tflite_runs_the_fast_forward_pass(model, tmp_path):
    """The TFLite model is converted from the fast forward pass: per layer, the
    three attention projections as one matmul (four in all, not six), and no
    shape arithmetic of the Keras layers' reshapes, which split the graph into
    pieces the interpreter's XNNPACK delegate runs apart."""
    encoder, tokenizer = model
    path = formats.export_int8_tflite(encoder, tokenizer, str(tmp_path / "int8"))
    with open(os.path.join(path, formats.TFLITE_FILE), "rb") as f:
        content = f.read()
    interpreter = tf.lite.Interpreter(model_content=content)
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    outside = [encoder.embedding_projection, encoder.pooled_dense, encoder.output_dense]
    dense = 4 * encoder.encoder_config.num_layers + sum(d is not None for d in outside)
    assert ops.count("FULLY_CONNECTED") == dense, ops
    assert "UNSORTED_SEGMENT_PROD" not in ops and "REDUCE_PROD" not in ops, ops


def test_an_export_carries_no_path_of_the_machine_that_built_it(tmp_path, monkeypatch):
    """A SentencePiece vocabulary with a compiled normalizer (as every converted
    teacher's and student's is) put the build's `/tmp/tmpXXXX.tsv` rule-file path
    into assets/vocab.model and saved_model.pb. No file of an export (LEALLA format,
    LaBSE/2 pair) holds a path of the machine that built it."""
    import re
    import tempfile

    from lealla_tf.tokenizers import sentencepiece_model as spm_model

    build_temp = tmp_path / "build-temp"
    build_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(build_temp))
    spec = spm_model.normalizer_spec_from_map({0xFF21: [0x41], 0x1: []}, "nmt_nfkc")
    pieces = [spm_model.Piece("<s>", 0, spm_model.CONTROL),
              spm_model.Piece("<pad>", 0, spm_model.CONTROL),
              spm_model.Piece("</s>", 0, spm_model.CONTROL),
              spm_model.Piece("<unk>", 0, spm_model.UNKNOWN),
              spm_model.Piece("\u2581A", -1.0), spm_model.Piece("\u2581b", -2.0)]
    vocab = tmp_path / "vocab" / "vocab.model"
    vocab.parent.mkdir()
    vocab.write_bytes(spm_model.SentencePieceModel(pieces, spec).serialize())
    monkeypatch.setattr(tempfile, "tempdir", None)
    tokenizer = Tokenizer(str(vocab), max_seq_length=16)
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=8, intermediate_dim=8))
    exports = tmp_path / "exports"
    formats.export_lealla_model(encoder, tokenizer, str(exports / "lealla"))
    formats.export_labse_pair(encoder, tokenizer, str(exports / "labse"))
    files = [path for path in exports.rglob("*") if path.is_file()]
    assert any(path.name == "vocab.model" for path in files)
    leaks = []
    for path in files:
        data = path.read_bytes()
        leaks += [(str(path.relative_to(exports)), found.decode("utf-8", "replace"))
                  for found in re.findall(rb"/tmp/[\w.-]+|[\w./-]*\.tsv", data)]
        leaks += [(str(path.relative_to(exports)), where) for where in (
            str(tmp_path), tempfile.gettempdir()) if where.encode() in data]
    assert not leaks, leaks


def test_export_model_dir_reads_everything_from_the_model_dir(model, sentence_vocab_file,
                                                              tmp_path):
    """Architecture, vocabulary and length come from the model directory; the summary
    names every path with its size; a bad format or an --export_path that is a file
    is refused before anything is written."""
    encoder, tokenizer = model
    model_dir = str(tmp_path / "model")
    write_model_config(model_dir, encoder.encoder_config, TokenizerConfig(max_seq_length=32),
                       source_vocab_file=sentence_vocab_file)
    save_encoder_checkpoint(model_dir, encoder)
    summaries = {name: formats.export_model_dir(model_dir, str(tmp_path / name), name)
                 for name in formats.FORMATS}
    assert sorted(summaries["labse"]["paths"]) == ["encoder", "preprocessor"]
    for name, summary in summaries.items():
        assert summary["format"] == name and summary["embedding_dim"] == 16
        assert summary["parameters"] == encoder.count_params()
        assert all(summary["bytes"][part] > 0 for part in summary["paths"])
    assert summaries["lealla"]["max_seq_length"] == 32
    assert "mean_cosine" not in summaries["encoder_only"]  # no tokenizer: nothing to check
    loaded = tf.saved_model.load(summaries["lealla"]["paths"]["model"])
    batch = tf.constant(["The dog is nice.", "Der Hund ist nett."])
    np.testing.assert_allclose(loaded(batch), encoder(tokenizer(batch))["sentence_embedding"],
                               atol=TOLERANCE)
    with pytest.raises(ValueError, match="format must be one of"):
        formats.export_model_dir(model_dir, str(tmp_path / "x"), "onnx")
    with pytest.raises(ValueError, match="--precision=bfloat16 applies to --format=lealla"):
        formats.export_model_dir(model_dir, str(tmp_path / "x"), "labse", precision="bfloat16")
    assert not (tmp_path / "x").exists()
    assert summaries["lealla"]["precision"] == "float32"
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="--export_path=.* is a file"):
        formats.export_model_dir(model_dir, str(a_file))
    assert a_file.read_text() == "x"

