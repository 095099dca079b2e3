"""The sentence encoder: a BERT-style transformer built from keras-hub layers."""

import math
from typing import NamedTuple, Optional

import keras
from keras_hub.layers import PositionEmbedding, TransformerEncoder

from lealla_tf.configs import EncoderConfig, config_to_dict
from lealla_tf.models.layers import L2Normalization, MaskedMeanPooling, hash_dropout


def _bert_initializer():
    return keras.initializers.TruncatedNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="lealla_tf")
def gelu_approximate(x):
    """GELU, tanh approximation (TensorFlow BERT / LaBSE / LEALLA checkpoints)."""
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="lealla_tf")
def gelu_exact(x):
    """GELU with the exact erf form (HuggingFace BERT checkpoints)."""
    return keras.activations.gelu(x, approximate=False)


_ACTIVATIONS = {"gelu": gelu_exact, "gelu_approximate": gelu_approximate, "relu": "relu"}

# `LeallaEncoder.forward` embeds a batch as this many independent parts (see there).
INFERENCE_PARTS = 2


@keras.saving.register_keras_serializable(package="lealla_tf")
class LeallaEncoder(keras.Model):
    """A language-agnostic sentence encoder (LaBSE, LEALLA and their variants).

    Token, position and segment embeddings, then `num_layers` keras-hub
    `TransformerEncoder` layers (post-layer-norm BERT), then pooling. With the
    LEALLA-small settings and LaBSE's 501,153-token vocabulary this has exactly
    the 68,988,672 parameters of the released model. Dropout is active only when
    called with `training=True`.

    Inputs are the dict produced by `lealla_tf.Tokenizer` (the names of the
    TF-Hub BERT interface): `input_word_ids`, `input_mask`, `input_type_ids`,
    int32 `[batch, seq_len]`.

    Outputs, a dict:
        sentence_embedding: float32 `[batch, d]`, the L2-normalised pooled output
            (after the optional output projection).
        pooled_output: `[batch, pooler_dim]`, [CLS] -> dense -> tanh (or masked
            mean), not normalised (LaBSE's `default`).
        sequence_output: `[batch, seq_len, d]`, the last layer.
        encoder_outputs: list of `num_layers` tensors `[batch, seq_len, d]`.

    Args:
        vocabulary_size: int. Token embedding rows.
        num_layers: int. Transformer layers applied.
        num_heads: int. Attention heads.
        hidden_dim: int. Width d.
        intermediate_dim: int. Feed-forward width.
        dropout: float. Dropout rate.
        max_sequence_length: int. Position embedding rows.
        num_segments: int. Segment embedding rows.
        embedding_dim: optional int. Embedding bottleneck size e (vocab x e
            table, then a dense e -> d); None for none.
        num_unique_layers: optional int. Parameter recurrence: only this many
            distinct layers, applied cyclically; None for none.
        pooling: "cls" or "mean".
        pooler_dim: optional int. [CLS] pooler width (default `hidden_dim`).
        output_dim: optional int. Dense projection of the pooled output to
            this size before normalisation; None for none.
        hidden_activation: "gelu", "gelu_approximate" or "relu".
        layer_norm_epsilon: float.
        dtype: optional dtype or `keras.DTypePolicy` ("mixed_bfloat16").

    Example:
    ```python
    encoder = LeallaEncoder(vocabulary_size=30, num_layers=2, num_heads=2,
                            hidden_dim=8, intermediate_dim=16)
    outputs = encoder({
        "input_word_ids": np.array([[2, 5, 3]], "int32"),
        "input_mask": np.ones((1, 3), "int32"),
        "input_type_ids": np.zeros((1, 3), "int32"),
    })
    outputs["sentence_embedding"].shape  # (1, 8), unit rows
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        embedding_dim=None,
        num_unique_layers=None,
        pooling="cls",
        pooler_dim=None,
        output_dim=None,
        hidden_activation="gelu_approximate",
        layer_norm_epsilon=1e-12,
        dtype=None,
        **kwargs,
    ):
        # Validate once, with readable messages, before any weight is made.
        EncoderConfig(
            vocabulary_size=vocabulary_size, num_layers=num_layers,
            num_heads=num_heads, hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim, dropout=dropout,
            max_sequence_length=max_sequence_length, num_segments=num_segments,
            embedding_dim=embedding_dim, num_unique_layers=num_unique_layers,
            pooling=pooling, pooler_dim=pooler_dim, output_dim=output_dim,
            hidden_activation=hidden_activation, layer_norm_epsilon=layer_norm_epsilon)

        # === Layers ===
        token_dim = embedding_dim or hidden_dim
        self.token_embedding = keras.layers.Embedding(
            input_dim=vocabulary_size,
            output_dim=token_dim,
            embeddings_initializer=_bert_initializer(),
            dtype=dtype,
            name="token_embedding",
        )
        self.embedding_projection = None
        if embedding_dim is not None:
            self.embedding_projection = keras.layers.Dense(
                hidden_dim,
                kernel_initializer=_bert_initializer(),
                dtype=dtype,
                name="embedding_projection",
            )
        self.position_embedding = PositionEmbedding(
            sequence_length=max_sequence_length,
            initializer=_bert_initializer(),
            dtype=dtype,
            name="position_embedding",
        )
        self.segment_embedding = keras.layers.Embedding(
            input_dim=num_segments,
            output_dim=hidden_dim,
            embeddings_initializer=_bert_initializer(),
            dtype=dtype,
            name="segment_embedding",
        )
        self.embeddings_add = keras.layers.Add(dtype=dtype, name="embeddings_add")
        self.embeddings_layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name="embeddings_layer_norm")
        self.embeddings_dropout = keras.layers.Dropout(
            dropout, dtype=dtype, name="embeddings_dropout")
        self.transformer_layers = [
            TransformerEncoder(
                num_heads=num_heads,
                intermediate_dim=intermediate_dim,
                activation=_ACTIVATIONS[hidden_activation],
                dropout=dropout,
                layer_norm_epsilon=layer_norm_epsilon,
                kernel_initializer=_bert_initializer(),
                dtype=dtype,
                name=f"transformer_layer_{i}",
            )
            for i in range(num_unique_layers or num_layers)
        ]
        self.pooled_dense = None
        if pooling == "cls":
            self.pooled_dense = keras.layers.Dense(
                pooler_dim or hidden_dim,
                kernel_initializer=_bert_initializer(),
                activation="tanh",
                dtype=dtype,
                name="pooled_dense",
            )
        else:
            self.mean_pooling = MaskedMeanPooling(dtype=dtype, name="mean_pooling")
        self.output_dense = None
        if output_dim is not None:
            self.output_dense = keras.layers.Dense(
                output_dim,
                kernel_initializer=_bert_initializer(),
                dtype=dtype,
                name="output_dense",
            )
        self.l2_normalization = L2Normalization(dtype=dtype, name="l2_normalization")

        # === Functional Model ===
        word_ids = keras.Input(shape=(None,), dtype="int32", name="input_word_ids")
        mask = keras.Input(shape=(None,), dtype="int32", name="input_mask")
        type_ids = keras.Input(shape=(None,), dtype="int32", name="input_type_ids")

        tokens = self.token_embedding(word_ids)
        if self.embedding_projection is not None:
            tokens = self.embedding_projection(tokens)
        positions = self.position_embedding(tokens)
        segments = self.segment_embedding(type_ids)
        x = self.embeddings_add((tokens, positions, segments))
        x = self.embeddings_layer_norm(x)
        x = self.embeddings_dropout(x)
        encoder_outputs = []
        for i in range(num_layers):
            # With parameter recurrence the same layers are applied in turn.
            x = self.transformer_layers[i % len(self.transformer_layers)](
                x, padding_mask=mask)
            encoder_outputs.append(x)
        pooled_output, embedding = self._pool(x, mask)
        super().__init__(
            inputs={
                "input_word_ids": word_ids,
                "input_mask": mask,
                "input_type_ids": type_ids,
            },
            outputs={
                "sentence_embedding": self.l2_normalization(embedding),
                "pooled_output": pooled_output,
                "sequence_output": x,
                "encoder_outputs": encoder_outputs,
            },
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.embedding_dim = embedding_dim
        self.num_unique_layers = num_unique_layers
        self.pooling = pooling
        self.pooler_dim = pooler_dim
        self.output_dim = output_dim
        self.hidden_activation = hidden_activation
        self.layer_norm_epsilon = layer_norm_epsilon

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "vocabulary_size": self.vocabulary_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "max_sequence_length": self.max_sequence_length,
            "num_segments": self.num_segments,
            "embedding_dim": self.embedding_dim,
            "num_unique_layers": self.num_unique_layers,
            "pooling": self.pooling,
            "pooler_dim": self.pooler_dim,
            "output_dim": self.output_dim,
            "hidden_activation": self.hidden_activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            # The functional wrapper does not keep the policy its layers were built with.
            "dtype": keras.dtype_policies.serialize(self.token_embedding.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)

    def _pool(self, x, mask):
        """The last layer `[b, t, d]` -> (pooled_output, the embedding before
        normalisation)."""
        if self.pooled_dense is not None:
            pooled_output = self.pooled_dense(x[:, 0, :])
        else:
            pooled_output = self.mean_pooling(x, mask)
        if self.output_dense is not None:
            return pooled_output, self.output_dense(pooled_output)
        return pooled_output, pooled_output

    def forward(self, inputs, training=False, parts: Optional[int] = None,
                fused_kernels: bool = False) -> dict:
        """The outputs of `self(inputs, training=training)`, computed with fewer,
        larger ops (TensorFlow backend, float32 or bfloat16; otherwise the Keras call).

        Each layer's three attention projections run as one `[b*t, d] x [d, 3d]`
        matmul (1/sqrt(head size) folded into the query weights), the heads as
        two batched matmuls on `[b, heads, t, head size]`, and the feed-forward
        block on `[b*t, d]` rows; the embeddings, layer norms and pooling are
        this model's own layers, and dropout has their rates and seed generators
        with a cheaper mask (`lealla_tf.models.layers.hash_dropout`). Without dropout
        the outputs are the Keras call's within float32 round-off (tested to
        1e-5). The exports and embedders serve with it, and the students train
        through it (benchmarks/embed_speed.py, benchmarks/train_throughput.py).

        Inference runs the batch as `parts` (default `INFERENCE_PARTS`)
        independent parts, which TensorFlow's executor threads run side by side:
        on 2 cores that made lealla_small 5-8 % faster (each op's data stays in
        one core's cache and no op waits for the other thread) and the labse
        preset 1-2 % (`benchmarks/encoder_roofline.py`, its "parts" table).
        Where one thread runs the graph (a Beam worker capped at one, an
        XLA-compiled function, which the XLA exports call with `parts=1`) the
        parts run one after the other.

        `fused_kernels=True` (the students' training step on a CPU, when
        `lealla_tf.models.kernels.usable()`) runs each layer's attention core, its
        bias + GELU and its two bias + dropout + residual + layer norm blocks as
        the fused ops of `lealla_tf.models.kernels`: the same outputs within round-off
        and the same dropout masks from the same seeds, in a fraction of the ops.
        Exports never use them (a SavedModel must load without this library).
        """
        parts = INFERENCE_PARTS if parts is None else parts
        if parts < 1:
            raise ValueError(f"parts must be at least 1, got {parts}")
        if not self._forward_supported():
            return self(inputs, training=training)
        import tensorflow as tf

        if training or parts == 1:
            return self.forward_batches([inputs], training, fused_kernels)[0]
        inputs = {name: tf.convert_to_tensor(value) for name, value in inputs.items()}
        rows = tf.shape(inputs["input_word_ids"])[0]
        cuts = [rows * i // parts for i in range(parts + 1)]
        pieces = self.forward_batches(
            [{name: value[start:stop] for name, value in inputs.items()}
             for start, stop in zip(cuts, cuts[1:])], False, fused_kernels)
        return tf.nest.map_structure(lambda *part: tf.concat(part, axis=0), *pieces)

    def forward_batches(self, batches: list, training=False, fused_kernels: bool = False) -> list:
        """`forward` (without parts) of each batch in `batches`, the weights packed
        and cast to the compute dtype once for all of them: a pair's two sides in
        the students' training step, the parts of an inference batch."""
        if not self._forward_supported():
            return [self(inputs, training=training) for inputs in batches]
        compute = self.token_embedding.compute_dtype
        weights = {}  # layer name -> its _LayerWeights, filled on first use
        return [self._forward(inputs, training, compute, weights, fused_kernels)
                for inputs in batches]

    def _forward_supported(self) -> bool:
        return (keras.backend.backend() == "tensorflow"
                and self.token_embedding.compute_dtype in ("float32", "bfloat16"))

    def _forward(self, inputs, training, compute, weights, fused=False) -> dict:
        """`forward` on one batch (see there). `weights`: layer name -> its
        `_LayerWeights`, filled here on first use (shared by the batches of one
        `forward_batches`); `fused`: run the layers with `lealla_tf.models.kernels` where
        they allow it."""
        import tensorflow as tf

        ids, mask = inputs["input_word_ids"], inputs["input_mask"]
        x = self._token_rows(ids, compute)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)
        x = self.embeddings_add(
            (x, self.position_embedding(x), self.segment_embedding(inputs["input_type_ids"])))
        x = _dropout(self.embeddings_dropout, self.embeddings_layer_norm(x), training)
        batch, length = tf.shape(ids)[0], tf.shape(ids)[1]
        # Keras' masked softmax: -1e9 added at padded keys (float32).
        key_bias = tf.cast((1.0 - tf.cast(mask, tf.float32))[:, None, None, :] * -1e9, compute)
        rows = tf.reshape(x, [-1, self.hidden_dim])
        encoder_outputs = []
        for i in range(self.num_layers):
            layer = self.transformer_layers[i % len(self.transformer_layers)]
            if layer.name not in weights:
                weights[layer.name] = _layer_weights(layer, compute)
            w = weights[layer.name]
            if fused and _fusable(w.parts, self.hidden_activation):
                rows = self._fused_layer(w, rows, mask, training)
                encoder_outputs.append(tf.reshape(rows, [batch, length, self.hidden_dim]))
                continue
            # [3, b, heads, t, head], unstacked along its first axis: views of one
            # buffer, no copy (tf.split on another axis copies), and the gradient is
            # one stack (an index's would write a zero tensor of the whole input).
            qkv = tf.reshape(tf.nn.bias_add(tf.matmul(rows, w.qkv_kernel),
                                            tf.cast(w.qkv_bias, compute)),
                             [batch, length, 3, w.heads, w.head_size])
            query, key, value = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))
            scores = tf.matmul(query, key, transpose_b=True) + key_bias
            probabilities = _dropout(w.parts.attention_dropout, tf.nn.softmax(scores), training)
            context = tf.matmul(probabilities, value)
            context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                                 [-1, w.heads * w.head_size])
            attended = tf.nn.bias_add(tf.matmul(context, w.output_kernel),
                                      tf.cast(w.output_bias, compute))
            rows = _layer_norm(w.parts.attention_norm,
                               _dropout(w.parts.attention_output_dropout, attended, training)
                               + rows)
            hidden = _activate(w.parts.intermediate_dense.activation, tf.nn.bias_add(
                tf.matmul(rows, w.intermediate_kernel), tf.cast(w.intermediate_bias, compute)))
            hidden = tf.nn.bias_add(tf.matmul(hidden, w.feedforward_kernel),
                                    tf.cast(w.feedforward_bias, compute))
            rows = _layer_norm(w.parts.feedforward_norm,
                               _dropout(w.parts.feedforward_dropout, hidden, training) + rows)
            encoder_outputs.append(tf.reshape(rows, [batch, length, self.hidden_dim]))
        x = encoder_outputs[-1]
        pooled_output, embedding = self._pool(x, mask)
        return {"sentence_embedding": self.l2_normalization(embedding),
                "pooled_output": pooled_output, "sequence_output": x,
                "encoder_outputs": encoder_outputs}

    def _token_rows(self, ids, compute):
        """The token embeddings of `ids`, looked up, then cast to `compute`: under a
        mixed policy the layer's own call would cast the whole table to bfloat16
        first (LaBSE's 64M values, twice a training step)."""
        import tensorflow as tf

        return tf.cast(tf.gather(self.token_embedding.embeddings.value, ids), compute)

    def _fused_layer(self, w, rows, mask, training):
        """One transformer layer on rows `[b*t, d]` with `lealla_tf.models.kernels`' fused
        ops: the four matmuls stay TensorFlow's (without their bias, which each
        fused op adds), dropout seeds are drawn in the order `_forward` draws them."""
        import tensorflow as tf

        from lealla_tf.models import kernels

        def seed(dropout):
            return dropout.seed_generator.next() if training and dropout.rate > 0 else None

        def rate(dropout):
            return float(dropout.rate) if training else 0.0

        parts = w.parts
        probabilities = parts.attention_dropout
        context = kernels.attention(tf.matmul(rows, w.qkv_kernel), w.qkv_bias, mask,
                                    seed(probabilities), w.heads, rate(probabilities))
        rows = _fused_norm(parts.attention_norm, parts.attention_output_dropout,
                           tf.matmul(context, w.output_kernel), w.output_bias, rows, seed, rate)
        hidden = kernels.bias_gelu(tf.matmul(rows, w.intermediate_kernel), w.intermediate_bias,
                                   approximate=self.hidden_activation == "gelu_approximate")
        return _fused_norm(parts.feedforward_norm, parts.feedforward_dropout,
                           tf.matmul(hidden, w.feedforward_kernel), w.feedforward_bias, rows,
                           seed, rate)

    @property
    def encoder_config(self) -> EncoderConfig:
        """This encoder's architecture as an `EncoderConfig`."""
        values = self.get_config()
        for key in ("name", "trainable", "dtype"):
            values.pop(key)
        return EncoderConfig(**values)


