"""The fast forward pass of a `LeallaEncoder`: its outputs with fewer, larger ops.

`forward(encoder, inputs)` returns what `encoder(inputs)` returns, computed from
the same weights (TensorFlow backend, float32 or bfloat16 compute; otherwise it
is the Keras call):

- each layer's three attention projections run as one `[b*t, d] x [d, 3d]`
  matmul (1/sqrt(head size) folded into the query weights), the heads as two
  batched matmuls on `[b, heads, t, head size]`, and the feed-forward block on
  `[b*t, d]` rows;
- the embeddings, layer norms and pooling are the encoder's own layers, and
  dropout keeps their rates and seed generators with a cheaper mask
  (`lealla_tf.models.layers.hash_dropout`);
- with `fused_kernels=True` (the students' training step on a CPU, when
  `lealla_tf.models.kernels.usable()`), each layer's attention core, its bias +
  GELU and its two bias + dropout + residual + layer norm blocks run as the
  fused ops of `lealla_tf.models.kernels`: the same outputs within round-off and
  the same dropout masks from the same seeds.

Without dropout the outputs are the Keras call's within float32 round-off
(tests/models/test_forward_pass.py). The exports and embedders serve with it,
and the students train through it (`benchmarks/embedding_speed.py` and
`benchmarks/training_step.py` time both). Exports never use the fused kernels (a
SavedModel must load without their library).

The keras-hub sublayers it reads come from `lealla_tf.models.transformer_adapter`.
"""

import math
from collections.abc import Collection
from typing import NamedTuple

import keras
import tensorflow as tf

from lealla_tf.models import kernels
from lealla_tf.models.layers import hash_dropout
from lealla_tf.models.transformer_adapter import TransformerParts, transformer_parts

# `forward` embeds an inference batch as this many independent parts, which
# TensorFlow's executor threads run side by side: each op's data stays in one
# core's cache and no op waits for the other thread. Chosen by
# `benchmarks/embedding_speed.py --parts`.
INFERENCE_PARTS = 2


