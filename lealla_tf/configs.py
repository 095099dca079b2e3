"""Configuration dataclasses.

Every configurable part of lealla_tf is a nested ``@dataclass``; one builder
function turns a config into objects, and the resolved config is written next
to the checkpoints (``model_dir/config.json``) so that export and evaluation
never need the same value passed twice.
"""

import dataclasses
import json
from typing import Any, Optional

HIDDEN_ACTIVATIONS = ("gelu", "gelu_approximate", "relu")
POOLINGS = ("cls", "mean")


@dataclasses.dataclass
class EncoderConfig:
    """Architecture of a BERT-style sentence encoder.

    Args:
        vocabulary_size: int. Rows of the token embedding table; taken from the
            tokenizer when a model is trained.
        num_layers: int. Number of transformer layers applied.
        num_heads: int. Attention heads; must divide `hidden_dim`.
        hidden_dim: int. Transformer width d (also the embedding size unless
            `embedding_dim` is set).
        intermediate_dim: int. Feed-forward width d_ff.
        dropout: float. Dropout rate (embeddings, attention, feed-forward).
        max_sequence_length: int. Rows of the position embedding table.
        num_segments: int. Rows of the segment (type) embedding table.
        embedding_dim: optional int. Embedding bottleneck e (Ding et al. 2022):
            tokens are embedded in e dimensions and projected to d; off (None)
            by default.
        num_unique_layers: optional int. Parameter recurrence (Ding et al.
            2022): only this many distinct transformer layers are built and
            applied in turn, `num_layers / num_unique_layers` times; off (None)
            by default.
        pooling: "cls" (LaBSE: [CLS] -> dense + tanh) or "mean" (masked mean
            of the last layer, as sentence-transformers models do).
        pooler_dim: optional int. Width of the [CLS] pooler (default
            `hidden_dim`); the "distillation-first" variant (LEALLA Appendix C)
            makes it the teacher's width.
        output_dim: optional int. A dense layer from the pooled output to
            this many dimensions gives the embedding (distillation-first: back
            down to d); None for none.
        hidden_activation: "gelu" (exact, HuggingFace checkpoints),
            "gelu_approximate" (tanh form, TensorFlow BERT checkpoints), "relu".
        layer_norm_epsilon: float.
    """

    vocabulary_size: int = 501_153
    num_layers: int = 24
    num_heads: int = 8
    hidden_dim: int = 128
    intermediate_dim: int = 512
    dropout: float = 0.1
    max_sequence_length: int = 512
    num_segments: int = 2
    embedding_dim: Optional[int] = None
    num_unique_layers: Optional[int] = None
    pooling: str = "cls"
    pooler_dim: Optional[int] = None
    output_dim: Optional[int] = None
    hidden_activation: str = "gelu_approximate"
    layer_norm_epsilon: float = 1e-12

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Raises ValueError with a readable message for impossible configs."""
        for name in ("vocabulary_size", "num_layers", "num_heads", "hidden_dim",
                     "intermediate_dim", "max_sequence_length", "num_segments"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"EncoderConfig.{name} must be a positive int, got {value!r}")
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim={self.hidden_dim} is not divisible by num_heads={self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.embedding_dim is not None and self.embedding_dim <= 0:
            raise ValueError(f"embedding_dim must be positive or None, got {self.embedding_dim}")
        if self.num_unique_layers is not None:
            if not 0 < self.num_unique_layers <= self.num_layers or (
                    self.num_layers % self.num_unique_layers):
                raise ValueError(
                    f"num_unique_layers={self.num_unique_layers} must divide "
                    f"num_layers={self.num_layers}")
        for name in ("pooler_dim", "output_dim"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"EncoderConfig.{name} must be a positive int or None, "
                                 f"got {value!r}")
        if self.pooler_dim is not None and self.pooling != "cls":
            raise ValueError("pooler_dim needs pooling='cls' (mean pooling has no pooler)")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.hidden_activation not in HIDDEN_ACTIVATIONS:
            raise ValueError(
                f"hidden_activation must be one of {HIDDEN_ACTIVATIONS}, "
                f"got {self.hidden_activation!r}")

    @property
    def embedding_size(self) -> int:
        """Dimension of the sentence embedding."""
        return self.output_dim or self.pooler_dim or self.hidden_dim

    def replace(self, **changes) -> "EncoderConfig":
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)


def config_to_dict(config: Any) -> dict:
    """A JSON-ready dict of a (nested) config dataclass."""
    return dataclasses.asdict(config)


def config_from_dict(cls, values: dict):
    """Builds dataclass `cls` from a dict, recursing into nested dataclasses.

    Unknown keys raise ValueError, so a typo in a config file is not silently
    ignored.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {unknown}")
    kwargs = {}
    for name, value in values.items():
        field_type = fields[name].type
        if dataclasses.is_dataclass(field_type) and isinstance(value, dict):
            value = config_from_dict(field_type, value)
        kwargs[name] = value
    return cls(**kwargs)


def write_json(path: str, values: dict) -> None:
    """Writes `values` as indented JSON (tf.io.gfile, so gs:// paths work)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(values, indent=2, sort_keys=True) + "\n")


def read_json(path: str) -> dict:
    """Reads a JSON file (tf.io.gfile, so gs:// paths work)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "r") as f:
        return json.loads(f.read())
