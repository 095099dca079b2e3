"""Where the teacher's vectors come from: small objects behind one interface.

    teacher.dimension               D, the width of its vectors
    teacher.batch_features(batch)   in tf.data: what the step will need
    teacher.vectors(features)       in the step: (x^t, y^t), unit rows [b, D]

- `HubTeacher`: a frozen LaBSE/2-format module (the converted
  multilingual-e5-small, all-MiniLM-L6-v2, or LaBSE itself). Its preprocessor
  runs in tf.data, its encoder inside the step, so the same code runs on TPU.
- `PrecomputedTeacher`: vectors stored with the pairs (TFRecords written by
  `beam_pipelines/embed_corpus.py --pairs`).
- `InStepTeacher`: the frozen teacher encoder the hd term already runs on the
  student's own tokens (`lealla_tf.teachers.layers.TeacherLayers`); its vectors are that
  pass's mean-pooled last layer, so one teacher pass a side serves hd, fd and ld,
  and no pipeline has to precompute vectors (`--teacher_in_step`).
- `EnglishOnlyTeacher`: wraps either for a monolingual teacher that sees only the
  English side: x^t = y^t = T(en) (Reimers & Gurevych 2020; Ding et al. 2022).
  A multilingual teacher embeds both sides: x^t = T(x), y^t = T(y) (LEALLA eq. 3-4).
- `CenteredTeacher`: wraps any of them and removes the teacher's mean vector,
  u = (v - mu) / ||v - mu||, with mu estimated once from the training data and
  kept in the checkpoint (`--teacher_center`).
"""

import os

import tensorflow as tf

from lealla_tf.configs import TeacherConfig
from lealla_tf.records import (
    PAIR_SOURCE,
    PAIR_TARGET,
    PAIR_TEACHER_SOURCE,
    PAIR_TEACHER_TARGET,
)


def _unit(x):
    return tf.math.l2_normalize(tf.stop_gradient(tf.cast(x, tf.float32)), axis=-1)


def trim_to_longest(inputs):
    """Cuts fixed-length BERT inputs (a LaBSE/2 preprocessor's 128) to the batch's
    longest row: same result, a fraction of the compute."""
    longest = tf.maximum(tf.reduce_max(tf.reduce_sum(tf.cast(inputs["input_mask"], tf.int32),
                                                     axis=1)), 1)
    return {name: tf.cast(value[:, :longest], tf.int32) for name, value in inputs.items()}


class Teacher:
    """The interface (see the module docstring)."""

    dimension: int
    english_only = False
    description = ""

    def batch_features(self, batch: dict) -> dict:
        raise NotImplementedError

    def vectors(self, features: dict):
        raise NotImplementedError

    @property
    def base(self) -> "Teacher":
        """Where the vectors come from, under any wrappers."""
        inner = getattr(self, "inner", None)
        return self if inner is None else inner.base


class HubTeacher(Teacher):
    """A frozen LaBSE/2-format module; its vectors are L2-normalised `default` outputs."""

    def __init__(self, config: TeacherConfig):
        import tensorflow_hub as hub  # noqa: PLC0415 - heavy; only a hub teacher needs it
        import tensorflow_text  # noqa: F401, PLC0415 - heavy; the preprocessor's ops

        encoder = config.encoder or os.path.join(config.path, "encoder")
        preprocessor = config.preprocessor or os.path.join(config.path, "preprocessor")
        for path in (encoder, preprocessor):
            if "://" not in path and not tf.io.gfile.exists(path):
                raise FileNotFoundError(
                    f"teacher module not found: {path} (expected a LaBSE/2-format module; "
                    "build one with export/convert_teacher.py)")
        self.preprocessor = hub.load(preprocessor)
        self.encoder = hub.load(encoder)
        self.dimension = int(self.embed(self.tokenize(tf.constant(["probe"]))).shape[-1])
        self.description = f"hub module {config.path or encoder}"

    def tokenize(self, strings):
        return trim_to_longest(self.preprocessor(strings))

    def embed(self, inputs):
        return _unit(self.encoder(inputs)["default"])

    def batch_features(self, batch):
        return {"teacher_source_inputs": self.tokenize(batch[PAIR_SOURCE]),
                "teacher_target_inputs": self.tokenize(batch[PAIR_TARGET])}

    def vectors(self, features):
        return (self.embed(features["teacher_source_inputs"]),
                self.embed(features["teacher_target_inputs"]))

    def embed_strings(self, strings):
        """strings -> unit teacher vectors (dimension reduction's dev evaluation)."""
        return self.embed(self.tokenize(strings))


class PrecomputedTeacher(Teacher):
    """Vectors stored with the pairs: `teacher_src` (x^t) and `teacher_tgt` (y^t)."""

    def __init__(self, dimension: int, has_source: bool):
        self.dimension = dimension
        self.has_source = has_source
        self.description = f"precomputed {dimension}-d vectors"

    def batch_features(self, batch):
        features = {"teacher_target": batch[PAIR_TEACHER_TARGET]}
        if self.has_source:
            features["teacher_source"] = batch[PAIR_TEACHER_SOURCE]
        return features

    def vectors(self, features):
        return _unit(features["teacher_source"]), _unit(features["teacher_target"])


