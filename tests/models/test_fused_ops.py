"""The fused ops (lealla_tf.models.kernels.fused_ops) against the op-by-op TensorFlow
they replace: outputs and gradients, in float32 and bfloat16, with dropout; the
sparse AdamW update against decay and fused Adam on the densified gradient."""

import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.models import kernels
from lealla_tf.models.layers import hash_dropout
from lealla_tf.train.optimizers import FusedAdamW

if shutil.which(os.environ.get("CXX", "g++")) is None:  # pragma: no cover - CI has g++
    pytest.skip("no C++ compiler to build the fused kernels", allow_module_level=True)
if tf.config.list_physical_devices("GPU"):  # pragma: no cover - CI is a CPU
    pytest.skip("the fused kernels are CPU-only; TensorFlow sees a GPU here",
                allow_module_level=True)

SEED = tf.constant([123, -456], tf.int64)  # a negative word too: only its low 32 bits count


def reference_attention(qkv, bias, mask, heads, rate, seed):
    """What the forward pass computes op by op (float32)."""
    batch, length = mask.shape
    size = qkv.shape[1] // (3 * heads)
    x = tf.reshape(qkv + bias, [batch, length, 3, heads, size])
    query, key, value = tf.unstack(tf.transpose(x, [2, 0, 3, 1, 4]))
    key_bias = (1.0 - tf.cast(mask, tf.float32))[:, None, None, :] * -1e9
    probabilities = tf.nn.softmax(tf.matmul(query, key, transpose_b=True) + key_bias)
    if rate:
        probabilities = hash_dropout._drop(probabilities, seed, rate)
    context = tf.matmul(probabilities, value)
    return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch * length, heads * size])


def compare(fused, reference, inputs, atol=1e-5, gradient_atol=2e-5):
    """Outputs and input gradients (of a random projection) of two functions."""
    rng = np.random.default_rng(7)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        ours, theirs = fused(*inputs), reference(*inputs)
        weights = tf.constant(rng.normal(size=ours.shape), tf.float32)
        loss_ours, loss_theirs = tf.reduce_sum(ours * weights), tf.reduce_sum(theirs * weights)
    np.testing.assert_allclose(ours, theirs, atol=atol)
    for index, (a, b) in enumerate(zip(tape.gradient(loss_ours, inputs),
                                       tape.gradient(loss_theirs, inputs))):
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale,
                                   atol=gradient_atol, err_msg=f"gradient of input {index}")


