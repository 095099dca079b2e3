"""Distillation training under tf.distribute (library side of `python -m lealla_tf.train`).

One step, on each replica:
  1. the student embeds both sides of its pairs (L2-normalised, [b, d]);
  2. the teacher's vectors come precomputed with the data, or from the frozen
     teacher encoder run inside the step (its tokenization ran in tf.data);
  3. candidates for the contrastive terms (AMS, logit distillation, MCL) are
     gathered from ALL replicas, with this replica's rows at offset
     replica_id * b, so negatives are the global batch as in LaBSE;
  4. each term is summed over the replica's rows and divided by the global
     batch size; gradients are all-reduced, clipped by global norm, applied.

Resuming: the checkpoint holds encoder, heads, optimizer (with its step) and
the step counter; the data stream is a pure function of the seed and skips
the batches already consumed. Kill the process at any moment and rerun the
same command: it continues from the last checkpoint, no step repeated or
skipped.
"""

import dataclasses
import hashlib
import json
import math
import os
import signal
import time
from typing import Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from lealla_tf import losses
from lealla_tf.configs import EncoderConfig, config_from_dict, config_to_dict, read_json
from lealla_tf.data import (DataConfig, find_training_files, pair_dataset,
                            teacher_dimension_of, tokenize_batches)
from lealla_tf.lealla_encoder import build_encoder
from lealla_tf.model_dir import (CHECKPOINT_DIR, CONFIG_FILE, TokenizerConfig,
                                 vocab_file_name, write_model_config)

