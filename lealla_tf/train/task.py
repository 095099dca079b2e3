"""The distillation task: what one training step computes (the tf-models task/trainer seam).

The task owns the student, the teacher, the heads and the objective's terms
(`lealla_tf.losses.objectives.OBJECTIVES`), builds the input pipeline, and computes one
replica's loss terms and gradients. `lealla_tf.train.trainer.Trainer` runs it: the
optimizer, the loop, checkpoints and logs.

One step, on each replica:
  1. the student embeds both sides of its pairs (L2-normalised, [b, d]);
  2. the teacher's vectors come precomputed with the data, or from the frozen
     teacher encoder run inside the step (its tokenization ran in tf.data, or,
     `--teacher_in_step`, on the student's own tokens: the pass the hd term
     runs, once a side for both);
  3. candidates of the contrastive terms (AMS, logit distillation, MCL) are
     gathered from ALL replicas, with this replica's rows at offset
     replica_id * b, so negatives are the global batch as in LaBSE;
  4. each term is summed over the replica's rows and divided by the global
     batch size; gradients are all-reduced across replicas.

The accelerator step (`jit_compile`, `--jit_compile`; on by default under
TPUStrategy) is what a TPU runs, XLA-compiled: no fused CPU kernels (the
student's and the in-step teacher's layers op by op), no string ops (every
tokenizer runs in tf.data), batches padded to a few fixed lengths
(`lealla_tf.train.data.fixed_lengths`) with every replica's share whole, and a
lookup table's gradient dense (no `tf.unique`, whose shape depends on the
data). With one replica the trainer compiles the whole step, optimizer
included; under TPUStrategy its `run` compiles the whole replica function. With
several replicas on CPUs or GPUs, XLA cannot compile the collectives
(TensorFlow has none for XLA on CPU, and MirroredStrategy's `all_gather` needs a
merge_call), so each replica's step runs as two compiled parts with the
candidates' gather between them: the forward pass with every term that needs
only this replica's rows (the teacher's pass included), then the terms over
the global batch (AMS, logit distillation, MCL); their gradients are compiled
too, and the gradients' all-reduce and the optimizer run between compiled
steps.
"""

import math

import tensorflow as tf

from lealla_tf.configs import TrainConfig
from lealla_tf.losses.objectives import (
    OBJECTIVES,
    TEACHER_LAYERS,
    TermInputs,
    compute_terms,
    parse_objective,
    reads_teacher,
    terms_needing,
)
from lealla_tf.teachers.layers import TeacherLayers
from lealla_tf.teachers.selection import student_pieces
from lealla_tf.teachers.sources import CenteredTeacher, PrecomputedTeacher
from lealla_tf.train.data import fixed_lengths, pair_dataset, tokenize_batches
from lealla_tf.train.distribution import is_tpu_strategy, resolve_jit_compile
from lealla_tf.train.heads import DistillationHeads
from lealla_tf.train.initialization import initialize_token_embeddings, pass_through_layers
from lealla_tf.train.students import build_student


