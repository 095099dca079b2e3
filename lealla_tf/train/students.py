"""What is trained: small objects behind one interface.

    student(batch, teacher_vectors, training) -> StudentOutputs
    student.trainable_weights, student.checkpoint_objects()
    student.embed_function(tokenizer, teacher) -> strings -> unit embeddings (an
      `Embedder` for an encoder), or None

- `EncoderStudent`: a `LeallaEncoder` (every preset, and the recipe's options:
  mean pooling, embedding bottleneck, parameter recurrence, teacher-initialised
  token embeddings).
- `ReductionStudent`: LEALLA Section 3.2's dimension reduction: the frozen
  teacher's vectors through a trainable dense layer to d.
"""

import dataclasses
import os

import keras
import tensorflow as tf

from lealla_tf.configs import TrainConfig, read_json
from lealla_tf.inference.loaders import encoder_embedder
from lealla_tf.models import kernels
from lealla_tf.models.encoder import build_encoder
from lealla_tf.models.model_dir import CONFIG_FILE, encoder_config_of, latest_checkpoint


@dataclasses.dataclass
class StudentOutputs:
    """Unit embeddings `[b, d]` of both sides, the pooled outputs they come from,
    and (encoder students) every layer's output."""

    source: object
    target: object
    pooled_source: object = None
    pooled_target: object = None
    hidden_source: list | None = None
    hidden_target: list | None = None


class EncoderStudent:
    """A `LeallaEncoder` embedding both sides of each pair."""

    kind = "encoder"

    def __init__(self, config: TrainConfig):
        self.config = config.encoder
        self.encoder = build_encoder(
            config.encoder, dtype="mixed_bfloat16" if config.mixed_precision else None)
        self.embedding_size = config.encoder.embedding_size
        # The fused CPU kernels (lealla_tf.models.kernels) where this strategy can run them.
        self.fused_kernels = kernels.usable()
        # Layers that hand their input on in the step and the evaluations (a
        # progressive-depth run's pass-through layers before they are inserted);
        # read when a function is traced.
        self.skipped_layers = frozenset()

    def __call__(self, batch, teacher_vectors=None, training=True) -> StudentOutputs:
        source, target = self.encoder.forward_batches(
            [batch["source"], batch["target"]], training=training,
            fused_kernels=self.fused_kernels, skipped_layers=self.skipped_layers)
        return StudentOutputs(source["sentence_embedding"], target["sentence_embedding"],
                              source["pooled_output"], target["pooled_output"],
                              list(source["encoder_outputs"]), list(target["encoder_outputs"]))

    @property
    def trainable_weights(self) -> list:
        return list(self.encoder.trainable_weights)

    def checkpoint_objects(self) -> dict:
        # Keras keeps dropout's random state outside model.weights; without it a
        # resumed run would draw different dropout masks than an uninterrupted one.
        return {"encoder": self.encoder,
                "dropout_seeds": [v.value for v in self.encoder.variables
                                  if "seed_generator" in v.path]}

    def initialize_from(self, model_dir: str) -> None:
        """Starts from the encoder weights of another model directory, which must have
        this student's architecture: every encoder weight is restored, or none is."""
        source = latest_checkpoint(model_dir)
        if source is None:
            raise FileNotFoundError(f"--init_from={model_dir} has no checkpoint")
        differences = architecture_differences(encoder_config_of(model_dir), self.config)
        if differences:
            raise ValueError(
                f"--init_from={model_dir} is a different architecture: "
                + ", ".join(f"{name} {theirs} there, {ours} here"
                            for name, theirs, ours in differences)
                + "; start from it with the same vocabulary and encoder settings "
                "(--preset, --encoder_overrides=name=value,...)")
        status = tf.train.Checkpoint(encoder=self.encoder).restore(source).expect_partial()
        try:
            status.assert_existing_objects_matched()
        except AssertionError as error:
            raise ValueError(f"--init_from={model_dir}: its checkpoint {source} lacks weights "
                             f"of this encoder ({error})") from None

    def embed_function(self, tokenizer, teacher=None):
        # As an export embeds (`encoder_embedder`): each sentence tokenized once,
        # batches cut to their longest by token length, in the step's kernels.
        return encoder_embedder(self.encoder, tokenizer, "the student",
                                fused_kernels=self.fused_kernels,
                                skipped_layers=self.skipped_layers)


def architecture_differences(theirs, ours) -> list:
    """(field, theirs, ours) for every EncoderConfig field that differs between a
    model `theirs` and a student `ours` starting from it, and that shapes the
    weights or what the encoder computes with them. Dropout may differ; a
    mean-pooled student may start from a [CLS]-pooled model (its pooler unused)."""
    free = {"dropout"}
    if ours.pooling == "mean" and theirs.pooling == "cls" and ours.output_dim is None:
        free |= {"pooling", "pooler_dim", "output_dim"}
    return [(field.name, getattr(theirs, field.name), getattr(ours, field.name))
            for field in dataclasses.fields(ours) if field.name not in free
            and getattr(theirs, field.name) != getattr(ours, field.name)]


class ReductionStudent:
    """LEALLA Section 3.2: a dense layer reducing the frozen teacher's vectors to d."""

    kind = "dimension_reduction"

    def __init__(self, config: TrainConfig):
        self.reduction = keras.layers.Dense(config.encoder.hidden_dim, name="teacher_reduction")
        self.reduction.build((None, config.teacher_dimension))
        self.embedding_size = config.encoder.hidden_dim

    def __call__(self, batch, teacher_vectors=None, training=True) -> StudentOutputs:
        source, target = teacher_vectors
        return StudentOutputs(tf.math.l2_normalize(self.reduction(source), -1),
                              tf.math.l2_normalize(self.reduction(target), -1))

    @property
    def trainable_weights(self) -> list:
        return list(self.reduction.trainable_weights)

    def checkpoint_objects(self) -> dict:
        return {"reduction": self.reduction}

    def initialize_from(self, model_dir: str) -> None:
        raise ValueError("--init_from applies to encoder students, not dimension_reduction")

    def embed_function(self, tokenizer, teacher=None):
        if teacher is None or not hasattr(teacher, "embed_strings"):
            return None  # precomputed vectors: no teacher to embed new sentences

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def embed(strings):
            return tf.math.l2_normalize(self.reduction(teacher.embed_strings(strings)), -1)

        return embed


STUDENT_CLASSES = {cls.kind: cls for cls in (EncoderStudent, ReductionStudent)}


def build_student(config: TrainConfig):
    """The student a resolved config describes (build it inside the strategy's scope)."""
    return STUDENT_CLASSES[config.student](config)


def load_reduction(model_dir: str):
    """The dense teacher -> d layer trained by a `dimension_reduction` run."""
    config = read_json(os.path.join(model_dir, CONFIG_FILE))
    if config.get("student") != ReductionStudent.kind:
        raise ValueError(f"{model_dir} is not a dimension_reduction run")
    layer = keras.layers.Dense(config["encoder"]["hidden_dim"], name="teacher_reduction")
    layer.build((None, config["teacher_dimension"]))
    checkpoint: str | None = latest_checkpoint(model_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"no checkpoint in {model_dir}")
    status = tf.train.Checkpoint(reduction=layer).restore(checkpoint)
    status.expect_partial()
    return layer