def _fusable(parts: "TransformerParts", activation: str) -> bool:
    """Whether `LeallaEncoder._fused_layer` computes this layer as it is built:
    a GELU feed-forward block, plain layer norms, dropout without a noise shape."""
    norms = (parts.attention_norm, parts.feedforward_norm)
    dropouts = (parts.attention_dropout, parts.attention_output_dropout,
                parts.feedforward_dropout)
    return (activation in ("gelu", "gelu_approximate")
            and all(_plain_norm(norm) for norm in norms)
            and all(dropout.noise_shape is None for dropout in dropouts))


def _plain_norm(layer) -> bool:
    return (not layer.rms_scaling and layer.center and layer.scale
            and layer.axis in (-1, [-1]))


def _fused_norm(norm, dropout, x, bias, residual, seed, rate):
    """`norm(dropout(x + bias) + residual)` as one `lealla_tf.models.kernels` op."""
    from lealla_tf.models import kernels

    return kernels.bias_dropout_add_norm(x, bias, residual, norm.gamma, norm.beta,
                                         seed(dropout), rate(dropout), norm.epsilon)


def _activate(activation, x):
    """`activation(x)`, computed in float32 when `x` is bfloat16 (then cast back):
    TensorFlow's bfloat16 elementwise kernels are slower than its float32 ones, so
    GELU forward and backward on 2,048 x 512 took 2.7 ms this way against 4.1 in
    bfloat16 on a Zen 4 (`benchmarks/train_throughput.py --levers`, its last lever),
    and it rounds once instead of at every op."""
    import tensorflow as tf

    if x.dtype != tf.bfloat16:
        return activation(x)
    return tf.cast(activation(tf.cast(x, tf.float32)), x.dtype)


