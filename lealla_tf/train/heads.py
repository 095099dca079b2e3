"""The heads an objective's terms need; trained with the student, not exported.

The frozen teacher's layer outputs the hd term reads (`TeacherLayers`) are the
teacher's: `lealla_tf.teachers.layers`.
"""

import keras
import tensorflow as tf

from lealla_tf.losses.objectives import (
    OBJECTIVES,
    PROJECTION,
    RECONSTRUCTION,
    REDUCTION,
    TEACHER_LAYERS,
)
from lealla_tf.train.students import load_reduction


class ReconstructionHead(tf.Module):
    """EMS's XTR head (eq. 4-5): the target language's embedding concatenated with
    the sentence embedding, a swish layer, and logits over the vocabulary.

    Languages are numbered as the data pipeline numbers them (`language`);
    English, the other side of every pair, is the last one.
    """

    def __init__(self, embedding_dim: int, vocabulary_size: int, num_languages: int,
                 special_ids=(), language_dim: int = 32):
        super().__init__(name="reconstruction_head")
        width = language_dim + embedding_dim
        self.language_embedding = keras.layers.Embedding(num_languages + 1, language_dim,
                                                         name="target_language_embedding")
        self.language_embedding.build((None,))
        self.hidden = keras.layers.Dense(width, activation="swish", name="reconstruction_hidden")
        self.hidden.build((None, width))
        self.logits = keras.layers.Dense(vocabulary_size, name="reconstruction_logits")
        self.logits.build((None, width))
        self.vocabulary_size = vocabulary_size
        self.special_ids = tuple(int(i) for i in special_ids)
        self.english = num_languages

    def english_ids(self, languages):
        return tf.fill(tf.shape(languages), tf.cast(self.english, languages.dtype))

    def __call__(self, embedding, languages):
        joined = tf.concat([tf.cast(self.language_embedding(languages), embedding.dtype),
                            embedding], axis=-1)
        return self.logits(self.hidden(joined))

    @property
    def trainable_weights(self) -> list:
        return [w for layer in (self.language_embedding, self.hidden, self.logits)
                for w in layer.trainable_weights]


class DistillationHeads(tf.Module):
    """The heads an objective's terms need, from the table's `heads` column:
    `projection` (trainable dense d -> teacher width: fd, mse), `reduction` (the
    fixed teacher -> d dense layer of a dimension-reduction run: syn),
    `reconstruction` (EMS's XTR head: xtr), and `teacher_layers` (the frozen
    teacher's layer outputs: hd; `teacher_layers` is the `TeacherLayers` it reads,
    `lealla_tf.train.task.build_teacher_layers`'s).
    """

    def __init__(self, terms: list[str], embedding_dim: int, teacher_dim: int | None,
                 reduction_dir: str = "", vocabulary_size: int = 0, num_languages: int = 0,
                 special_ids=(), teacher_layers=None):
        super().__init__(name="distillation_heads")
        needed = {head for name in terms for head in OBJECTIVES[name].heads}
        self.projection = None
        self.reduction = None
        self.reconstruction = None
        self.teacher_layers = None
        if TEACHER_LAYERS in needed:
            if teacher_layers is None:
                raise ValueError("the hd objective needs a converted teacher with a "
                                 "SentencePiece vocabulary (--embedding_init_source)")
            self.teacher_layers = teacher_layers
        if RECONSTRUCTION in needed:
            self.reconstruction = ReconstructionHead(embedding_dim, vocabulary_size,
                                                     num_languages, special_ids)
        if PROJECTION in needed:
            self.projection = keras.layers.Dense(teacher_dim, name="feature_projection")
            self.projection.build((None, embedding_dim))
        if REDUCTION in needed:
            if not reduction_dir:
                raise ValueError("the syn objective needs --reduction_dir (a "
                                 "dimension_reduction run)")
            self.reduction = load_reduction(reduction_dir)
            if self.reduction.units != embedding_dim:
                raise ValueError(f"reduction in {reduction_dir} maps to {self.reduction.units} "
                                 f"dimensions, the student has {embedding_dim}")
            self.reduction.trainable = False

    @property
    def trainable_weights(self) -> list:
        return [w for head in (self.projection, self.reconstruction) if head is not None
                for w in head.trainable_weights]
