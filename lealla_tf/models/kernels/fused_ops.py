"""The fused ops' Python wrappers and their gradients.

Three ops of `fused_layers.cc` do a transformer layer's elementwise blocks in one
pass over their rows:

- `attention(qkv, bias, mask, seed, num_heads, rate)`: every head's masked
  softmax attention with dropout on the probabilities, from the packed
  projection's rows to the rows the output projection reads;
- `bias_gelu(x, bias, approximate)`: GELU of `x + bias`;
- `bias_dropout_add_norm(x, bias, residual, gamma, beta, seed, rate, epsilon)`:
  layer norm of `dropout(x + bias) + residual`.

They compute in float32 whatever the tensors' type (float32 or bfloat16), draw
the dropout masks of `lealla_tf.models.layers.hash_dropout` bit for bit, and
equal the op-by-op layer within round-off (tests/models/test_fused_ops.py).
Their gradients are ops of the same library, registered when this module is
imported. A fourth, `sparse_apply_adamw` (`sparse_adamw.cc`), updates a lookup
table with `lealla_tf.train.optimizers.FusedAdamW`'s arithmetic in one pass from
its sparse gradient.
"""

import tensorflow as tf

from lealla_tf.machine import usable_cpus
from lealla_tf.models.kernels.op_library import load
from lealla_tf.models.layers.hash_dropout import check_rate, keep_threshold


def _dropout_attributes(rate: float) -> dict:
    rate = check_rate(rate)
    if rate == 0.0:
        return {"dropout_threshold": 0, "dropout_scale": 1.0}
    return {"dropout_threshold": keep_threshold(rate), "dropout_scale": 1.0 / (1.0 - rate)}


def _seed(seed):
    if seed is None:
        return tf.zeros([2], tf.int64)
    return tf.cast(seed, tf.int64)


@tf.autograph.experimental.do_not_convert
def attention(qkv, bias, mask, seed, num_heads: int, rate: float = 0.0):
    """Multi-head attention of a packed projection's rows.

    Args:
        qkv: `[batch * length, 3 * num_heads * size]` (float32 or bfloat16): each
            token's query (already scaled by 1 / sqrt(size)), key and value,
            head-major within each, before their bias.
        bias: float32 `[3 * num_heads * size]`, added to each row.
        mask: int32 `[batch, length]`, 0 at padded keys (their scores get -1e9,
            as Keras' masked softmax adds).
        seed: two integers for the dropout on the probabilities (or None when
            `rate` is 0).
        rate: dropout rate on the attention probabilities.

    Returns: `[batch * length, num_heads * size]`, heads side by side, in `qkv`'s type.
    """
    return load().lealla_attention(qkv, tf.cast(bias, tf.float32), tf.cast(mask, tf.int32),
                                   _seed(seed), num_heads=num_heads,
                                   **_dropout_attributes(rate))


@tf.autograph.experimental.do_not_convert
def bias_gelu(x, bias, approximate: bool = True):
    """GELU (tanh-approximate or exact erf) of `x + bias`, `x` `[rows, width]`."""
    return load().lealla_bias_gelu(x, tf.cast(bias, tf.float32), approximate=approximate)


@tf.autograph.experimental.do_not_convert
def bias_dropout_add_norm(x, bias, residual, gamma, beta, seed, rate: float, epsilon: float):
    """Layer norm (over the last axis, float32 statistics) of
    `dropout(x + bias) + residual`, all `[rows, width]` in one type; `gamma`,
    `beta` and `bias` `[width]` (read as float32)."""
    outputs = load().lealla_bias_dropout_add_norm(
        x, tf.cast(bias, tf.float32), residual, tf.cast(gamma, tf.float32),
        tf.cast(beta, tf.float32), _seed(seed), epsilon=epsilon, **_dropout_attributes(rate))
    return outputs[0]


@tf.autograph.experimental.do_not_convert
def sparse_apply_adamw(variable, momentum, velocity, gradient, lr, beta1_power, beta2_power,
                       beta1, beta2, epsilon, weight_decay):
    """AdamW with decoupled weight decay on `variable` (float32, rows first) from a
    `tf.IndexedSlices` `gradient`, in one pass over the table (the arithmetic of
    `lealla_tf.train.optimizers.FusedAdamW`'s decay + `ResourceApplyAdam` on the
    densified gradient; repeated indices are summed). The variables are
    resource handles; the scalars float32."""
    return load().lealla_sparse_apply_adam_w(
        variable, momentum, velocity, gradient.indices, tf.cast(gradient.values, tf.float32),
        *[tf.cast(x, tf.float32) for x in (lr, beta1_power, beta2_power, beta1, beta2,
                                           epsilon, weight_decay)],
        num_threads=usable_cpus())


# === Gradients: ops of the same library, looked up when a gradient is built ===

def _dropout_of(op) -> dict:
    return {"dropout_threshold": op.get_attr("dropout_threshold"),
            "dropout_scale": op.get_attr("dropout_scale")}


@tf.RegisterGradient("LeallaAttention")
def _attention_gradient(op, dcontext):
    qkv, bias, mask, seed = op.inputs
    dqkv, dbias = load().lealla_attention_grad(
        dcontext, qkv, bias, mask, seed, num_heads=op.get_attr("num_heads"), **_dropout_of(op))
    return [dqkv, dbias, None, None]


@tf.RegisterGradient("LeallaBiasGelu")
def _bias_gelu_gradient(op, dy):
    x, bias = op.inputs
    return list(load().lealla_bias_gelu_grad(dy, x, bias, approximate=op.get_attr("approximate")))


@tf.RegisterGradient("LeallaBiasDropoutAddNorm")
def _norm_gradient(op, dy, _dmean, _drstd):
    # mean and rstd are outputs for this gradient only (the wrapper returns y).
    x, bias, residual, gamma, beta, seed = op.inputs
    dx, dbias, dresidual, dgamma, dbeta = load().lealla_bias_dropout_add_norm_grad(
        dy, x, bias, residual, gamma, beta, seed, op.outputs[1], op.outputs[2],
        **_dropout_of(op))
    return [dx, dbias, dresidual, dgamma, dbeta, None]