def _layer_norm(layer, x):
    """The Keras `LayerNormalization` `layer` on rows `x` `[n, d]` (Keras' formula,
    as `keras.ops.layer_normalization` computes it: statistics in float32), in
    fewer ops than its own call: 0.80 against 0.96 ms on 4,096 x 128 on 2 cores."""
    import tensorflow as tf

    if not _plain_norm(layer):
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
    seed generator, by `lealla_tf.models.layers.hash_dropout` (the same distribution, a
    mask several times cheaper than Keras' Philox draw)."""
    if not training or layer.rate == 0:
        return x
    if layer.noise_shape is not None:
        return layer(x, training=training)
    return hash_dropout.dropout(x, layer.rate, layer.seed_generator.next())


class _LayerWeights(NamedTuple):
    """One transformer layer's weights as `LeallaEncoder._forward` uses them:
    kernels in the compute dtype, biases in float32 (the fused ops add them in
    float32; the op-by-op layer casts them as the Keras layers would)."""

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
    parts: "TransformerParts"


def _layer_weights(layer, compute) -> _LayerWeights:
    """A keras-hub TransformerEncoder's weights for `LeallaEncoder._forward`: the
    attention's query, key and value kernels side by side `[d, 3 * inner]` (the
    query's scaled by 1/sqrt(head size), as Keras scales the projected query)
    and their biases, its output projection, and the feed-forward block."""
    import tensorflow as tf

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

    return _LayerWeights(
        cast(kernel), bias, cast(tf.reshape(parts.attention_output_dense.kernel, [inner, width])),
        float32(parts.attention_output_dense.bias), cast(intermediate.kernel),
        float32(intermediate.bias), cast(output.kernel), float32(output.bias), heads, head_size,
        parts)


# The keras-hub TransformerEncoder internals the hand-written forward pass reads
# (keras-hub has no public accessors for them): {our name: attribute path}. Read
# here and nowhere else, so that a keras-hub release that renames one fails in
# `transformer_parts` with words, and tests/models/test_encoder.py fails with them.
KERAS_HUB_PARTS = {
    "attention": "_self_attention_layer",
    "heads": "_self_attention_layer._num_heads",
    "head_size": "_self_attention_layer._key_dim",
    "query_dense": "_self_attention_layer._query_dense",
    "key_dense": "_self_attention_layer._key_dense",
    "value_dense": "_self_attention_layer._value_dense",
    "attention_output_dense": "_self_attention_layer._output_dense",
    "attention_dropout": "_self_attention_layer._dropout_layer",
    "attention_norm": "_self_attention_layer_norm",
    "attention_output_dropout": "_self_attention_dropout",
    "intermediate_dense": "_feedforward_intermediate_dense",
    "output_dense": "_feedforward_output_dense",
    "feedforward_norm": "_feedforward_layer_norm",
    "feedforward_dropout": "_feedforward_dropout",
}


class TransformerParts(NamedTuple):
    """The sublayers of one keras-hub TransformerEncoder (`KERAS_HUB_PARTS`)."""

    attention: object
    heads: int
    head_size: int
    query_dense: object
    key_dense: object
    value_dense: object
    attention_output_dense: object
    attention_dropout: object
    attention_norm: object
    attention_output_dropout: object
    intermediate_dense: object
    output_dense: object
    feedforward_norm: object
    feedforward_dropout: object


def transformer_parts(layer) -> TransformerParts:
    """`layer`'s sublayers as `LeallaEncoder.forward` uses them.

    Raises:
        RuntimeError: the installed keras-hub builds its TransformerEncoder
            otherwise (an attribute in `KERAS_HUB_PARTS` is gone), naming it.
    """
    values = {}
    for name, path in KERAS_HUB_PARTS.items():
        value = layer
        for attribute in path.split("."):
            if not hasattr(value, attribute):
                import keras_hub

                raise RuntimeError(
                    f"keras-hub {keras_hub.__version__} builds TransformerEncoder without "
                    f"`{path}`, which lealla_tf's fused forward pass reads "
                    "(lealla_tf.models.encoder.KERAS_HUB_PARTS); install the keras-hub "
                    "version setup.py pins, or update KERAS_HUB_PARTS to its new name")
            value = getattr(value, attribute)
        values[name] = value
    return TransformerParts(**values)


def build_encoder(config: EncoderConfig, dtype=None, name="lealla_encoder") -> LeallaEncoder:
    """Builds a `LeallaEncoder` from an `EncoderConfig`."""
    return LeallaEncoder(**config_to_dict(config), dtype=dtype, name=name)