OBJECTIVE_TERMS = ("ams", "fd", "ld", "df", "syn", "mse", "mcl")
TEACHER_TERMS = frozenset({"fd", "ld", "df", "syn", "mse", "mcl"})
OBJECTIVE_ALIASES = {"lealla": "ams+fd+ld", "reimers": "mse", "ding": "mcl+mse"}
# Settings that may change between a run and its resumption.
RESUMABLE_CHANGES = ("train_steps", "checkpoint_every", "eval_every", "log_every",
                     "time_budget_minutes", "keep_checkpoints", "eval_max_pairs")


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
            targets x^t = y^t = T(en) (Reimers & Gurevych 2020; Ding et al. 2022).
        reduction_dir: model directory of a `dimension_reduction` run, whose
            fixed dense layer reduces the teacher for the "syn" objective.
    """

    path: str = ""
    encoder: str = ""
    preprocessor: str = ""
    english_only: bool = False
    reduction_dir: str = ""

    @property
    def hub(self) -> bool:
        return bool(self.path or self.encoder)


@dataclasses.dataclass
class LossConfig:
    """Which terms, and how they are weighted (LEALLA eq. 5 and the ablations).

    Args:
        objective: "+"-joined terms of {ams, fd, ld, df, syn, mse, mcl}, or an
            alias: lealla = ams+fd+ld (eq. 5), reimers = mse, ding = mcl+mse.
        scale, margin: AMS logit scale and additive margin (LaBSE: 100, 0.3).
        temperature: T of logit distillation (100).
        weights: per-term weights overriding the preset's (alpha for ams,
            beta for fd/df/syn, gamma for ld; 1 for mse and mcl).
    """

    objective: str = "lealla"
    scale: float = 100.0
    margin: float = 0.3
    temperature: float = 100.0
    weights: Dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def terms(self) -> List[str]:
        return parse_objective(self.objective)


@dataclasses.dataclass
class OptimizerConfig:
    """AdamW with linear warmup then linear decay, and global-norm clipping."""

    learning_rate: float = 5e-4
    warmup_steps: int = 1000
    end_learning_rate_fraction: float = 0.0
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs; written resolved to model_dir/config.json."""

    preset: str = "lealla_small"
    encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    teacher: TeacherConfig = dataclasses.field(default_factory=TeacherConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    global_batch_size: int = 64
    train_steps: int = 100_000
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


def parse_objective(objective: str) -> List[str]:
    """["ams", "fd", "ld"] for "ams+fd+ld" or "lealla"; ValueError otherwise."""
    objective = OBJECTIVE_ALIASES.get(objective, objective)
    terms = [t.strip() for t in objective.split("+") if t.strip()]
    unknown = [t for t in terms if t not in OBJECTIVE_TERMS]
    if not terms or unknown:
        raise ValueError(f"objective {objective!r}: unknown terms {unknown}; use '+'-joined "
                         f"terms of {OBJECTIVE_TERMS} or one of {sorted(OBJECTIVE_ALIASES)}")
    if len(set(terms)) != len(terms):
        raise ValueError(f"objective {objective!r} repeats a term")
    return terms


def default_loss_weights(hidden_dim: int) -> Dict[str, float]:
    """The paper's weights: alpha = 1, beta = 1e3 (1e4 for LEALLA-large's 256-d
    and wider), gamma = 1e-2; mse and mcl (other papers) weigh 1."""
    beta = 1e4 if hidden_dim >= 256 else 1e3
    return {"ams": 1.0, "fd": beta, "ld": 1e-2, "df": beta, "syn": beta, "mse": 1.0, "mcl": 1.0}


def default_learning_rate(hidden_dim: int) -> float:
    """Appendix B: 1e-3 for d > 384... wider models, 5e-4 for the thin ones."""
    return 1e-3 if hidden_dim >= 384 else 5e-4


class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak` over `warmup_steps`, then linear decay to
    `end_fraction * peak` at `total_steps`."""

    def __init__(self, peak, warmup_steps, total_steps, end_fraction=0.0):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.end_fraction = float(end_fraction)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(max(self.warmup_steps, 1), tf.float32)
        decay_steps = tf.cast(max(self.total_steps - self.warmup_steps, 1), tf.float32)
        progress = tf.clip_by_value((step - warmup) / decay_steps, 0.0, 1.0)
        decayed = self.peak * (1.0 - (1.0 - self.end_fraction) * progress)
        return tf.where(step < warmup, self.peak * (step + 1.0) / warmup, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "end_fraction": self.end_fraction}


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_resumable(stored: dict, requested: dict) -> None:
    """Raises ValueError listing settings that differ from the stored run's."""
    def flatten(values, prefix=""):
        flat = {}
        for key, value in values.items():
            if isinstance(value, dict) and key != "weights":
                flat.update(flatten(value, f"{prefix}{key}."))
            else:
                flat[prefix + key] = value
        return flat

    old, new = flatten(stored), flatten(requested)
    differences = [f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
                   for key in sorted(set(old) | set(new))
                   if key not in RESUMABLE_CHANGES and key != "tokenizer.vocab_file"
                   and old.get(key) != new.get(key)]
    if differences:
        raise ValueError("model_dir holds a run with different settings; use a new "
                         "--model_dir or the same flags:\n  " + "\n  ".join(differences))


class HubTeacher:
    """A frozen LaBSE/2-format teacher: preprocessor (in tf.data) + encoder (in the step).

    Its vectors are L2-normalised `default` outputs (LaBSE's and
    sentence-transformers' sentence embeddings).
    """

    def __init__(self, config: TeacherConfig):
        import tensorflow_hub as hub
        import tensorflow_text  # noqa: F401  (the preprocessor's ops)

        encoder = config.encoder or os.path.join(config.path, "encoder")
        preprocessor = config.preprocessor or os.path.join(config.path, "preprocessor")
        for path in (encoder, preprocessor):
            if "://" not in path and not tf.io.gfile.exists(path):
                raise FileNotFoundError(
                    f"teacher module not found: {path} (expected a LaBSE/2-format module; "
                    "build one with export/convert_teacher.py)")
        self.preprocessor = hub.load(preprocessor)
        self.encoder = hub.load(encoder)
        probe = self.embed(trim(self.preprocessor(tf.constant(["probe"]))))
        self.dimension = int(probe.shape[-1])

    def embed(self, inputs):
        return tf.math.l2_normalize(
            tf.stop_gradient(tf.cast(self.encoder(inputs)["default"], tf.float32)), axis=-1)


def trim(inputs):
    from lealla_tf.data import trim_to_longest

    return trim_to_longest(inputs)


class DistillationHeads(tf.Module):
    """The trainable f: d -> teacher dimension (fd, mse) and the fixed teacher
    reduction R: teacher dimension -> d (syn). Not part of the exported model."""

    def __init__(self, embedding_dim: int, teacher_dim: Optional[int], terms, reduction_dir: str):
        super().__init__(name="distillation_heads")
        self.projection = None
        self.reduction = None
        if teacher_dim and {"fd", "mse"} & set(terms):
            self.projection = keras.layers.Dense(teacher_dim, name="feature_projection")
            self.projection.build((None, embedding_dim))
        if "syn" in terms:
            if not reduction_dir:
                raise ValueError("the syn objective needs teacher.reduction_dir (a "
                                 "dimension_reduction run)")
            self.reduction = load_reduction(reduction_dir)
            if self.reduction.units != embedding_dim:
                raise ValueError(f"reduction in {reduction_dir} maps to {self.reduction.units} "
                                 f"dimensions, the student has {embedding_dim}")
            self.reduction.trainable = False

    @property
    def trainable_weights(self):
        return list(self.projection.trainable_weights) if self.projection is not None else []


def load_reduction(model_dir: str):
    """The dense teacher -> d layer trained by a `dimension_reduction` run."""
    config = read_json(os.path.join(model_dir, CONFIG_FILE))
    if config.get("preset") != "dimension_reduction":
        raise ValueError(f"{model_dir} is not a dimension_reduction run")
    layer = keras.layers.Dense(config["encoder"]["hidden_dim"], name="teacher_reduction")
    layer.build((None, config["teacher_dimension"]))
    checkpoint = tf.train.latest_checkpoint(os.path.join(model_dir, CHECKPOINT_DIR))
    if checkpoint is None:
        raise FileNotFoundError(f"no checkpoint in {model_dir}")
    status = tf.train.Checkpoint(reduction=layer).restore(checkpoint)
    status.expect_partial()
    return layer


class Trainer:
    """Builds everything for a `TrainConfig` under a strategy and runs the loop.

    Args:
        config: the resolved config.
        model_dir: where config, vocabulary, checkpoints and logs go.
        strategy: a tf.distribute strategy (see `lealla_tf.distribution`).
        vocab_source: the vocabulary file to copy into a new model_dir.
        progress: show a progress bar.
        teacher_dimension: teacher vector size when batches are fed directly
            (benchmarks); otherwise taken from the teacher or the data.
        files: training files already found (default: from the config).
    """

    def __init__(self, config: TrainConfig, model_dir: str, strategy, vocab_source: str,
                 progress: bool = True, teacher_dimension: Optional[int] = None,
                 files=None):
        self.config = config
        self.model_dir = model_dir
        self.strategy = strategy
        self.progress = progress
        self.terms = config.loss.terms
        self.reduction_mode = config.preset == "dimension_reduction"
        if config.global_batch_size % strategy.num_replicas_in_sync:
            raise ValueError(f"global_batch_size {config.global_batch_size} is not divisible "
                             f"by {strategy.num_replicas_in_sync} replicas")
        if config.mixed_precision:
            keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
        # One seed fixes initialisation, dropout and the data order: two runs of
        # the same command train the same model.
        keras.utils.set_random_seed(config.data.seed)
        from lealla_tf.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(vocab_source, max_seq_length=config.tokenizer.max_seq_length,
                                   lower_case=config.tokenizer.lower_case)
        self.files = files if files is not None else find_training_files(config.data.train_data)
        self.teacher = None
        with strategy.scope():
            if config.teacher.hub:
                self.teacher = HubTeacher(config.teacher)
        self.precomputed_dimension = teacher_dimension_of(self.files)
        if self.teacher is not None:
            teacher_dimension = self.teacher.dimension
        elif teacher_dimension is None:
            teacher_dimension = self.precomputed_dimension
        self.teacher_dimension = teacher_dimension
        needs_teacher = TEACHER_TERMS & set(self.terms) or self.reduction_mode
        if needs_teacher and not teacher_dimension:
            raise ValueError(
                f"objective {config.loss.objective!r} needs a teacher: pass --teacher=<LaBSE/2-"
                "format module> or TFRecord training data with precomputed teacher vectors")
        with strategy.scope():
            if self.reduction_mode:
                self.encoder = None
                self.reduction = keras.layers.Dense(config.encoder.hidden_dim,
                                                    name="teacher_reduction")
                self.reduction.build((None, teacher_dimension))
                self.heads = DistillationHeads(config.encoder.hidden_dim, None, [], "")
                trainable = self.reduction.trainable_weights
            else:
                self.encoder = build_encoder(
                    config.encoder, dtype="mixed_bfloat16" if config.mixed_precision else None)
                self.heads = DistillationHeads(config.encoder.embedding_size, teacher_dimension,
                                               self.terms, config.teacher.reduction_dir)
                trainable = self.encoder.trainable_weights + self.heads.trainable_weights
            self.trainable = trainable
            schedule = WarmupLinearDecay(config.optimizer.learning_rate,
                                         config.optimizer.warmup_steps, config.train_steps,
                                         config.optimizer.end_learning_rate_fraction)
            self.optimizer = keras.optimizers.AdamW(
                learning_rate=schedule, weight_decay=config.optimizer.weight_decay,
                beta_1=config.optimizer.beta_1, beta_2=config.optimizer.beta_2,
                epsilon=config.optimizer.epsilon)
            self.optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
            self.optimizer.build(trainable)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        weights = default_loss_weights(config.encoder.hidden_dim)
        weights.update(config.loss.weights)
        self.weights = {term: float(weights[term]) for term in self.terms}
        checkpoint_objects = {"optimizer": self.optimizer, "step": self.step, "heads": self.heads}
        if self.reduction_mode:
            checkpoint_objects["reduction"] = self.reduction
        else:
            checkpoint_objects["encoder"] = self.encoder
            # Keras keeps dropout's random state outside model.weights; without it a
            # resumed run would draw different dropout masks than an uninterrupted one.
            checkpoint_objects["dropout_seeds"] = [
                v.value for v in self.encoder.variables if "seed_generator" in v.path]
        self.checkpoint = tf.train.Checkpoint(**checkpoint_objects)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(model_dir, CHECKPOINT_DIR),
            max_to_keep=config.keep_checkpoints)
        self._vocab_source = vocab_source

    # === Losses ===

    def _teacher_vectors(self, batch):
        if self.teacher is not None:
            target = self.teacher.embed(batch["teacher_target_inputs"])
            source = (target if self.config.teacher.english_only
                      else self.teacher.embed(batch["teacher_source_inputs"]))
        else:
            target = tf.math.l2_normalize(tf.cast(batch["teacher_target"], tf.float32), -1)
            source = (target if self.config.teacher.english_only else
                      tf.math.l2_normalize(tf.cast(batch["teacher_source"], tf.float32), -1))
        return source, target

    def compute_loss_terms(self, batch, training=True):
        """Per-term losses of one replica's batch, each already divided by the
        global batch size (so summing over replicas gives the batch mean)."""
        replica = tf.distribute.get_replica_context()
        replicas = self.strategy.num_replicas_in_sync
        local = tf.shape(batch["source"]["input_word_ids"])[0]
        offset = tf.cast(replica.replica_id_in_sync_group, tf.int32) * local if replicas > 1 else 0

        def gather(x):
            return replica.all_gather(x, axis=0) if replicas > 1 else x

        teacher_source = teacher_target = None
        if self.teacher_dimension and (TEACHER_TERMS & set(self.terms) or self.reduction_mode):
            teacher_source, teacher_target = self._teacher_vectors(batch)
        pooled_source = pooled_target = None
        if self.reduction_mode:
            student_source = tf.math.l2_normalize(self.reduction(teacher_source), -1)
            student_target = tf.math.l2_normalize(self.reduction(teacher_target), -1)
        else:
            source_out = self.encoder(batch["source"], training=training)
            target_out = self.encoder(batch["target"], training=training)
            student_source = source_out["sentence_embedding"]
            student_target = target_out["sentence_embedding"]
            pooled_source = source_out["pooled_output"]
            pooled_target = target_out["pooled_output"]

        loss = self.config.loss
        per_example = {}
        for term in self.terms:
            if term == "ams":
                value = losses.additive_margin_softmax_loss(
                    student_source, student_target, loss.scale, loss.margin,
                    gather(student_source), gather(student_target), offset)
            elif term == "fd":
                value = losses.feature_distillation_loss(
                    teacher_source, teacher_target, self.heads.projection(student_source),
                    self.heads.projection(student_target))
            elif term == "ld":
                value = losses.logit_distillation_loss(
                    teacher_source, teacher_target, student_source, student_target,
                    loss.temperature, gather(teacher_target), gather(student_target))
            elif term == "df":
                value = losses.distillation_first_loss(teacher_source, teacher_target,
                                                       pooled_source, pooled_target)
            elif term == "syn":
                value = losses.synchronized_distillation_loss(
                    self.heads.reduction(teacher_source), self.heads.reduction(teacher_target),
                    student_source, student_target)
            elif term == "mse":
                value = losses.mse_distillation_loss(
                    teacher_target, self.heads.projection(student_target),
                    self.heads.projection(student_source))
            else:  # mcl: English rows i against translation columns j
                value = losses.multilingual_contrastive_loss(
                    teacher_target, student_target, student_source, gather(teacher_target),
                    gather(student_source))
            per_example[term] = tf.reduce_sum(value) / self.config.global_batch_size
        return per_example

    def replica_step(self, batch):
        """One optimisation step on one replica; returns its share of each term."""
        with tf.GradientTape() as tape:
            terms = self.compute_loss_terms(batch, training=True)
            total = tf.add_n([self.weights[t] * terms[t] for t in self.terms])
        gradients = tape.gradient(total, self.trainable)
        replica = tf.distribute.get_replica_context()
        replicas = self.strategy.num_replicas_in_sync
        if replicas > 1:
            gradients = replica.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in gradients]
        norm = tf.linalg.global_norm(gradients)
        if self.config.optimizer.clip_norm > 0:
            gradients, _ = tf.clip_by_global_norm(gradients, self.config.optimizer.clip_norm,
                                                  use_norm=norm)
        # Keras' optimizer SUMs gradients over replicas again: hand it 1/R of the
        # already reduced (and globally clipped) gradient.
        gradients = [g / replicas for g in gradients]
        self.optimizer.apply_gradients(zip(gradients, self.trainable))
        fingerprint = tf.reduce_sum(tf.cast(batch["source"]["input_word_ids"], tf.int64)
                                    * tf.range(1, tf.shape(batch["source"]["input_word_ids"])[1]
                                               + 1, dtype=tf.int64)[None, :])
        result = dict(terms)
        result["total"] = total
        result["gradient_norm"] = norm / replicas
        result["fingerprint"] = tf.cast(fingerprint, tf.float64)
        return result

    # === Data ===

    def distributed_dataset(self, steps_done: int):
        def dataset_fn(input_context):
            per_replica = input_context.get_per_replica_batch_size(self.config.global_batch_size)
            pairs, info = pair_dataset(self.config.data, self.config.global_batch_size,
                                       steps_done, input_context, self.precomputed_dimension,
                                       files=self.files, sizes=self._sizes)
            self.data_info = info
            preprocessor = self.teacher.preprocessor if self.teacher is not None else None
            return tokenize_batches(pairs, per_replica, self.tokenizer, preprocessor,
                                    self.config.teacher.english_only)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    # === Loop ===

    def _write_config(self):
        values = config_to_dict(self.config)
        values["teacher_dimension"] = self.teacher_dimension
        values["encoder"] = config_to_dict(self.config.encoder)
        values.pop("tokenizer")
        write_model_config(self.model_dir, self.config.encoder, self.config.tokenizer,
                           source_vocab_file=self._vocab_source,
                           **{k: v for k, v in values.items() if k not in ("encoder",)})

    def restore_or_initialize(self) -> int:
        """Restores the latest checkpoint (returns its step) or starts at 0."""
        latest = self.manager.latest_checkpoint
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            return int(self.step.numpy())
        if self.config.init_from and self.encoder is not None:
            from lealla_tf.model_dir import latest_checkpoint

            source = latest_checkpoint(self.config.init_from)
            if source is None:
                raise FileNotFoundError(f"--init_from={self.config.init_from} has no checkpoint")
            tf.train.Checkpoint(encoder=self.encoder).restore(source).expect_partial()
        self._write_config()
        return 0

    def embed_fn(self):
        """strings -> student embeddings, for dev evaluation."""
        if self.reduction_mode:
            if self.teacher is None:
                return None

            @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
            def embed_reduced(strings):
                teacher = self.teacher.embed(trim(self.teacher.preprocessor(strings)))
                return tf.math.l2_normalize(self.reduction(teacher), -1)

            return embed_reduced

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def embed(strings):
            return self.encoder(self.tokenizer(strings), training=False)["sentence_embedding"]

        return embed

    def evaluate(self) -> Optional[dict]:
        """Tatoeba P@1 on the dev directory (None when no directory is set)."""
        if not self.config.tatoeba_dir:
            return None
        embed = self.embed_fn()
        if embed is None:
            return None
        from lealla_tf.evaluation import evaluate_tatoeba

        return evaluate_tatoeba(embed, self.config.tatoeba_dir,
                                max_pairs=self.config.eval_max_pairs or None,
                                progress=False)

    def train(self, sizes=None) -> dict:
        """Runs until `train_steps` (or the time budget); returns a summary."""
        from tqdm import tqdm

        from lealla_tf.evaluation import TATOEBA_PRIMARY_METRIC

        config = self.config
        self._sizes = sizes
        steps_done = self.restore_or_initialize()
        start_step = steps_done
        for name in ("train_log.jsonl", "eval_log.jsonl"):
            truncate_log(os.path.join(self.model_dir, name), steps_done)
        dataset = self.distributed_dataset(steps_done)
        iterator = iter(dataset)
        step_fn = tf.function(lambda batch: self.strategy.run(self.replica_step, args=(batch,)),
                              input_signature=[iterator.element_spec])
        writer = tf.summary.create_file_writer(os.path.join(self.model_dir, "logs"))
        train_log = open(os.path.join(self.model_dir, "train_log.jsonl"), "a")
        eval_log = open(os.path.join(self.model_dir, "eval_log.jsonl"), "a")
        stop = {"signal": None}

        def request_stop(signum, _frame):
            stop["signal"] = signal.Signals(signum).name

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        started = time.time()
        budget = config.time_budget_minutes * 60 if config.time_budget_minutes else math.inf
        evaluations = []
        last = {}
        reason = "train_steps reached"
        if config.eval_every and steps_done == 0:
            metrics = self.evaluate()
            if metrics:
                evaluations.append({"step": 0, **metrics})
                eval_log.write(json.dumps({"step": 0, **metrics}) + "\n")
                eval_log.flush()
        bar = tqdm(total=config.train_steps, initial=steps_done, desc="training", unit="step",
                   disable=not self.progress, dynamic_ncols=True)
        window_start, window_steps = time.time(), 0
        try:
            while steps_done < config.train_steps:
                if stop["signal"]:
                    reason = f"stopped by {stop['signal']}"
                    break
                if time.time() - started > budget:
                    reason = f"time budget of {config.time_budget_minutes:g} min reached"
                    break
                results = step_fn(next(iterator))
                reduced = {k: float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None))
                           for k, v in results.items()}
                reduced["total"] = sum(self.weights[t] * reduced[t] for t in self.terms)
                self.step.assign_add(1)
                steps_done += 1
                window_steps += 1
                elapsed = time.time() - window_start
                pairs_per_second = window_steps * config.global_batch_size / max(elapsed, 1e-9)
                learning_rate = float(self.optimizer.learning_rate)
                last = {"step": steps_done, **reduced, "learning_rate": learning_rate,
                        "pairs_per_second": pairs_per_second,
                        "elapsed_seconds": time.time() - started}
                train_log.write(json.dumps(last) + "\n")
                if steps_done % config.log_every == 0 or steps_done == config.train_steps:
                    train_log.flush()
                    with writer.as_default(step=steps_done):
                        for key in list(self.terms) + ["total", "gradient_norm"]:
                            tf.summary.scalar(f"loss/{key}", reduced[key])
                        tf.summary.scalar("learning_rate", learning_rate)
                        tf.summary.scalar("pairs_per_second", pairs_per_second)
                    window_start, window_steps = time.time(), 0
                bar.set_postfix(loss=f"{reduced['total']:.4f}", pairs_s=f"{pairs_per_second:.1f}")
                bar.update(1)
                if steps_done % config.checkpoint_every == 0:
                    train_log.flush()  # the log never runs behind a checkpoint
                    self.manager.save(checkpoint_number=steps_done)
                if config.eval_every and steps_done % config.eval_every == 0:
                    metrics = self.evaluate()
                    if metrics:
                        evaluations.append({"step": steps_done, **metrics})
                        eval_log.write(json.dumps({"step": steps_done, **metrics}) + "\n")
                        eval_log.flush()
                        with writer.as_default(step=steps_done):
                            tf.summary.scalar("tatoeba/average_p_at_1",
                                              metrics[TATOEBA_PRIMARY_METRIC])
                        bar.write(f"step {steps_done}: Tatoeba P@1 "
                                  f"{100 * metrics[TATOEBA_PRIMARY_METRIC]:.2f}")
        finally:
            bar.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            train_log.close()
        if self.manager.latest_checkpoint is None or int(
                self.manager.latest_checkpoint.rsplit("-", 1)[1]) != steps_done:
            self.manager.save(checkpoint_number=steps_done)
        if config.eval_every and steps_done > start_step and (
                not evaluations or evaluations[-1]["step"] != steps_done):
            metrics = self.evaluate()
            if metrics:
                evaluations.append({"step": steps_done, **metrics})
                eval_log.write(json.dumps({"step": steps_done, **metrics}) + "\n")
        eval_log.close()
        writer.flush()
        seconds = time.time() - started
        summary = {"model_dir": self.model_dir, "reason": reason, "start_step": start_step,
                   "final_step": steps_done, "seconds": seconds,
                   "pairs_per_second": (steps_done - start_step) * config.global_batch_size
                   / max(seconds, 1e-9),
                   "last": last, "checkpoint": self.manager.latest_checkpoint,
                   "evaluations": [{"step": e["step"], "p_at_1": e[TATOEBA_PRIMARY_METRIC]}
                                   for e in evaluations],
                   "weights": self.weights, "replicas": self.strategy.num_replicas_in_sync,
                   "data": getattr(self, "data_info", {})}
        with open(os.path.join(self.model_dir, "train_summary.json"), "w") as f:
            json.dump(summary, f, indent=2, default=str)
        return summary


def truncate_log(path: str, last_step: int) -> None:
    """Keeps the rows of a JSON-lines log up to `last_step`.

    After a kill, rows written past the last checkpoint describe steps that
    will be run again; dropping them leaves exactly one row per step.
    """
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [line for line in f if line.strip()]
    kept = []
    for line in rows:
        try:
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
        except (ValueError, KeyError):
            continue  # a line cut short by the kill
    with open(path, "w") as f:
        f.writelines(kept)


def format_summary(summary: dict) -> str:
    """The one-screen summary printed at the end of a run."""
    last = summary.get("last", {})
    lines = [
        "=" * 72,
        f"training {summary['reason']}: steps {summary['start_step']} -> {summary['final_step']}"
        f" in {summary['seconds'] / 60:.1f} min ({summary['pairs_per_second']:.1f} pairs/s, "
        f"{summary['replicas']} replica(s))",
    ]
    if last:
        terms = ", ".join(f"{t}={last[t]:.4g} (x{w:g})" for t, w in summary["weights"].items())
        lines.append(f"last step: total {last['total']:.4f}; {terms}")
    if summary["evaluations"]:
        curve = "  ".join(f"{e['step']}:{100 * e['p_at_1']:.2f}" for e in summary["evaluations"])
        lines.append(f"Tatoeba dev P@1 by step: {curve}")
    lines.append(f"checkpoint: {summary['checkpoint']}")
    lines.append(f"logs: {os.path.join(summary['model_dir'], 'logs')} (TensorBoard), "
                 "train_log.jsonl, eval_log.jsonl, train_summary.json")
    lines.append("=" * 72)
    return "\n".join(lines)
