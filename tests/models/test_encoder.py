"""The encoder: outputs, normalisation, dropout, pooling, bottleneck, recurrence, saving."""

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


@pytest.mark.parametrize("changes", [
    {},
    {"pooling": "mean", "hidden_activation": "gelu"},
    {"embedding_dim": 4, "num_unique_layers": 1, "hidden_activation": "relu"},
    {"pooler_dim": 6, "output_dim": 5, "num_layers": 3, "num_heads": 4},
])
def test_forward_equals_the_keras_call(changes):
    encoder = build_encoder(TINY.replace(dropout=0.3, **changes))
    batch = inputs(np.random.default_rng(0).integers(5, 30, (3, 6)), [6, 2, 4])
    batch["input_type_ids"][1, :2] = 1  # segments pass through too
    ours = encoder.forward({k: tf.constant(v) for k, v in batch.items()})
    keras_call = encoder(batch, training=False)
    for name in ("sentence_embedding", "pooled_output", "sequence_output"):
        np.testing.assert_allclose(ours[name], keras_call[name], atol=1e-5, err_msg=name)
    assert len(ours["encoder_outputs"]) == len(keras_call["encoder_outputs"])
    for a, b in zip(ours["encoder_outputs"], keras_call["encoder_outputs"]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # the traced function (the exports' path) gives the same
    traced = tf.function(lambda b: encoder.forward(b)["sentence_embedding"])
    np.testing.assert_allclose(traced({k: tf.constant(v) for k, v in batch.items()}),
                               keras_call["sentence_embedding"], atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_forward_in_parts_equals_one_call_for_any_batch_size(rows):
    """Inference embeds a batch as INFERENCE_PARTS independent parts; one row
    leaves a part empty."""
    from lealla_tf.models import encoder as lealla_encoder

    encoder = build_encoder(TINY.replace(pooling="mean"))
    batch = inputs(np.random.default_rng(1).integers(5, 30, (rows, 6)), [6, 2, 4, 5, 1][:rows])
    batch = {k: tf.constant(v) for k, v in batch.items()}
    assert lealla_encoder.INFERENCE_PARTS == 2
    ours = encoder.forward(batch)
    np.testing.assert_allclose(ours["sentence_embedding"],
                               encoder(batch, training=False)["sentence_embedding"], atol=1e-5)
    assert ours["sequence_output"].shape[0] == rows
    assert len(ours["encoder_outputs"]) == TINY.num_layers
    # any number of parts, more parts than rows included, gives the same rows
    np.testing.assert_allclose(encoder.forward(batch, parts=3)["sentence_embedding"],
                               ours["sentence_embedding"], atol=1e-5)
    with pytest.raises(ValueError, match="parts must be at least 1"):
        encoder.forward(batch, parts=0)


def test_forward_in_bfloat16_matches_the_keras_call():
    encoder = build_encoder(TINY.replace(num_layers=3), dtype="mixed_bfloat16")
    batch = {k: tf.constant(v) for k, v in BATCH.items()}
    ours = encoder.forward(batch)["sentence_embedding"]
    assert ours.dtype == tf.float32
    # bfloat16 keeps 8 bits of mantissa: both paths round, in different places.
    np.testing.assert_allclose(ours, encoder(batch, training=False)["sentence_embedding"],
                               atol=3e-2)
    assert encoder.forward(batch)["sequence_output"].dtype == tf.bfloat16


@pytest.mark.parametrize("dtype", [None, "mixed_bfloat16"])
def test_forward_in_training_has_the_keras_calls_gradients_without_dropout(dtype):
    encoder = build_encoder(TINY.replace(dropout=0.0, pooling="mean", num_layers=3),
                            dtype=dtype)
    batch = {k: tf.constant(v) for k, v in BATCH.items()}
    weights = tf.range(8, dtype=tf.float32)

    def gradients(call):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(call(batch, training=True)["sentence_embedding"] * weights)
        return [tf.convert_to_tensor(g).numpy()
                for g in tape.gradient(loss, encoder.trainable_weights)]

    tolerance = 1e-5 if dtype is None else 5e-2
    for ours, theirs, weight in zip(gradients(encoder.forward), gradients(encoder),
                                    encoder.trainable_weights):
        scale = max(float(np.abs(theirs).max()), 1.0)
        np.testing.assert_allclose(ours / scale, theirs / scale, atol=tolerance,
                                   err_msg=weight.path)


def test_forward_in_training_drops_out_and_reaches_every_weight():
    batch = {k: tf.constant(v) for k, v in BATCH.items()}
    still = build_encoder(TINY.replace(dropout=0.0))
    np.testing.assert_allclose(still.forward(batch, training=True)["sentence_embedding"],
                               still(batch, training=True)["sentence_embedding"], atol=1e-5)
    encoder = build_encoder(TINY.replace(dropout=0.3))
    with tf.GradientTape() as tape:
        a = encoder.forward(batch, training=True)["sentence_embedding"]
        loss = tf.reduce_sum(a[0] * a[1])
    b = encoder.forward(batch, training=True)["sentence_embedding"]
    assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3  # dropout masks differ
    # the masks come from the dropout layers' seed generators: the same state, the same masks
    states = [v for v in encoder.variables if "seed_generator" in v.path]
    saved = [v.numpy() for v in states]
    c = encoder.forward(batch, training=True)["sentence_embedding"]
    for variable, value in zip(states, saved):
        variable.assign(value)
    np.testing.assert_array_equal(encoder.forward(batch, training=True)["sentence_embedding"], c)
    gradients = tape.gradient(loss, encoder.trainable_weights)
    for weight, gradient in zip(encoder.trainable_weights, gradients):
        assert gradient is not None, weight.path
        assert float(tf.reduce_max(tf.abs(tf.convert_to_tensor(gradient)))) > 0, weight.path


@pytest.mark.parametrize("changes", [
    {"hidden_activation": "gelu_approximate"},
    {"hidden_activation": "gelu", "pooling": "mean", "num_unique_layers": 1},
    {"hidden_activation": "relu"},  # not fused: the op-by-op layer runs
])
def test_fused_kernels_train_as_the_op_by_op_layers(changes):
    """The same outputs, the same dropout masks from the same seeds, the same
    gradients, with lealla_tf.models.kernels' fused ops as without them."""
    from lealla_tf.models import kernels

    if not kernels.available():
        pytest.skip(f"fused kernels unavailable: {kernels.unavailable_reason()}")
    encoder = build_encoder(TINY.replace(dropout=0.2, num_layers=3, **changes))
    batch = {k: tf.constant(v) for k, v in BATCH.items()}
    seeds = [v for v in encoder.variables if "seed_generator" in v.path]
    start = [v.numpy() for v in seeds]
    weights = tf.range(8, dtype=tf.float32)

    def run(fused):
        for variable, value in zip(seeds, start):
            variable.assign(value)
        with tf.GradientTape() as tape:
            sides = encoder.forward_batches([batch, batch], training=True, fused_kernels=fused)
            loss = sum(tf.reduce_sum(side["sentence_embedding"] * weights) for side in sides)
        gradients = tape.gradient(loss, encoder.trainable_weights)
        return sides, [tf.convert_to_tensor(g).numpy() for g in gradients]

    (fused, fused_gradients), (ops, ops_gradients) = run(True), run(False)
    for a, b in zip(fused, ops):
        np.testing.assert_allclose(a["sentence_embedding"], b["sentence_embedding"], atol=1e-5)
        for x, y in zip(a["encoder_outputs"], b["encoder_outputs"]):
            np.testing.assert_allclose(x, y, atol=1e-5)
    # the two sides drew different masks
    assert np.abs(fused[0]["sequence_output"] - fused[1]["sequence_output"]).max() > 1e-3
    for weight, a, b in zip(encoder.trainable_weights, fused_gradients, ops_gradients):
        scale = max(float(np.abs(b).max()), 1.0)
        np.testing.assert_allclose(a / scale, b / scale, atol=2e-5, err_msg=weight.path)
    # and the fused run did run the fused ops (the relu layer runs none)
    graph = tf.function(lambda b: encoder.forward_batches(
        [b], training=True, fused_kernels=True)[0]["sentence_embedding"]).get_concrete_function(
            batch).graph
    ran = {op.type for op in graph.get_operations()}
    fused_ops = {"LeallaAttention", "LeallaBiasGelu", "LeallaBiasDropoutAddNorm"}
    if changes["hidden_activation"] == "relu":
        assert not ran & fused_ops
    else:
        assert fused_ops <= ran, sorted(ran)


def test_mixed_precision_looks_up_rows_without_casting_the_table():
    """Under mixed_bfloat16 the Keras Embedding call casts its whole table to
    bfloat16 before the lookup (LaBSE's: 64M values a call); forward casts the rows."""
    encoder = build_encoder(TINY, dtype="mixed_bfloat16")
    batch = {k: tf.constant(v) for k, v in BATCH.items()}
    graph = tf.function(lambda b: encoder.forward(b)["sentence_embedding"]).get_concrete_function(
        batch).graph
    table_shape = tuple(encoder.token_embedding.embeddings.shape)
    casts = [op for op in graph.get_operations() if op.type == "Cast"
             and tuple(op.outputs[0].shape) == table_shape]
    assert not casts


def test_a_float32_encoder_computes_in_float32_under_a_mixed_global_policy():
    """A main job trained in bfloat16 sets the global policy, then exports and
    evaluates an encoder built with dtype="float32": no op of it may round to
    bfloat16 (Keras autocast the L2 normalisation's input: 6e-4 on unit rows)."""
    import keras

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


def test_the_keras_hub_internals_the_forward_pass_reads_are_all_there():
    """The hand-written forward pass reads keras-hub's TransformerEncoder
    internals (it has no public accessors); a keras-hub that renames one fails
    here, in words, rather than somewhere inside a training step."""
    import types

    from lealla_tf.models.encoder import KERAS_HUB_PARTS, transformer_parts

    config = EncoderConfig(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16,
                           intermediate_dim=32)
    encoder = build_encoder(config)
    for layer in encoder.transformer_layers:
        parts = transformer_parts(layer)
        assert (parts.heads, parts.head_size) == (2, 8)
        for name in ("query_dense", "key_dense", "value_dense", "attention_output_dense",
                     "intermediate_dense", "output_dense"):
            assert len(getattr(parts, name).kernel.shape) >= 2, name
        assert 0 <= parts.attention_dropout.rate < 1 and parts.attention_norm.epsilon > 0
    renamed = types.SimpleNamespace(_self_attention_layer=types.SimpleNamespace())
    with pytest.raises(RuntimeError, match=r"keras-hub .* without `_self_attention_layer\._num"
                                           r"_heads`.*KERAS_HUB_PARTS"):
        transformer_parts(renamed)
    assert len(KERAS_HUB_PARTS) == len(transformer_parts(encoder.transformer_layers[0]))