class DistillationTask:
    """Student, teacher, heads and terms of a resolved `TrainConfig`.

    Args:
        config: a config resolved by `lealla_tf.train.resolution.resolve_train_config`.
        strategy: the tf.distribute strategy (student and heads are built in its scope).
        tokenizer: the student's `Tokenizer`.
        teacher: a `lealla_tf.teachers.sources.Teacher`, or None.
        files: the training files (`lealla_tf.train.data.find_training_files`).
        sizes: pairs per language (counted once by the caller), or None.

    Attributes:
        jit_compile: the accelerator step (see the module docstring), from
            `config.jit_compile` and the strategy.
        compiled: XLA compiles that step (default: `jit_compile`); False runs
            the same step op by op, which the tests compare it with.
    """

    def __init__(self, config: TrainConfig, strategy, tokenizer, teacher=None,
                 files: list | None = None, sizes: dict[str, int] | None = None):
        self.config = config
        self.strategy = strategy
        self.tokenizer = tokenizer
        self.teacher = teacher
        self.files = files if files is not None else []
        self.sizes = sizes
        self.terms = parse_objective(config.loss.objective)
        self.weights = {t: float(config.loss.weights[t]) for t in self.terms}
        self.uses_teacher = config.student == "dimension_reduction" or any(
            OBJECTIVES[t].needs_teacher for t in self.terms)
        self.data_info = {}
        with strategy.scope():
            if teacher is not None and config.teacher.center and self.uses_teacher:
                self.teacher = CenteredTeacher(teacher)
            self.student = build_student(config)
            self.heads = DistillationHeads(
                self.terms, self.student.embedding_size, config.teacher_dimension,
                config.teacher.reduction_dir, vocabulary_size=tokenizer.vocab_size,
                num_languages=len([n for n in (sizes or {}).values() if n > 0]),
                special_ids=(tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id),
                teacher_layers=self._teacher_layers())
        # The layers a progressive-depth run inserts late (`Trainer`).
        self.pass_through_layers = frozenset()
        if config.progressive_depth:
            self.pass_through_layers = pass_through_layers(config.encoder.num_layers,
                                                           config.embedding_init_source)
            if not self.pass_through_layers:
                raise ValueError("--progressive_depth: a student no deeper than its teacher "
                                 "starts with no pass-through layers to insert late")
        self.trainable = self.student.trainable_weights + self.heads.trainable_weights
        # The share of the pairs the teacher runs on, and the AMS margin, in the
        # steps traced next (`set_distilled_rows`, `set_margin`; the cooldown's
        # are set by its callback, `lealla_tf.train.cooldown`).
        self.distilled_rows = config.loss.distilled_rows
        self.reads_teacher = any(reads_teacher(t) for t in self.terms)
        self.margin = config.loss.margin
        self.reads_margin = any(OBJECTIVES[t].reads_margin for t in self.terms)
        self.jit_compile = resolve_jit_compile(config.jit_compile, strategy)
        self.compiled = self.jit_compile
        self._segments = {}
        if self.jit_compile:
            self._without_fused_kernels()

    def set_distilled_rows(self, share: float) -> bool:
        """The share of each batch's pairs the teacher runs on from the next
        trace of the step; True when the step computes something else (the
        caller traces it again): the share changed, and a term reads the teacher."""
        changed = share != self.distilled_rows and self.reads_teacher
        self.distilled_rows = share
        return changed

    def set_margin(self, margin: float) -> bool:
        """The AMS term's margin from the next trace of the step; True when the
        step computes something else: the margin changed, and a term reads it."""
        changed = margin != self.margin and self.reads_margin
        self.margin = margin
        return changed

    def forget_traces(self) -> None:
        """Drops the compiled parts of the step (several replicas, `jit_compile`),
        traced with what the task computed then: the trainer calls it when a
        callback changes what the step computes (the layers it skips, the
        teacher's share, the margin)."""
        self._segments = {}

    def _without_fused_kernels(self):
        """The student and the in-step teacher run their layers op by op: XLA
        cannot compile `lealla_tf.models.kernels`' custom CPU ops."""
        base = self.teacher.base if self.teacher is not None else None
        for part in (self.student, self.heads.teacher_layers, getattr(base, "layers", None)):
            if part is not None and getattr(part, "fused_kernels", False):
                part.fused_kernels = False

    def _teacher_layers(self):
        """The hd term's `TeacherLayers`: the in-step teacher's, so that one pass
        serves both, or new ones (None when the objective has no hd term)."""
        if not terms_needing(self.terms, TEACHER_LAYERS):
            return None
        shared = getattr(self.teacher.base, "layers", None) if self.teacher else None
        return shared or build_teacher_layers(self.config, self.tokenizer)

    def initialize_weights(self) -> dict:
        """A fresh run's starting point: `init_from`'s encoder, and/or the teacher's
        token embeddings (`embedding_init`). Returns what was done."""
        done = {}
        if self.config.init_from:
            self.student.initialize_from(self.config.init_from)
            done["init_from"] = self.config.init_from
        if self.config.embedding_init != "random":
            done["embedding_init"] = initialize_token_embeddings(
                self.student.encoder, self.tokenizer, self.config.embedding_init_source,
                self.config.embedding_init)
        if isinstance(self.teacher, CenteredTeacher):
            batches = -(-self.config.teacher.center_pairs // self.config.global_batch_size)
            done["teacher_center"] = self.teacher.estimate_mean(
                self.dataset().take(batches))
        return done

    def checkpoint_objects(self) -> dict:
        """What a checkpoint must hold besides the optimizer and step."""
        extra = ({"teacher_mean": self.teacher.mean}
                 if isinstance(self.teacher, CenteredTeacher) else {})
        return {"heads": self.heads, **self.student.checkpoint_objects(), **extra}

    # === Data ===

    def _precomputed(self) -> PrecomputedTeacher | None:
        base = self.teacher.base if self.teacher is not None else None
        return base if isinstance(base, PrecomputedTeacher) else None

    def dataset(self, input_context: tf.distribute.InputContext | None = None,
                steps_done: int = 0):
        """Tokenized batches for one input pipeline, `steps_done` global batches in."""
        per_replica = (input_context.get_per_replica_batch_size(self.config.global_batch_size)
                       if input_context else self.config.global_batch_size)
        precomputed = self._precomputed()
        pairs, self.data_info = pair_dataset(
            self.config.data, self.config.global_batch_size, steps_done, input_context,
            teacher_dim=precomputed.dimension if precomputed else None, files=self.files,
            sizes=self.sizes, teacher_source=bool(precomputed and precomputed.has_source))
        return tokenize_batches(pairs, per_replica, self.tokenizer,
                                self.teacher if self.uses_teacher else None,
                                self.config.data.length_buckets, steps_done,
                                fixed_lengths(self.config.tokenizer.max_seq_length)
                                if self.jit_compile else (),
                                self.config.data.one_language_batches)

    def distributed_dataset(self, steps_done: int = 0):
        return self.strategy.distribute_datasets_from_function(
            lambda context: self.dataset(context, steps_done))

    # === One step ===

    def loss_terms(self, batch, training: bool = True) -> dict[str, tf.Tensor]:
        """Per-term losses of one replica's batch, each already divided by the
        global batch size (so summing over replicas gives the batch mean).

        Two parts: the forward pass with the terms of this replica's rows, then
        the terms over the global batch, whose candidates (`GATHERED`) are
        gathered between them (see the module docstring)."""
        replica = tf.distribute.get_replica_context()
        replicas = self.strategy.num_replicas_in_sync
        local = tf.shape(batch["source"]["input_word_ids"])[0]
        offset = tf.cast(replica.replica_id_in_sync_group, tf.int32) * local if replicas > 1 else 0
        vectors, terms = self._segment("local", self._local_terms)(batch, training)
        if any(OBJECTIVES[t].gathers for t in self.terms):
            candidates = {name: replica.all_gather(value, axis=0) if replicas > 1 else value
                          for name, value in vectors.items()
                          if name in GATHERED and value is not None}
            terms.update(self._segment("global", self._global_terms)(
                batch, vectors, candidates, offset))
        return {t: terms[t] for t in self.terms}

    def _segment(self, name: str, function):
        """`function` XLA-compiled when the step is compiled in parts (several
        replicas outside a TPU: see the module docstring), else itself."""
        if not (self.compiled and self.strategy.num_replicas_in_sync > 1
                and not is_tpu_strategy(self.strategy)):
            return function
        if name not in self._segments:
            self._segments[name] = tf.function(function, jit_compile=True)
        return self._segments[name]

    def _term_inputs(self, batch, vectors, hidden=(None, None), gather=None, offset=0):
        loss = self.config.loss
        return TermInputs(
            student_source=vectors["student_source"], student_target=vectors["student_target"],
            pooled_source=vectors["pooled_source"], pooled_target=vectors["pooled_target"],
            teacher_source=vectors["teacher_source"], teacher_target=vectors["teacher_target"],
            gather=gather or _not_gathered, offset=offset, heads=self.heads, scale=loss.scale,
            margin=self.margin, temperature=loss.temperature, batch=batch,
            hidden_source=hidden[0], hidden_target=hidden[1])

    def _local_terms(self, batch, training):
        """The forward pass (student, teacher) and the terms that need only this
        replica's rows: (the vectors of `TermInputs`, {term: loss}). With
        `distilled_rows` below 1 the teacher runs on the batch's first rows
        only, and the terms that read it see those rows (`_distilled_part`)."""
        teacher_batch = self._distilled_batch(batch)
        teacher_vectors = (None, None)
        if self.uses_teacher:
            teacher_vectors = self.teacher.vectors(teacher_batch)
        outputs = self.student(batch, teacher_vectors, training=training)
        vectors = {"student_source": outputs.source, "student_target": outputs.target,
                   "pooled_source": outputs.pooled_source,
                   "pooled_target": outputs.pooled_target,
                   "teacher_source": teacher_vectors[0], "teacher_target": teacher_vectors[1]}
        local = [t for t in self.terms if not OBJECTIVES[t].gathers]
        hidden = (outputs.hidden_source, outputs.hidden_target)
        if teacher_batch is batch:
            inputs = self._term_inputs(batch, vectors, hidden)
            return vectors, compute_terms(local, inputs, self.config.global_batch_size)
        rows = _rows(teacher_batch)
        vectors.update({f"{name}_distilled": _first(vectors[name], rows)
                        for name in DISTILLED_GATHERED})
        part = self._distilled_part(vectors)
        terms = compute_terms([t for t in local if not reads_teacher(t)],
                              self._term_inputs(batch, vectors, hidden),
                              self.config.global_batch_size)
        terms.update(compute_terms(
            [t for t in local if reads_teacher(t)],
            self._term_inputs(teacher_batch, part, tuple(
                None if h is None else [_first(x, rows) for x in h] for h in hidden)),
            self._distilled_batch_size()))
        return vectors, terms

    def _distilled_batch(self, batch):
        """The rows the teacher runs on: the whole batch, or its first
        `distilled_rows` share (at least one row) when some term reads the teacher."""
        share = self.distilled_rows
        if share >= 1 or not self.reads_teacher:
            return batch
        size = tf.shape(batch["source"]["input_word_ids"])[0]
        rows = tf.maximum(1, tf.cast(tf.math.ceil(share * tf.cast(size, tf.float32)), tf.int32))
        return {side: ({name: value[:rows] for name, value in features.items()}
                       if side in ("source", "target") else features)
                for side, features in batch.items()}

    def _distilled_batch_size(self):
        """The global batch of the distilled rows, which their terms average over."""
        share = self.distilled_rows
        replicas = self.strategy.num_replicas_in_sync
        per_replica = self.config.global_batch_size // replicas
        return replicas * max(1, math.ceil(share * per_replica - 1e-9))

    @staticmethod
    def _distilled_part(vectors):
        """`vectors` with the distilled rows' student vectors under the plain names
        (the teacher's already cover only those rows)."""
        part = dict(vectors)
        part.update({name: vectors[f"{name}_distilled"] for name in DISTILLED_GATHERED
                     if vectors.get(f"{name}_distilled") is not None})
        return part

    def _global_terms(self, batch, vectors, candidates, offset):
        """The terms over the global batch, given this replica's `vectors`, the
        global batch's `candidates` of them and this replica's `offset` there."""
        known = {vectors[name].ref(): value for name, value in candidates.items()}

        def gather(x):
            if x.ref() not in known:
                raise ValueError(f"a term gathers a tensor other than {GATHERED}: add it there")
            return known[x.ref()]

        gathered = [t for t in self.terms if OBJECTIVES[t].gathers]
        if "student_source_distilled" not in vectors:
            inputs = self._term_inputs(batch, vectors, gather=gather, offset=offset)
            return compute_terms(gathered, inputs, self.config.global_batch_size)
        terms = compute_terms([t for t in gathered if not reads_teacher(t)],
                              self._term_inputs(batch, vectors, gather=gather, offset=offset),
                              self.config.global_batch_size)
        local = tf.shape(batch["source"]["input_word_ids"])[0]
        rows = tf.shape(vectors["student_source_distilled"])[0]
        terms.update(compute_terms(
            [t for t in gathered if reads_teacher(t)],
            self._term_inputs(batch, self._distilled_part(vectors), gather=gather,
                              offset=offset // local * rows),
            self._distilled_batch_size()))
        return terms

    def replica_gradients(self, batch):
        """(terms, weighted total, gradients) on one replica; the gradients are
        already summed over all replicas (so every replica holds the global
        batch's gradient), and not yet clipped.

        A lookup table's gradient (`tf.IndexedSlices`) stays sparse on one
        replica, one row per distinct id (so its norm is the dense gradient's):
        densified, lealla_small's 501k-row table alone is 256 MB a step to
        write, measure and scale. Across replicas every gradient is dense for
        the all-reduce, and in the accelerator step (`jit_compile`) on one
        replica too."""
        with tf.GradientTape() as tape:
            terms = self.loss_terms(batch, training=True)
            total = tf.add_n([self.weights[t] * terms[t] for t in self.terms])
        # None for the weights of layers the step skips (progressive depth):
        # the trainer leaves them as they are.
        gradients = tape.gradient(total, self.trainable)
        if self.strategy.num_replicas_in_sync > 1 or self.jit_compile:
            gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                         for g in gradients]
        if self.strategy.num_replicas_in_sync > 1:
            reduced = iter(tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [g for g in gradients if g is not None]))
            gradients = [None if g is None else next(reduced) for g in gradients]
        else:
            gradients = [unique_rows(g) if isinstance(g, tf.IndexedSlices) else g
                         for g in gradients]
        return terms, total, gradients

    def embed_function(self):
        """strings -> student embeddings for dev evaluation (None when it cannot)."""
        return self.student.embed_function(self.tokenizer, self.teacher)


