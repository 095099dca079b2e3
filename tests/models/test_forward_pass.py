"""The fast forward pass (lealla_tf.models.forward_pass) against the Keras call it
replaces: outputs, parts, bfloat16, gradients, dropout masks, the fused kernels."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.configs import EncoderConfig
from lealla_tf.models import forward_pass, kernels
from lealla_tf.models.encoder import build_encoder

TINY = EncoderConfig(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
                     intermediate_dim=16, max_sequence_length=32)


def batch_of(ids, lengths, segments=None):
    """A tokenizer's inputs as tensors: `ids` cut to `lengths`, padding masked."""
    ids = np.asarray(ids, "int32")
    mask = (np.arange(ids.shape[1])[None, :] < np.asarray(lengths)[:, None]).astype("int32")
    segments = np.zeros_like(ids) if segments is None else np.asarray(segments, "int32")
    return {"input_word_ids": tf.constant(ids * mask), "input_mask": tf.constant(mask),
            "input_type_ids": tf.constant(segments)}


BATCH = batch_of([[3, 7, 9, 4, 0], [3, 11, 4, 0, 0]], [4, 3])


@pytest.mark.parametrize("changes", [
    {},
    {"pooling": "mean", "hidden_activation": "gelu"},
    {"embedding_dim": 4, "num_unique_layers": 1, "hidden_activation": "relu"},
    {"pooler_dim": 6, "output_dim": 5, "num_layers": 3, "num_heads": 4},
])
def test_forward_equals_the_keras_call(changes):
    encoder = build_encoder(TINY.replace(dropout=0.3, **changes))
    # segments pass through too
    batch = batch_of(np.random.default_rng(0).integers(5, 30, (3, 6)), [6, 2, 4],
                     segments=[[0] * 6, [1, 1, 0, 0, 0, 0], [0] * 6])
    ours = encoder.forward(batch)
    keras_call = encoder(batch, training=False)
    for name in ("sentence_embedding", "pooled_output", "sequence_output"):
        np.testing.assert_allclose(ours[name], keras_call[name], atol=1e-5, err_msg=name)
    assert len(ours["encoder_outputs"]) == len(keras_call["encoder_outputs"])
    for a, b in zip(ours["encoder_outputs"], keras_call["encoder_outputs"]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # the traced function (the exports' path) gives the same
    traced = tf.function(lambda b: encoder.forward(b)["sentence_embedding"])
    np.testing.assert_allclose(traced(batch), keras_call["sentence_embedding"], atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_forward_in_parts_equals_one_call_for_any_batch_size(rows):
    """Inference embeds a batch as INFERENCE_PARTS independent parts; one row
    leaves a part empty."""
    encoder = build_encoder(TINY.replace(pooling="mean"))
    batch = batch_of(np.random.default_rng(1).integers(5, 30, (rows, 6)), [6, 2, 4, 5, 1][:rows])
    assert forward_pass.INFERENCE_PARTS == 2
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
    batch = BATCH
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
    batch = BATCH
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
    batch = BATCH
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
    {"hidden_activation": "gelu_approximate", "dropout": 0.0},  # the main job trains at 0
])
def test_fused_kernels_train_as_the_op_by_op_layers(changes):
    """The same outputs, the same dropout masks from the same seeds, the same
    gradients, with lealla_tf.models.kernels' fused ops as without them."""
    if not kernels.available():
        pytest.skip(f"fused kernels unavailable: {kernels.unavailable_reason()}")
    encoder = build_encoder(TINY.replace(**{"dropout": 0.2, "num_layers": 3, **changes}))
    batch = BATCH
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
    # the two sides drew different masks (none without dropout)
    difference = np.abs(fused[0]["sequence_output"] - fused[1]["sequence_output"]).max()
    assert difference > 1e-3 if encoder.encoder_config.dropout else difference == 0
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
    batch = BATCH
    graph = tf.function(lambda b: encoder.forward(b)["sentence_embedding"]).get_concrete_function(
        batch).graph
    table_shape = tuple(encoder.token_embedding.embeddings.shape)
    casts = [op for op in graph.get_operations() if op.type == "Cast"
             and tuple(op.outputs[0].shape) == table_shape]
    assert not casts


def test_forward_makes_the_keras_call_where_it_cannot_compute_the_encoder():
    """A float16 compute dtype is not one the forward pass computes: the Keras call."""
    encoder = build_encoder(TINY, dtype="mixed_float16")
    assert not forward_pass.supported(encoder)
    assert forward_pass.supported(build_encoder(TINY, dtype="mixed_bfloat16"))
    np.testing.assert_array_equal(encoder.forward(BATCH)["sentence_embedding"],
                                  encoder(BATCH)["sentence_embedding"])
    sides = encoder.forward_batches([BATCH, BATCH])
    np.testing.assert_array_equal(sides[1]["sequence_output"], encoder(BATCH)["sequence_output"])