class InStepTeacher(Teacher):
    """The teacher encoder of `layers` (a `lealla_tf.teachers.layers.TeacherLayers`), run in
    the step on the student's tokens of each side: x^t, y^t are its L2-normalised
    `default` (mean-pooled) outputs. The student's tokens are the teacher's pieces
    (a pruned copy of its vocabulary), without the module's text prefix (e5's
    "query: "), cut at the student's --max_seq_length."""

    def __init__(self, layers):
        self.layers = layers
        self.dimension = layers.vector_width
        self.description = (f"the teacher encoder in the step ({self.dimension}-d, student "
                            "tokens)")

    def batch_features(self, batch):
        return {}  # the step reads the student's own `source` and `target` tokens

    def vectors(self, features):
        return tuple(_unit(self.layers.outputs(features[side])["default"])
                     for side in ("source", "target"))


class EnglishOnlyTeacher(Teacher):
    """A monolingual teacher: only the English side is embedded; x^t = y^t = T(en)."""

    english_only = True

    def __init__(self, inner: Teacher):
        self.inner = inner
        self.dimension = inner.dimension
        self.description = f"{inner.description}, English side only"

    def batch_features(self, batch):
        if isinstance(self.inner, PrecomputedTeacher):
            return {"teacher_target": batch[PAIR_TEACHER_TARGET]}
        return {"teacher_target_inputs": self.inner.tokenize(batch[PAIR_TARGET])}

    def vectors(self, features):
        if isinstance(self.inner, PrecomputedTeacher):
            target = _unit(features["teacher_target"])
        else:
            target = self.inner.embed(features["teacher_target_inputs"])
        return target, target

    def embed_strings(self, strings):
        return self.inner.embed_strings(strings)


class CenteredTeacher(Teacher):
    """Another teacher's vectors, centred: u = (v - mu) / ||v - mu||.

    Sentence encoders trained contrastively are anisotropic: multilingual-e5's
    unit vectors share a long mean vector, so two unrelated sentences are
    nearly as close as two translations. Feature distillation's squared
    distance and logit distillation's cosine matrix then measure mostly that
    shared direction; centring keeps what tells sentences apart (the cosines
    before and after, measured by the retired benchmarks/teacher_anisotropy.py:
    docs/benchmarks.md, "Settings chosen by retired benchmarks").

    `mean` is a non-trainable variable (created in the strategy's scope, saved
    with the checkpoint): `estimate_mean` sets it once on a fresh run from the
    first training batches, so a resumed run and every worker use the same mu.
    """

    def __init__(self, inner: Teacher):
        self.inner = inner
        self.dimension = inner.dimension
        self.english_only = inner.english_only
        self.description = f"{inner.description}, centred"
        self.mean = tf.Variable(tf.zeros([inner.dimension]), trainable=False,
                                name="teacher_mean")
        if hasattr(inner, "embed_strings"):
            self.embed_strings = lambda strings: self.center(inner.embed_strings(strings))

    def center(self, vectors):
        return tf.math.l2_normalize(vectors - self.mean, axis=-1)

    def batch_features(self, batch):
        return self.inner.batch_features(batch)

    def vectors(self, features):
        source, target = self.inner.vectors(features)
        return self.center(source), self.center(target)

    def estimate_mean(self, batches) -> dict:
        """Sets `mean` to the average of both sides' unit vectors over `batches`
        (the task's batch dicts); returns {"pairs": n, "mean_norm": ||mu||}."""
        total, count = tf.zeros([self.dimension]), 0
        for batch in batches:
            source, target = self.inner.vectors(batch)
            total += tf.reduce_sum(source, axis=0) + tf.reduce_sum(target, axis=0)
            count += int(source.shape[0])
        if count == 0:
            raise ValueError("no training pairs to estimate the teacher's mean from")
        self.mean.assign(total / (2 * count))
        return {"pairs": count, "mean_norm": float(tf.norm(self.mean))}


def build_teacher(config: TeacherConfig, precomputed: tuple[int, bool] | None = None,
                  layers=None) -> Teacher | None:
    """The teacher a config gives (None: no teacher).

    `config.in_step` runs the encoder of `layers` (a `TeacherLayers`, which the
    caller builds for it) in the step. Otherwise a hub module wins over
    precomputed vectors, whose layout in the training records is `precomputed`:
    (dimension, has the source side), or None for records without any
    (`lealla_tf.train.data.precomputed_teacher_layout`). Precomputed vectors
    must hold the source side (`teacher_src`) unless `english_only` is set, so
    that a both-side objective never silently trains against zeros.
    """
    if config.in_step:  # its other settings: `lealla_tf.train.resolution.validate_train_config`
        if layers is None:
            raise ValueError("--teacher_in_step runs the converted teacher on the student's "
                             "tokens: it needs --embedding_init_source=<converted teacher with a "
                             "SentencePiece vocabulary> and the student on that vocabulary")
        return InStepTeacher(layers)
    if config.hub:
        teacher = HubTeacher(config)
    else:
        if precomputed is None:
            return None
        dimension, has_source = precomputed
        if not has_source and not config.english_only:
            raise ValueError(
                "the training TFRecords hold teacher vectors of the English side only "
                "(teacher_tgt); pass --teacher_english_only for these targets, or write both "
                "sides with beam_pipelines/embed_corpus.py --pairs (without --english_only)")
        teacher = PrecomputedTeacher(dimension, has_source)
    return EnglishOnlyTeacher(teacher) if config.english_only else teacher