def forward(encoder, inputs, training=False, parts: int | None = None,
            fused_kernels: bool = False, skipped_layers: Collection[int] = ()) -> dict:
    """The outputs of `encoder(inputs, training=training)` (see the module).

    Inference runs the batch as `parts` (default `INFERENCE_PARTS`) independent
    parts, each through `encoder.forward_batches`. Where one thread runs the
    graph (a Beam worker capped at one) the parts run one after the other; the
    int8 TFLite export is built with `parts=1` (its interpreter runs one op at a
    time on every thread).
    `skipped_layers`: see `forward_batches`.
    """
    parts = INFERENCE_PARTS if parts is None else parts
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    if not supported(encoder):
        _check_unskipped(skipped_layers)
        return encoder(inputs, training=training)
    if training or parts == 1:
        return encoder.forward_batches([inputs], training, fused_kernels, skipped_layers)[0]
    inputs = {name: tf.convert_to_tensor(value) for name, value in inputs.items()}
    rows = tf.shape(inputs["input_word_ids"])[0]
    cuts = [rows * i // parts for i in range(parts + 1)]
    pieces = encoder.forward_batches(
        [{name: value[start:stop] for name, value in inputs.items()}
         for start, stop in zip(cuts, cuts[1:])], False, fused_kernels, skipped_layers)
    return tf.nest.map_structure(lambda *part: tf.concat(part, axis=0), *pieces)


def forward_batches(encoder, batches: list, training=False, fused_kernels: bool = False,
                    skipped_layers: Collection[int] = ()) -> list:
    """`forward` (without parts) of each batch in `batches`, the weights packed
    and cast to the compute dtype once for all of them: a pair's two sides in
    the students' training step, the parts of an inference batch.

    `skipped_layers`: indices of layers that hand their input on unchanged (a
    progressive-depth run's pass-through layers before they are inserted:
    `lealla_tf.train.trainer`); their entries in `encoder_outputs` repeat the
    previous output, so the layers keep their indices."""
    if not supported(encoder):
        _check_unskipped(skipped_layers)
        return [encoder(inputs, training=training) for inputs in batches]
    compute = encoder.token_embedding.compute_dtype
    weights = {}  # layer name -> its LayerWeights, filled on first use
    return [_forward(encoder, inputs, training, compute, weights, fused_kernels,
                     frozenset(skipped_layers))
            for inputs in batches]


def _check_unskipped(skipped_layers) -> None:
    if skipped_layers:
        raise ValueError("skipping layers needs the fast forward pass (TensorFlow backend, "
                         "float32 or bfloat16 compute); the Keras call runs every layer")


def supported(encoder) -> bool:
    """Whether `forward` computes `encoder` itself (else it makes the Keras call)."""
    return (keras.backend.backend() == "tensorflow"
            and encoder.token_embedding.compute_dtype in ("float32", "bfloat16"))


def _forward(encoder, inputs, training, compute, weights, fused=False,
             skipped=frozenset()) -> dict:
    """`forward` on one batch. `weights`: layer name -> its `LayerWeights`,
    filled here on first use (shared by the batches of one `forward_batches`);
    `fused`: run the layers with `lealla_tf.models.kernels` where they allow it;
    `skipped`: the indices of layers that hand their input on."""
    ids, mask = inputs["input_word_ids"], inputs["input_mask"]
    x = token_rows(encoder, ids, compute)
    if encoder.embedding_projection is not None:
        x = encoder.embedding_projection(x)
    x = encoder.embeddings_add(
        (x, encoder.position_embedding(x), encoder.segment_embedding(inputs["input_type_ids"])))
    x = _dropout(encoder.embeddings_dropout, encoder.embeddings_layer_norm(x), training)
    batch, length = tf.shape(ids)[0], tf.shape(ids)[1]
    width = encoder.hidden_dim
    # Keras' masked softmax: -1e9 added at padded keys (float32).
    # (A reshape, not [:, None, None, :]: TFLite has no strided slice that adds axes.)
    key_bias = tf.cast(tf.reshape(1.0 - tf.cast(mask, tf.float32), [batch, 1, 1, length])
                       * -1e9, compute)
    rows = tf.reshape(x, [-1, width])
    encoder_outputs = []
    for i in range(encoder.num_layers):
        if i in skipped:  # `rows` stays the previous output
            encoder_outputs.append(tf.reshape(rows, [batch, length, width]))
            continue
        layer = encoder.transformer_layers[i % len(encoder.transformer_layers)]
        if layer.name not in weights:
            weights[layer.name] = layer_weights(layer, compute)
        w = weights[layer.name]
        if fused and fusable(w.parts, encoder.hidden_activation):
            rows = _fused_layer(w, rows, mask, training, encoder.hidden_activation)
        else:
            rows = _layer(w, rows, key_bias, batch, length, compute, training)
        encoder_outputs.append(tf.reshape(rows, [batch, length, width]))
    x = encoder_outputs[-1]
    pooled_output, embedding = encoder.pool(x, mask)
    return {"sentence_embedding": encoder.l2_normalization(embedding),
            "pooled_output": pooled_output, "sequence_output": x,
            "encoder_outputs": encoder_outputs}


def _layer(w, rows, key_bias, batch, length, compute, training):
    """One transformer layer on rows `[b*t, d]`, op by op."""
    # [3, b, heads, t, head], unstacked along its first axis: views of one
    # buffer, no copy (tf.split on another axis copies), and the gradient is
    # one stack (an index's would write a zero tensor of the whole input).
    qkv = tf.reshape(tf.nn.bias_add(tf.matmul(rows, w.qkv_kernel), tf.cast(w.qkv_bias, compute)),
                     [batch, length, 3, w.heads, w.head_size])
    query, key, value = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))
    scores = tf.matmul(query, key, transpose_b=True) + key_bias
    probabilities = _dropout(w.parts.attention_dropout, tf.nn.softmax(scores), training)
    context = tf.matmul(probabilities, value)
    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, w.heads * w.head_size])
    attended = tf.nn.bias_add(tf.matmul(context, w.output_kernel),
                              tf.cast(w.output_bias, compute))
    rows = layer_norm(w.parts.attention_norm,
                      _dropout(w.parts.attention_output_dropout, attended, training) + rows)
    hidden = activate(w.parts.intermediate_dense.activation, tf.nn.bias_add(
        tf.matmul(rows, w.intermediate_kernel), tf.cast(w.intermediate_bias, compute)))
    hidden = tf.nn.bias_add(tf.matmul(hidden, w.feedforward_kernel),
                            tf.cast(w.feedforward_bias, compute))
    return layer_norm(w.parts.feedforward_norm,
                      _dropout(w.parts.feedforward_dropout, hidden, training) + rows)


def token_rows(encoder, ids, compute):
    """The token embeddings of `ids`, looked up, then cast to `compute`: under a
    mixed policy the layer's own call would cast the whole table to bfloat16
    first (LaBSE's 64M values, twice a training step)."""
    return tf.cast(tf.gather(encoder.token_embedding.embeddings.value, ids), compute)


def _fused_layer(w, rows, mask, training, activation):
    """One transformer layer on rows `[b*t, d]` with `lealla_tf.models.kernels`' fused
    ops: the four matmuls stay TensorFlow's (without their bias, which each
    fused op adds), dropout seeds are drawn in the order `_layer` draws them."""
    def seed(dropout):
        return dropout.seed_generator.next() if training and dropout.rate > 0 else None

    def rate(dropout):
        return float(dropout.rate) if training else 0.0

    def norm(norm, dropout, x, bias, residual):
        """`norm(dropout(x + bias) + residual)` as one fused op."""
        return kernels.bias_dropout_add_norm(x, bias, residual, norm.gamma, norm.beta,
                                             seed(dropout), rate(dropout), norm.epsilon)

    parts = w.parts
    probabilities = parts.attention_dropout
    context = kernels.attention(tf.matmul(rows, w.qkv_kernel), w.qkv_bias, mask,
                                seed(probabilities), w.heads, rate(probabilities))
    rows = norm(parts.attention_norm, parts.attention_output_dropout,
                tf.matmul(context, w.output_kernel), w.output_bias, rows)
    hidden = kernels.bias_gelu(tf.matmul(rows, w.intermediate_kernel), w.intermediate_bias,
                               approximate=activation == "gelu_approximate")
    return norm(parts.feedforward_norm, parts.feedforward_dropout,
                tf.matmul(hidden, w.feedforward_kernel), w.feedforward_bias, rows)