def test_layer_weights_pack_the_projections_and_scale_the_query():
    encoder = build_encoder(TINY)
    layer = encoder.transformer_layers[0]
    packed = forward_pass.layer_weights(layer, tf.float32)
    parts = packed.parts
    assert (packed.heads, packed.head_size) == (2, 4)
    projections = [np.reshape(p.kernel.numpy(), (8, 8))
                for p in (parts.query_dense, parts.key_dense, parts.value_dense)]
    np.testing.assert_allclose(packed.qkv_kernel, np.concatenate(
        [projections[0] / np.sqrt(4), projections[1], projections[2]], axis=1), atol=1e-7)
    assert packed.qkv_bias.shape == (24,) and packed.qkv_bias.dtype == tf.float32
    half = forward_pass.layer_weights(layer, tf.bfloat16)
    assert half.intermediate_kernel.dtype == tf.bfloat16 and half.output_bias.dtype == tf.float32


def test_layer_norm_is_the_keras_layers_in_both_dtypes():
    rows = tf.constant(np.random.default_rng(2).normal(3.0, 2.0, size=(6, 8)), tf.float32)
    norm = keras.layers.LayerNormalization(epsilon=1e-6)
    norm.build((None, 8))
    norm.gamma.assign(np.linspace(0.5, 2.0, 8))
    norm.beta.assign(np.linspace(-1.0, 1.0, 8))
    assert forward_pass.plain_norm(norm)
    np.testing.assert_allclose(forward_pass.layer_norm(norm, rows), norm(rows), atol=1e-5)
    half = forward_pass.layer_norm(norm, tf.cast(rows, tf.bfloat16))
    assert half.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(half, tf.float32), norm(rows), atol=3e-2)
    # a norm it does not compute itself (no offset) is the layer's own call
    uncentered = keras.layers.LayerNormalization(center=False)
    uncentered.build((None, 8))
    assert not forward_pass.plain_norm(uncentered)
    np.testing.assert_allclose(forward_pass.layer_norm(uncentered, rows), uncentered(rows),
                               atol=1e-6)


def test_activate_computes_bfloat16_in_float32_and_rounds_once():
    x = tf.constant(np.linspace(-4.0, 4.0, 64).reshape(8, 8), tf.float32)
    gelu = keras.activations.gelu
    np.testing.assert_array_equal(forward_pass.activate(gelu, x), gelu(x))
    half = forward_pass.activate(gelu, tf.cast(x, tf.bfloat16))
    assert half.dtype == tf.bfloat16
    np.testing.assert_array_equal(half, tf.cast(gelu(tf.cast(tf.cast(x, tf.bfloat16),
                                                             tf.float32)), tf.bfloat16))


def test_only_gelu_layers_with_plain_norms_and_dropout_are_fusable():
    parts = forward_pass.layer_weights(build_encoder(TINY).transformer_layers[0],
                                       tf.float32).parts
    assert forward_pass.fusable(parts, "gelu_approximate") and forward_pass.fusable(parts, "gelu")
    assert not forward_pass.fusable(parts, "relu")
    shaped = parts._replace(feedforward_dropout=keras.layers.Dropout(0.1, noise_shape=(1, 8)))
    assert not forward_pass.fusable(shaped, "gelu")


@pytest.mark.parametrize("fused", [False, True])
def test_skipped_layers_hand_their_input_on(fused):
    """Skipping layer 1 of three that share their weights (parameter recurrence)
    computes what two such layers compute; the skipped layer's output repeats
    the one before it, so the layers keep their indices."""
    if fused and not kernels.usable():
        pytest.skip("the fused kernels are not built here")
    three = build_encoder(TINY.replace(num_layers=3, num_unique_layers=1, pooling="mean"))
    two = build_encoder(TINY.replace(num_layers=2, num_unique_layers=1, pooling="mean"))
    two.set_weights(three.get_weights())
    skipped = three.forward_batches([BATCH], fused_kernels=fused, skipped_layers={1})[0]
    expected = two.forward_batches([BATCH], fused_kernels=fused)[0]
    np.testing.assert_allclose(skipped["sequence_output"], expected["sequence_output"],
                               atol=1e-6)
    outputs = skipped["encoder_outputs"]
    assert len(outputs) == 3
    np.testing.assert_array_equal(outputs[1], outputs[0])
    whole = three.forward_batches([BATCH], fused_kernels=fused)[0]["sequence_output"]
    assert np.abs(np.asarray(whole) - np.asarray(skipped["sequence_output"])).max() > 1e-3


def test_skipping_layers_without_the_fast_forward_pass_is_refused():
    encoder = build_encoder(TINY, dtype="mixed_float16")
    assert not forward_pass.supported(encoder)
    with pytest.raises(ValueError, match="skipping layers needs the fast forward pass"):
        encoder.forward(BATCH, skipped_layers={0})
