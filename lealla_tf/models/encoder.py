"""The sentence encoder: a BERT-style transformer built from keras-hub layers.

`LeallaEncoder` is the Keras model (its layers, its functional graph, its
config); `LeallaEncoder.forward` computes the same outputs with fewer ops, by
`lealla_tf.models.forward_pass`.
"""

from collections.abc import Collection

import keras
from keras_hub.layers import PositionEmbedding, TransformerEncoder

from lealla_tf.configs import EncoderConfig, config_to_dict
from lealla_tf.models import forward_pass
from lealla_tf.models.layers import L2Normalization, MaskedMeanPooling


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
        pooled_output, embedding = self.pool(x, mask)
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

    def pool(self, sequence_output, mask):
        """The last layer `[b, t, d]` -> (pooled_output, the embedding before
        normalisation): [CLS] -> dense -> tanh (or the masked mean), then the
        optional output projection."""
        if self.pooled_dense is not None:
            pooled_output = self.pooled_dense(sequence_output[:, 0, :])
        else:
            pooled_output = self.mean_pooling(sequence_output, mask)
        if self.output_dense is not None:
            return pooled_output, self.output_dense(pooled_output)
        return pooled_output, pooled_output

    def forward(self, inputs, training=False, parts: int | None = None,
                fused_kernels: bool = False, skipped_layers: Collection[int] = ()) -> dict:
        """The outputs of `self(inputs, training=training)`, computed with fewer,
        larger ops by `lealla_tf.models.forward_pass` (TensorFlow backend, float32
        or bfloat16; otherwise the Keras call).

        Args:
            inputs: the dict the Keras call takes.
            training: dropout on (the layers' rates and seed generators).
            parts: an inference batch runs as this many independent parts
                (default `forward_pass.INFERENCE_PARTS`); 1 where the graph
                runs one op at a time (a TFLite or ONNX conversion).
            fused_kernels: run the layers with `lealla_tf.models.kernels`' fused
                ops (the students' training step on a CPU, when
                `kernels.usable()`); exports never do.
            skipped_layers: indices of layers that hand their input on (a
                progressive-depth run's pass-through layers before they are
                inserted); exports skip none.

        Returns: the Keras call's dict of outputs.
        """
        return forward_pass.forward(self, inputs, training, parts, fused_kernels, skipped_layers)

    def forward_batches(self, batches: list, training=False, fused_kernels: bool = False,
                        skipped_layers: Collection[int] = ()) -> list:
        """`forward` (without parts) of each batch in `batches`, the weights packed
        and cast to the compute dtype once for all of them: a pair's two sides in
        the students' training step, the parts of an inference batch."""
        return forward_pass.forward_batches(self, batches, training, fused_kernels,
                                            skipped_layers)

    @property
    def encoder_config(self) -> EncoderConfig:
        """This encoder's architecture as an `EncoderConfig`."""
        values = self.get_config()
        for key in ("name", "trainable", "dtype"):
            values.pop(key)
        return EncoderConfig(**values)


def build_encoder(config: EncoderConfig, dtype=None, name="lealla_encoder") -> LeallaEncoder:
    """Builds a `LeallaEncoder` from an `EncoderConfig`."""
    return LeallaEncoder(**config_to_dict(config), dtype=dtype, name=name)