@pytest.mark.parametrize("batch,length,heads,size", [
    (3, 7, 4, 16),   # lealla_small's head size, keys padded to 16
    (2, 17, 2, 8),   # layers24_hidden64's head size 8, 17 keys (two vectors)
    (2, 5, 3, 24),   # a head size that is no multiple of 16
    (1, 33, 1, 64),  # labse's head size
])
@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_attention_equals_the_op_by_op_layer(batch, length, heads, size, rate):
    rng = np.random.default_rng(batch * length)
    qkv = tf.constant(rng.normal(size=(batch * length, 3 * heads * size)), tf.float32)
    bias = tf.constant(rng.normal(size=(3 * heads * size,)), tf.float32)
    mask = np.ones((batch, length), np.int32)
    mask[-1, max(1, length // 2):] = 0  # padded keys in the last sequence
    mask = tf.constant(mask)
    compare(lambda q, b: kernels.attention(q, b, mask, SEED, heads, rate),
            lambda q, b: reference_attention(q, b, mask, heads, rate, SEED), [qkv, bias])


@pytest.mark.parametrize("rate", [0.0, 0.3])  # 0: the inference path, keys left out
def test_attention_with_padding_inside_or_after_the_keys_equals_the_layer(rate):
    """Without dropout the op scores only a suffix-padded sequence's unpadded
    keys, and keeps the mask's -1e9 where the padding has holes."""
    rng = np.random.default_rng(11)
    qkv = tf.constant(rng.normal(size=(4 * 21, 3 * 8 * 16)), tf.float32)
    bias = tf.constant(rng.normal(size=(3 * 8 * 16,)), tf.float32)
    mask = np.ones((4, 21), np.int32)
    mask[0, 17:] = 0          # a suffix: 17 keys scored
    mask[1, [2, 9, 20]] = 0   # holes: every key scored, three masked
    mask[2, 0] = 0            # padding first
    mask = tf.constant(mask)
    compare(lambda q, b: kernels.attention(q, b, mask, SEED, 8, rate),
            lambda q, b: reference_attention(q, b, mask, 8, rate, SEED), [qkv, bias])


def test_attention_with_every_key_padded_is_keras_uniform_softmax():
    """Keras adds -1e9 to padded keys; with all of them padded the softmax is over
    the raw scores again, not a division by zero."""
    rng = np.random.default_rng(3)
    qkv = tf.constant(rng.normal(size=(4, 3 * 2 * 16)), tf.float32)
    bias = tf.zeros([96])
    mask = tf.zeros([1, 4], tf.int32)
    ours = kernels.attention(qkv, bias, mask, None, 2)
    assert np.isfinite(ours.numpy()).all()
    np.testing.assert_allclose(ours, reference_attention(qkv, bias, mask, 2, 0.0, SEED),
                               atol=1e-5)


@pytest.mark.parametrize("size", [8, 16, 24])  # a tail alone, whole vectors, both
@pytest.mark.parametrize("rate", [0.0, 0.1])  # 0: inference, and the recipe's training
def test_attention_in_bfloat16_rounds_once(rate, size):
    rng = np.random.default_rng(4)
    qkv = tf.constant(rng.normal(size=(3 * 9, 3 * 4 * size)), tf.float32)
    bias = tf.constant(rng.normal(size=(3 * 4 * size,)), tf.float32)
    mask = np.ones((3, 9), np.int32)
    mask[1, 6:] = 0       # padded at the end
    mask[2, [1, 4]] = 0   # holes
    mask = tf.constant(mask)
    ours = kernels.attention(tf.cast(qkv, tf.bfloat16), bias, mask, SEED, 4, rate)
    assert ours.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(ours, tf.float32),
                               reference_attention(qkv, bias, mask, 4, rate, SEED), atol=5e-2)


@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_attention_gradient_in_bfloat16_is_the_float32_gradient_rounded(rate):
    """The bfloat16 training step's backward op: gradients in the input's type for
    qkv, float32 for the bias, within bfloat16's rounding of the float32 op's."""
    rng = np.random.default_rng(5)
    # float32 values that bfloat16 holds exactly: both ops see the same inputs
    qkv = tf.cast(tf.cast(rng.normal(size=(2 * 9, 3 * 4 * 16)), tf.bfloat16), tf.float32)
    bias = tf.constant(rng.normal(size=(192,)), tf.float32)
    mask = tf.constant([[1] * 9, [1] * 5 + [0] * 4], tf.int32)
    weights = tf.constant(rng.normal(size=(2 * 9, 64)), tf.float32)

    def gradients(values):
        with tf.GradientTape() as tape:
            tape.watch([values, bias])
            context = kernels.attention(values, bias, mask, SEED, 4, rate)
            loss = tf.reduce_sum(tf.cast(context, tf.float32) * weights)
        return tape.gradient(loss, [values, bias])

    (dqkv16, dbias16), (dqkv, dbias) = gradients(tf.cast(qkv, tf.bfloat16)), gradients(qkv)
    assert dqkv16.dtype == tf.bfloat16 and dbias16.dtype == tf.float32
    for ours, theirs in ((tf.cast(dqkv16, tf.float32), dqkv), (dbias16, dbias)):
        scale = float(np.abs(theirs).max())
        assert scale > 0.1
        np.testing.assert_allclose(np.asarray(ours) / scale, np.asarray(theirs) / scale,
                                   atol=2e-2)


@pytest.mark.parametrize("approximate", [True, False])
def test_bias_gelu_equals_tensorflow_gelu(approximate):
    rng = np.random.default_rng(5)
    x = tf.constant(3 * rng.normal(size=(37, 40)), tf.float32)
    bias = tf.constant(rng.normal(size=(40,)), tf.float32)
    compare(lambda x, b: kernels.bias_gelu(x, b, approximate),
            lambda x, b: tf.nn.gelu(x + b, approximate=approximate), [x, bias])
    half = kernels.bias_gelu(tf.cast(x, tf.bfloat16), bias, approximate)
    np.testing.assert_allclose(tf.cast(half, tf.float32),
                               tf.nn.gelu(x + bias, approximate=approximate), atol=4e-2, rtol=1e-2)


def reference_norm(x, bias, residual, gamma, beta, rate, epsilon):
    z = x + bias
    if rate:
        z = hash_dropout._drop(z, SEED, rate)
    z = z + residual
    mean = tf.reduce_mean(z, axis=-1, keepdims=True)
    centered = z - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return centered * (tf.math.rsqrt(variance + epsilon) * gamma) + beta


@pytest.mark.parametrize("width", [128, 40])
@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_bias_dropout_add_norm_equals_the_op_by_op_layer(width, rate):
    rng = np.random.default_rng(width)
    x, residual = (tf.constant(rng.normal(size=(23, width)), tf.float32) for _ in range(2))
    bias, gamma, beta = (tf.constant(rng.normal(size=(width,)), tf.float32) for _ in range(3))
    compare(lambda *a: kernels.bias_dropout_add_norm(*a[:3], a[3], a[4], SEED, rate, 1e-12),
            lambda *a: reference_norm(*a, rate, 1e-12), [x, bias, residual, gamma, beta])


@pytest.mark.parametrize("width", [128, 40])  # whole vectors, and a row with a tail
@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_bias_dropout_add_norm_in_bfloat16_rounds_the_float32_result_once(width, rate):
    rng = np.random.default_rng(width + 1)
    x, residual = (tf.cast(rng.normal(size=(19, width)), tf.bfloat16) for _ in range(2))
    bias, gamma, beta = (tf.constant(rng.normal(size=(width,)), tf.float32) for _ in range(3))
    ours = kernels.bias_dropout_add_norm(x, bias, residual, gamma, beta, SEED, rate, 1e-12)
    assert ours.dtype == tf.bfloat16
    exact = kernels.bias_dropout_add_norm(tf.cast(x, tf.float32), bias,
                                          tf.cast(residual, tf.float32), gamma, beta, SEED,
                                          rate, 1e-12)
    np.testing.assert_array_equal(tf.cast(ours, tf.float32),
                                  tf.cast(tf.cast(exact, tf.bfloat16), tf.float32))


def test_the_ops_refuse_inconsistent_shapes():
    with pytest.raises(tf.errors.InvalidArgumentError, match="heads"):
        kernels.attention(tf.zeros([6, 40]), tf.zeros([40]), tf.ones([2, 3], tf.int32), None, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias"):
        kernels.bias_gelu(tf.zeros([2, 8]), tf.zeros([7]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="residual"):
        kernels.bias_dropout_add_norm(tf.zeros([2, 8]), tf.zeros([8]), tf.zeros([3, 8]),
                                      tf.ones([8]), tf.zeros([8]), None, 0.0, 1e-6)
    with pytest.raises(ValueError, match="dropout rate"):
        kernels.bias_dropout_add_norm(tf.zeros([2, 8]), tf.zeros([8]), tf.zeros([2, 8]),
                                      tf.ones([8]), tf.zeros([8]), SEED, 1.0, 1e-6)


def adamw_run(fused, duplicates, steps=3):
    """The table and dense variable after `steps` FusedAdamW steps with a sparse
    table gradient, with or without the fused kernel."""
    previous = os.environ.get(kernels.SWITCH)
    os.environ[kernels.SWITCH] = "1" if fused else "0"
    try:
        rng = np.random.default_rng(0)
        table = keras.Variable(rng.normal(size=(300, 24)).astype("float32"), name="embeddings")
        dense = keras.Variable(rng.normal(size=(24, 4)).astype("float32"), name="kernel")
        bias = keras.Variable(rng.normal(size=(4,)).astype("float32"), name="bias")
        optimizer = FusedAdamW(learning_rate=1e-2, weight_decay=0.05)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        optimizer.build([table, dense, bias])

        @tf.function
        def step(ids, values, g_dense, g_bias):
            # the rows read as the students read them (ResourceGather: the table in
            # copy-on-read mode, the case where a dense update would copy it first)
            rows = tf.gather(table.value, ids)
            optimizer.apply_gradients([
                (tf.IndexedSlices(values + 0.0 * rows, ids, tf.constant([300, 24])), table),
                (g_dense, dense), (g_bias, bias)])

        draws = np.random.default_rng(1)
        for _ in range(steps):
            ids = draws.choice(300, 40, replace=False).astype("int32")
            if duplicates:
                ids[:6] = ids[6]
            arguments = (ids, draws.normal(size=(40, 24)).astype("float32"),
                         draws.normal(size=(24, 4)).astype("float32"),
                         draws.normal(size=(4,)).astype("float32"))
            step(*arguments)
        graph = step.get_concrete_function(*arguments).graph.as_graph_def()
        ops = {node.op for node in graph.node}
        ops |= {node.op for function in graph.library.function for node in function.node_def}
        assert ("LeallaSparseApplyAdamW" in ops) == fused, sorted(ops)
        momentum, velocity = optimizer.adam_slots(table)
        return [v.numpy() for v in (table, momentum, velocity, dense, bias)]
    finally:
        if previous is None:
            os.environ.pop(kernels.SWITCH)
        else:
            os.environ[kernels.SWITCH] = previous


@pytest.mark.parametrize("duplicates", [False, True])
def test_sparse_adamw_equals_decay_and_fused_adam_on_the_densified_gradient(duplicates):
    fused, ops = adamw_run(True, duplicates), adamw_run(False, duplicates)
    for name, a, b in zip(["table", "m", "v", "dense", "bias"], fused, ops):
        # float32 round-off only (the kernel may contract a * b + c into one FMA)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)


def test_sparse_adamw_refuses_an_index_outside_the_table():
    table, m, v = (tf.Variable(tf.zeros([5, 2])) for _ in range(3))
    gradient = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([5]), tf.constant([5, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        kernels.sparse_apply_adamw(table.handle, m.handle, v.handle, gradient, 0.1, 0.9,
                                   0.999, 0.9, 0.999, 1e-6, 0.0)


def test_the_gradients_are_registered_with_the_ops():
    """Importing the package registers each fused op's gradient (its own op)."""
    mask = tf.ones([1, 2], tf.int32)
    x = tf.constant(np.random.default_rng(9).normal(size=(2, 3 * 2 * 4)), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(kernels.attention(x, tf.zeros([24]), mask, None, 2))
    graph = tf.function(lambda x: tf.gradients(tf.reduce_sum(kernels.attention(
        x, tf.zeros([24]), mask, None, 2)), x)).get_concrete_function(x).graph
    assert "LeallaAttentionGrad" in {op.type for op in graph.get_operations()}
    assert tape.gradient(y, x).shape == x.shape