def fusable(parts: TransformerParts, activation: str) -> bool:
    """Whether the fused kernels compute this layer as it is built: a GELU
    feed-forward block, plain layer norms, dropout without a noise shape."""
    norms = (parts.attention_norm, parts.feedforward_norm)
    dropouts = (parts.attention_dropout, parts.attention_output_dropout,
                parts.feedforward_dropout)
    return (activation in ("gelu", "gelu_approximate")
            and all(plain_norm(norm) for norm in norms)
            and all(dropout.noise_shape is None for dropout in dropouts))


def plain_norm(layer) -> bool:
    """Whether the Keras `LayerNormalization` `layer` normalises the last axis
    with a scale and an offset (the only kind `layer_norm` computes itself)."""
    return (not layer.rms_scaling and layer.center and layer.scale
            and layer.axis in (-1, [-1]))


def activate(activation, x):
    """`activation(x)`, computed in float32 when `x` is bfloat16 (then cast back):
    TensorFlow's bfloat16 elementwise kernels are slower than its float32 ones
    on a CPU (the `float32_activation` lever of the retired
    `benchmarks/train_throughput.py --levers`: docs/benchmarks.md, "Settings chosen
    by retired benchmarks"), and it rounds once instead of at every op."""
    if x.dtype != tf.bfloat16:
        return activation(x)
    return tf.cast(activation(tf.cast(x, tf.float32)), x.dtype)


def layer_norm(layer, x):
    """The Keras `LayerNormalization` `layer` on rows `x` `[n, d]` (Keras' formula,
    as `keras.ops.layer_normalization` computes it: statistics in float32), in
    fewer ops than its own call."""
    if not plain_norm(layer):
        return layer(x)
    dtype = x.dtype
    x = tf.cast(x, tf.float32)
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    scale = tf.math.rsqrt(variance + layer.epsilon) * tf.cast(layer.gamma, tf.float32)
    return tf.cast(centered * scale + tf.cast(layer.beta, tf.float32), dtype)


def _dropout(layer, x, training):
    """What the Keras `Dropout` layer `layer` does to `x`, with its rate and its
    seed generator, by `lealla_tf.models.layers.hash_dropout` (the same
    distribution, a cheaper mask than Keras' Philox draw)."""
    if not training or layer.rate == 0:
        return x
    if layer.noise_shape is not None:
        return layer(x, training=training)
    return hash_dropout.dropout(x, layer.rate, layer.seed_generator.next())


class LayerWeights(NamedTuple):
    """One transformer layer's weights as the forward pass uses them: kernels in
    the compute dtype, biases in float32 (the fused ops add them in float32; the
    op-by-op layer casts them as the Keras layers would)."""

    qkv_kernel: object  # [d, 3 * inner]: query (scaled), key, value side by side
    qkv_bias: object  # [3 * inner]
    output_kernel: object  # [inner, d]
    output_bias: object
    intermediate_kernel: object  # [d, d_ff]
    intermediate_bias: object
    feedforward_kernel: object  # [d_ff, d]
    feedforward_bias: object
    heads: int
    head_size: int
    parts: TransformerParts


def layer_weights(layer, compute) -> LayerWeights:
    """A keras-hub TransformerEncoder's weights for the forward pass: the
    attention's query, key and value kernels side by side `[d, 3 * inner]` (the
    query's scaled by 1/sqrt(head size), as Keras scales the projected query)
    and their biases, its output projection, and the feed-forward block."""
    parts = transformer_parts(layer)
    heads, head_size = parts.heads, parts.head_size
    width = parts.query_dense.kernel.shape[0]
    inner = heads * head_size
    scales = (1.0 / math.sqrt(head_size), 1.0, 1.0)
    projections = (parts.query_dense, parts.key_dense, parts.value_dense)
    kernel = tf.concat([tf.reshape(p.kernel, [width, inner]) * scale
                        for p, scale in zip(projections, scales)], axis=1)
    bias = tf.concat([tf.reshape(p.bias, [inner]) * scale
                      for p, scale in zip(projections, scales)], axis=0)
    intermediate, output = parts.intermediate_dense, parts.output_dense

    def cast(kernel):
        return tf.cast(kernel, compute)

    def float32(bias):
        return tf.cast(bias, tf.float32)

    return LayerWeights(
        cast(kernel), bias, cast(tf.reshape(parts.attention_output_dense.kernel, [inner, width])),
        float32(parts.attention_output_dense.bias), cast(intermediate.kernel),
        float32(intermediate.bias), cast(output.kernel), float32(output.bias), heads, head_size,
        parts)