# The student's vectors that the terms reading the teacher see on the distilled
# rows only (`LossConfig.distilled_rows`), under these names + "_distilled".
DISTILLED_GATHERED = ("student_source", "student_target", "pooled_source", "pooled_target")
# The `TermInputs` vectors a term over the global batch may gather across replicas.
GATHERED = ("student_source", "student_target", "teacher_source", "teacher_target",
            "student_source_distilled", "student_target_distilled")


def _rows(batch):
    return tf.shape(batch["source"]["input_word_ids"])[0]


def _first(x, rows):
    """The first `rows` rows of `x` (None stays None)."""
    return None if x is None else x[:rows]


def _not_gathered(_):
    raise ValueError("a term that gathers across replicas must say so in its objectives "
                     "row (`gathers=True`)")


def unique_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """The same sparse gradient with one row per distinct index (duplicates summed)."""
    indices, positions = tf.unique(slices.indices)
    values = tf.math.unsorted_segment_sum(slices.values, positions, tf.shape(indices)[0])
    return tf.IndexedSlices(values, indices, slices.dense_shape)


def scale_gradient(gradient, factor):
    """`gradient * factor` for a dense tensor or a `tf.IndexedSlices`."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * factor, gradient.indices,
                                gradient.dense_shape)
    return gradient * factor


def build_teacher_layers(config: TrainConfig, tokenizer):
    """The frozen teacher's layer outputs on the student's tokens
    (`lealla_tf.teachers.layers.TeacherLayers`), from `embedding_init_source` (or the
    teacher's path); None without a teacher directory or an encoder student.
    ValueError when the student's vocabulary is not the teacher's pieces."""
    source = config.embedding_init_source or config.teacher.path
    if not source or config.student != "encoder":
        return None
    if tokenizer.kind != "sentencepiece":
        raise ValueError(
            "the hd objective and --teacher_in_step run the teacher on the student's tokens: "
            "the student must tokenize with the teacher's SentencePiece vocabulary or a pruned "
            "copy of it (the main job's runs/recipe/vocab.model, from "
            "lealla_tf.tokenizers.pruning), not a WordPiece vocabulary")
    encoder = config.encoder
    return TeacherLayers(source, student_pieces(tokenizer), encoder.hidden_dim,
                         encoder.num_layers, config.tokenizer.max_seq_length)
