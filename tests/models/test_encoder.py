"""The encoder as a Keras model: outputs, normalisation, dropout, pooling, bottleneck,
recurrence, saving, dtype policies. Its fast forward pass: test_forward_pass.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.configs import EncoderConfig
from lealla_tf.models.encoder import LeallaEncoder, build_encoder

TINY = EncoderConfig(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
                     intermediate_dim=16, max_sequence_length=32)


def inputs(ids, lengths):
    ids = np.array(ids, "int32")
    mask = (np.arange(ids.shape[1])[None, :] < np.array(lengths)[:, None]).astype("int32")
    return {"input_word_ids": ids * mask, "input_mask": mask,
            "input_type_ids": np.zeros_like(ids)}


BATCH = inputs([[3, 7, 9, 4, 0], [3, 11, 4, 0, 0]], [4, 3])


def test_outputs_shapes_and_unit_norm():
    encoder = build_encoder(TINY)
    out = encoder(BATCH)
    assert out["sentence_embedding"].shape == (2, 8)
    assert out["pooled_output"].shape == (2, 8)
    assert out["sequence_output"].shape == (2, 5, 8)
    assert len(out["encoder_outputs"]) == 2
    np.testing.assert_allclose(np.linalg.norm(out["sentence_embedding"], axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(
        out["sentence_embedding"],
        out["pooled_output"] / np.linalg.norm(out["pooled_output"], axis=1, keepdims=True),
        atol=1e-6)
    np.testing.assert_array_equal(out["encoder_outputs"][-1], out["sequence_output"])


def test_dropout_only_when_training():
    encoder = build_encoder(TINY.replace(dropout=0.5))
    a = encoder(BATCH, training=False)["sentence_embedding"]
    b = encoder(BATCH, training=False)["sentence_embedding"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, encoder(BATCH)["sentence_embedding"])
    c = encoder(BATCH, training=True)["sentence_embedding"]
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_padding_does_not_change_embeddings():
    encoder = build_encoder(TINY)
    short = encoder(inputs([[3, 7, 9, 4]], [4]))["sentence_embedding"]
    padded = encoder(inputs([[3, 7, 9, 4, 0, 0, 0]], [4]))["sentence_embedding"]
    np.testing.assert_allclose(short, padded, atol=1e-6)


def test_mean_pooling_ignores_padding_and_matches_numpy():
    encoder = build_encoder(TINY.replace(pooling="mean"))
    out = encoder(BATCH)
    sequence = np.asarray(out["sequence_output"])
    mask = BATCH["input_mask"][..., None]
    expected = (sequence * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(out["pooled_output"], expected, atol=1e-6)
    assert not any("pooled_dense" in w.path for w in encoder.weights)


def test_pool_is_what_the_keras_call_pools():
    """`pool` (which the fast forward pass calls too) maps the last layer to the
    pooled output and the embedding before normalisation."""
    for changes in ({}, {"pooling": "mean", "output_dim": 5}):
        encoder = build_encoder(TINY.replace(**changes))
        out = encoder(BATCH)
        pooled, embedding = encoder.pool(out["sequence_output"], BATCH["input_mask"])
        np.testing.assert_allclose(pooled, out["pooled_output"], atol=1e-6)
        np.testing.assert_allclose(embedding / np.linalg.norm(embedding, axis=1, keepdims=True),
                                   out["sentence_embedding"], atol=1e-6)
        assert embedding.shape[1] == changes.get("output_dim", TINY.hidden_dim)


def test_embedding_bottleneck_shapes():
    encoder = build_encoder(TINY.replace(embedding_dim=4))
    shapes = {w.path: tuple(w.shape) for w in encoder.weights}
    assert shapes["token_embedding/embeddings"] == (30, 4)
    assert shapes["embedding_projection/kernel"] == (4, 8)
    assert encoder(BATCH)["sentence_embedding"].shape == (2, 8)


def test_parameter_recurrence_reuses_layers():
    shared = build_encoder(TINY.replace(num_layers=4, num_unique_layers=2))
    assert len(shared.transformer_layers) == 2
    out = shared(BATCH)
    assert len(out["encoder_outputs"]) == 4
    # Layer 2 is layer 0 again: applied to layer 1's output it gives output 2.
    again = shared.transformer_layers[0](out["encoder_outputs"][1],
                                         padding_mask=BATCH["input_mask"])
    np.testing.assert_allclose(again, out["encoder_outputs"][2], atol=1e-5)


def test_distillation_first_pooler_and_output_projection():
    encoder = build_encoder(TINY.replace(pooler_dim=12, output_dim=8))
    out = encoder(BATCH)
    assert out["pooled_output"].shape == (2, 12)
    assert out["sentence_embedding"].shape == (2, 8)
    assert encoder.encoder_config.embedding_size == 8
    projected = encoder.output_dense(out["pooled_output"]).numpy()
    np.testing.assert_allclose(
        out["sentence_embedding"], projected / np.linalg.norm(projected, axis=1, keepdims=True),
        atol=1e-6)
    with pytest.raises(ValueError, match="pooler_dim needs pooling='cls'"):
        TINY.replace(pooling="mean", pooler_dim=4)


def test_activation_choice_changes_outputs():
    exact = build_encoder(TINY.replace(hidden_activation="gelu"))
    approximate = build_encoder(TINY.replace(hidden_activation="gelu_approximate"))
    approximate.set_weights(exact.get_weights())
    a = np.asarray(exact(BATCH)["sequence_output"])
    b = np.asarray(approximate(BATCH)["sequence_output"])
    assert 0 < np.abs(a - b).max() < 1e-2


def test_invalid_configs_are_rejected():
    with pytest.raises(ValueError, match="divisible"):
        TINY.replace(num_heads=3)
    with pytest.raises(ValueError, match="num_unique_layers"):
        TINY.replace(num_unique_layers=3)
    with pytest.raises(ValueError, match="pooling"):
        TINY.replace(pooling="max")
    with pytest.raises(ValueError, match="hidden_activation"):
        LeallaEncoder(vocabulary_size=30, num_layers=1, num_heads=1, hidden_dim=4,
                      intermediate_dim=4, hidden_activation="swish")


def test_config_round_trip_and_keras_saving(tmp_path):
    encoder = build_encoder(TINY.replace(embedding_dim=4, num_unique_layers=1, pooling="mean"))
    assert encoder.encoder_config == TINY.replace(embedding_dim=4, num_unique_layers=1,
                                                  pooling="mean")
    clone = LeallaEncoder.from_config(encoder.get_config())
    clone.set_weights(encoder.get_weights())
    np.testing.assert_allclose(clone(BATCH)["sentence_embedding"],
                               encoder(BATCH)["sentence_embedding"], atol=1e-6)
    path = str(tmp_path / "encoder.keras")
    encoder.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, LeallaEncoder)
    np.testing.assert_allclose(loaded(BATCH)["sentence_embedding"],
                               encoder(BATCH)["sentence_embedding"], atol=1e-6)


def test_mixed_bfloat16_returns_float32_unit_embeddings():
    encoder = build_encoder(TINY, dtype="mixed_bfloat16")
    out = encoder(BATCH)
    assert out["sentence_embedding"].dtype == tf.float32
    np.testing.assert_allclose(np.linalg.norm(out["sentence_embedding"], axis=1), 1.0, atol=1e-5)


def test_a_float32_encoder_computes_in_float32_under_a_mixed_global_policy():
    """A main job trained in bfloat16 sets the global policy, then exports and
    evaluates an encoder built with dtype="float32": no op of it may round to
    bfloat16 (Keras autocast the L2 normalisation's input: 6e-4 on unit rows)."""
    batch = {k: tf.constant(v) for k, v in BATCH.items()}
    reference = build_encoder(TINY)
    want = reference.forward(batch)["sentence_embedding"].numpy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        encoder = build_encoder(TINY, dtype="float32")
        encoder.set_weights(reference.get_weights())
        graph = tf.function(lambda b: (encoder.forward(b)["sentence_embedding"],
                                       encoder(b)["sentence_embedding"])).get_concrete_function(
                                           batch).graph
        half = [op.name for op in graph.get_operations()
                if any(output.dtype == tf.bfloat16 for output in op.outputs)]
        assert not half, half
        for got in (encoder.forward(batch), encoder(batch)):
            np.testing.assert_allclose(got["sentence_embedding"].numpy(), want, atol=1e-6)
        # and a bfloat16 encoder normalises its float32 pooled rows without rounding them
        mixed = build_encoder(TINY, dtype="mixed_bfloat16")
        layer = mixed.l2_normalization
        rows = tf.constant(np.random.default_rng(0).normal(size=(4, 8)), tf.float32)
        np.testing.assert_allclose(layer(rows).numpy(),
                                   (rows / tf.norm(rows, axis=-1, keepdims=True)).numpy(),
                                   atol=1e-6)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
