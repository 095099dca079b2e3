"""The trainer: runs a `DistillationTask`'s steps and checkpoints (nothing else:
the logs, a plan, progressive depth, the cooldown's teacher share and margin, and
the dev evaluations are callbacks, `lealla_tf.train.callbacks`).

The optimizer is AdamW (`lealla_tf.train.optimizers.FusedAdamW`: Keras' AdamW, one
fused kernel a variable) with linear warmup and decay; gradients (already summed
over replicas by the task; a lookup table's sparse on one replica) are clipped by
their GLOBAL norm and applied.

Resuming: the checkpoint holds student, heads, optimizer (with its step), the
step counter and dropout's random state; the data stream is a pure function of
the seed and skips the batches already consumed. Kill the process at any moment
and rerun the same command: it continues from the last checkpoint, no step
repeated or skipped.

With `--jit_compile` (the task's `jit_compile`) the step is XLA-compiled as a
TPU runs it: on one replica the whole step, optimizer included, is one compiled
function; under TPUStrategy `strategy.run` compiles the replica function whole;
with several CPU or GPU replicas the task compiles each replica's step in parts
around the collectives (`lealla_tf.train.task`). An op XLA cannot compile stops
the run with one line naming it and the flag that avoids it
(`CompileError`).

Across worker processes (MultiWorkerMirroredStrategy) every worker runs this
same loop: the chief writes model_dir; the others restore from the chief's
checkpoints in model_dir, write their own checkpoints and logs to a temporary
directory (removed at the end), and all stop at the same step.
"""

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence

import tensorflow as tf

from lealla_tf.configs import TrainConfig
from lealla_tf.evaluation.tatoeba import TATOEBA_MEAN_COSINE, TATOEBA_PRIMARY_METRIC
from lealla_tf.models.model_dir import CHECKPOINT_DIR
from lealla_tf.train.callbacks import Callback, RunState
from lealla_tf.train.cooldown import Cooldown
from lealla_tf.train.depth import ProgressiveDepth
from lealla_tf.train.dev_evaluation import DevEvaluation
from lealla_tf.train.distribution import any_worker, is_tpu_strategy, worker_role
from lealla_tf.train.logs import ProgressLog, RunLogs, collapse_check
from lealla_tf.train.optimizers import FusedAdamW
from lealla_tf.train.planning import Planning
from lealla_tf.train.schedules import WarmupLinearDecay
from lealla_tf.train.task import scale_gradient


class CompileError(ValueError):
    """XLA could not compile the training step (`--jit_compile`); the message
    names the op and the flag that avoids it."""


# Ops that cannot be in a compiled step, by family: the flag or change that keeps them out.
_STRING_OP = re.compile(r"String|Regex|Unicode|Wordpiece|WordPiece|Sentencepiece|SentencePiece|"
                        r"CaseFold|Normalize|Tokenize|AsString|Substr|DecodeJSON")
_XLA_ERROR = re.compile(r"tf2xla conversion failed|Detected unsupported operations|"
                        r"XLA compilation|must be a compile-time constant|XLA_\w+_JIT")


def compile_error(error: Exception) -> CompileError | None:
    """A one-line `CompileError` for XLA's error compiling the step (None when
    `error` is something else): the op, what it is, and the flag that avoids it."""
    message = getattr(error, "message", None) or str(error)
    if not _XLA_ERROR.search(message):
        return None
    unsupported = re.search(r"on (XLA_\w+_JIT): (\w+)", message)
    node = re.search(r"Detected at node '?([\w/.-]+)", message)
    op = unsupported.group(2) if unsupported else (node.group(1) if node else "an op")
    reason = next((line.strip() for line in message.splitlines()
                   if line.strip() and not line.startswith(("Graph execution error",
                                                             "Detected at node", "<stack"))),
                  "")[:160]
    if op.startswith("Lealla"):
        cause = ("a fused CPU kernel of lealla_tf.models.kernels; LEALLA_TF_FUSED_KERNELS=0 "
                 "keeps them out")
    elif _STRING_OP.search(op):
        cause = ("a string op: tokenization belongs in tf.data; a teacher module that "
                 "tokenizes inside its encoder cannot compile, so precompute its vectors or "
                 "use --teacher_in_step")
    else:
        cause = f"XLA says: {reason}" if reason else "XLA cannot compile it"
    return CompileError(f"--jit_compile: the training step has {op}, which XLA cannot "
                        f"compile ({cause}); run without it: --jit_compile=false")


@contextlib.contextmanager
def stop_requests():
    """SIGINT and SIGTERM, while in the block, ask the loop to stop before its
    next step (the yielded dict's "signal" names the signal) rather than kill it
    mid-step; the previous handlers come back after."""
    stop = {"signal": None}

    def request_stop(signum, _frame):
        stop["signal"] = signal.Signals(signum).name

    with contextlib.ExitStack() as handlers:
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers.callback(signal.signal, signum, signal.signal(signum, request_stop))
        yield stop


class Trainer:
    """Runs a task until `train_steps` (or its time budget, or a signal).

    Args:
        task: a `lealla_tf.train.task.DistillationTask`.
        model_dir: where checkpoints and logs go (the config is already there).
            Workers other than the chief only read it and write to `write_dir`,
            a temporary directory.
        progress: show a progress bar.
    """

    def __init__(self, task, model_dir: str, progress: bool = True):
        self.task = task
        self.config = config = task.config
        self.strategy = task.strategy
        self.model_dir = model_dir
        self.progress = progress
        self.role = worker_role(self.strategy)
        self.write_dir = model_dir if self.role.chief else tempfile.mkdtemp(
            prefix=f"lealla_{self.role.name}_")
        optimizer = config.optimizer
        with self.strategy.scope():
            # A variable, so that a run planning its own length (train(planner=))
            # can set it after the step is traced.
            self.total_steps = tf.Variable(config.train_steps, dtype=tf.int64, trainable=False,
                                           name="total_steps")
            schedule = WarmupLinearDecay(optimizer.learning_rate, optimizer.warmup_steps,
                                         self.total_steps, optimizer.end_learning_rate_fraction,
                                         optimizer.decay_fraction)
            self.optimizer = FusedAdamW(
                learning_rate=schedule, weight_decay=optimizer.weight_decay,
                beta_1=optimizer.beta_1, beta_2=optimizer.beta_2, epsilon=optimizer.epsilon)
            self.optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
            self.optimizer.build(task.trainable)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="train_step")
        self.checkpoint = tf.train.Checkpoint(optimizer=self.optimizer, step=self.step,
                                              **task.checkpoint_objects())
        # Every worker saves (saving may take part in collectives), each to its own
        # directory; all of them restore from the chief's.
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(self.write_dir, CHECKPOINT_DIR),
            max_to_keep=config.keep_checkpoints)
        self.initialization = {}

    # === One step ===

    def replica_step(self, batch):
        """One optimisation step on one replica; returns its share of each term."""
        terms, total, gradients = self.task.replica_gradients(batch)
        replicas = self.strategy.num_replicas_in_sync
        norm = tf.linalg.global_norm(gradients)
        if self.config.optimizer.clip_norm > 0:
            gradients, _ = tf.clip_by_global_norm(gradients, self.config.optimizer.clip_norm,
                                                  use_norm=norm)
        # Keras' optimizer SUMs gradients over replicas again: hand it 1/R of the
        # already reduced (and globally clipped) gradient.
        # A weight without a gradient (a layer the step skips) is left as it is.
        self.optimizer.apply_gradients([(scale_gradient(g, 1.0 / replicas), v) for g, v
                                        in zip(gradients, self.task.trainable) if g is not None])
        ids = batch["source"]["input_word_ids"]
        fingerprint = tf.reduce_sum(tf.cast(ids, tf.int64) * tf.range(
            1, tf.shape(ids)[1] + 1, dtype=tf.int64)[None, :])
        result = dict(terms)
        result["total"] = total
        result["gradient_norm"] = norm / replicas
        # A TPU has no float64: the compiled step keeps the (exact) integer.
        result["fingerprint"] = (fingerprint if self.task.jit_compile
                                 else tf.cast(fingerprint, tf.float64))
        return result

    def step_function(self, element_spec):
        """The step on a distributed batch: `strategy.run` of `replica_step`,
        traced once; the replica's step XLA-compiled whole when the task's step
        is `compiled` on one replica (several: the task compiles its parts;
        TPUStrategy compiles it whole itself)."""
        replica_step = self.replica_step
        if (self.task.compiled and self.strategy.num_replicas_in_sync == 1
                and not is_tpu_strategy(self.strategy)):
            replica_step = tf.function(self.replica_step, jit_compile=True)
        return tf.function(lambda batch: self.strategy.run(replica_step, args=(batch,)),
                           input_signature=[element_spec])

    # === State ===

    def restore_or_initialize(self) -> int:
        """Restores the latest checkpoint (returns its step) or starts at 0.

        Folders a kill left half-written (`ckpt-N_temp*`) are removed first (by
        the chief). Every worker restores the chief's latest checkpoint.
        """
        directory = os.path.join(self.model_dir, CHECKPOINT_DIR)
        if self.role.chief and os.path.isdir(directory):
            for name in os.listdir(directory):
                if "_temp" in name and os.path.isdir(os.path.join(directory, name)):
                    shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
        latest = (self.manager.latest_checkpoint if self.role.chief
                  else tf.train.latest_checkpoint(directory))
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            return int(self.step.numpy())
        self.initialization = self.task.initialize_weights()
        return 0

    # === Loop ===

    def train(self, planner: Callable[[dict], dict | None] | None = None,
              callbacks: Sequence[Callback] = ()) -> dict:
        """Runs until `train_steps` (or the time budget, or SIGINT / SIGTERM) and
        returns the summary. The loop runs steps and saves checkpoints; the logs,
        the plan (`planner`, see `lealla_tf.train.planning`), progressive depth,
        the cooldown's teacher share and margin, and the dev evaluations are its
        callbacks (`lealla_tf.train.callbacks`), then `callbacks`."""
        if planner is not None and self.role.workers > 1:
            raise ValueError("a run planning its own length runs in one process; give "
                             "worker processes a fixed --train_steps")
        steps_done = self.restore_or_initialize()
        self.logs = RunLogs.resume(self.write_dir, steps_done)
        self.progress_log, self.depth = ProgressLog(self.progress), ProgressiveDepth()
        self.cooldown, self.evaluation = Cooldown(), DevEvaluation()
        self.callbacks = [self.progress_log, Planning(planner), self.depth, self.cooldown,
                          self.evaluation, *callbacks]
        iterator = iter(self.task.distributed_dataset(steps_done))
        state, step_fn, reason = RunState(steps_done), None, "train_steps reached"
        try:
            with stop_requests() as stop:
                self._call("on_train_begin", state)
                while state.steps_done < self.config.train_steps:
                    stopping = self._stop_reason(stop["signal"], state)
                    if stopping:
                        reason = stopping
                        break
                    if any(self._call("on_step_begin", state)) or step_fn is None:
                        self.task.forget_traces()
                        step_fn = self.step_function(iterator.element_spec)
                    measured = self.run_step(step_fn, iterator, state)
                    self._call("on_step_end", state, measured)
                    if state.steps_done % self.config.checkpoint_every == 0:
                        self.save(state.steps_done)
                    self._call("after_checkpoint", state)
        except BaseException:
            self.logs.close()  # a failed step leaves no open log behind
            raise
        finally:
            self._call("close", state)
            self.logs.flush()
        try:
            self.save(state.steps_done)
            self._call("on_train_end", state)
        finally:
            self.logs.close()
        return self.summarize(state, reason)

    def _call(self, hook: str, state: RunState, *args) -> list:
        """Every callback's `hook`, in order; their answers."""
        return [getattr(callback, hook)(self, state, *args) for callback in self.callbacks]

    def run_step(self, step_fn, iterator, state: RunState) -> dict:
        """One step on the next batch: its terms (summed over replicas), total and
        learning rate; the state counts and times it."""
        step_start = time.time()
        if state.first_step_start is None:
            state.first_step_start = step_start
        try:
            results = step_fn(next(iterator))
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
            compiled = compile_error(error) if self.task.compiled else None
            if compiled is None:
                raise
            raise compiled from None
        reduced = {k: float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None))
                   for k, v in results.items()}
        state.step_seconds.append(time.time() - step_start)
        state.train_seconds += state.step_seconds[-1]
        reduced["total"] = sum(self.task.weights[t] * reduced[t] for t in self.task.terms)
        self.step.assign_add(1)
        state.steps_done += 1
        return {"step": state.steps_done, **reduced,
                "learning_rate": float(self.optimizer.learning_rate)}

    def save(self, steps_done: int) -> None:
        """A checkpoint at `steps_done`, unless the latest is there already; the
        log is flushed first, so it never runs behind a checkpoint."""
        latest = self.manager.latest_checkpoint
        if latest is not None and int(latest.rsplit("-", 1)[1]) == steps_done:
            return
        self.logs.flush()
        self.manager.save(checkpoint_number=steps_done)

    def reconfigure(self, **settings) -> TrainConfig:
        """The run's settings changed by its plan; the rate decays to the new
        `train_steps` from here."""
        self.config = dataclasses.replace(self.config, **settings)
        self.total_steps.assign(self.config.train_steps)
        return self.config

    def say(self, text: str) -> None:
        """A line for the person watching, above the progress bar."""
        self.progress_log.write(text)

    def summarize(self, state: RunState, reason: str) -> dict:
        """The run's summary (and the chief's train_summary.json)."""
        config, steps_done = self.config, state.steps_done
        checkpoint = self.manager.latest_checkpoint
        if not self.role.chief:  # report the chief's checkpoint; drop this worker's files
            checkpoint = os.path.join(self.model_dir, CHECKPOINT_DIR, os.path.basename(checkpoint))
            shutil.rmtree(self.write_dir, ignore_errors=True)
        seconds = time.time() - state.started
        evaluations = self.evaluation.evaluations
        summary = {"model_dir": self.model_dir, "reason": reason, "start_step": state.start_step,
                   "final_step": steps_done, "seconds": seconds,
                   "pairs_per_second": (steps_done - state.start_step) * config.global_batch_size
                   / max(seconds, 1e-9), "train_seconds": state.train_seconds,
                   "last": state.last, "checkpoint": checkpoint,
                   "evaluations": [{"step": e["step"], "p_at_1": e[TATOEBA_PRIMARY_METRIC],
                                    "mean_cosine": e.get(TATOEBA_MEAN_COSINE),
                                    "train_seconds": e["train_seconds"]} for e in evaluations],
                   "weights": self.task.weights, "replicas": self.strategy.num_replicas_in_sync,
                   "jit_compile": self.task.jit_compile,
                   "pass_through_inserted_at_step": self.depth.inserted_at_step,
                   "cooldown_from_step": self.cooldown.started_at_step,
                   "data": self.task.data_info, "initialization": self.initialization}
        if self.role.chief:  # a collapsed model is named, with or without Tatoeba
            summary.update(collapse_check(evaluations, self.task.embed_function,
                                          self.model_dir))
            with open(os.path.join(self.model_dir, "train_summary.json"), "w") as f:
                json.dump(summary, f, indent=2, default=str)
        return summary

    def _stop_reason(self, signal_name: str | None, state: RunState) -> str | None:
        """Why the loop stops before the next step (None: it goes on): a signal,
        or the time budget (which a plan may set). Workers agree: when one
        stops, all stop at the same step."""
        budget = self.config.time_budget_minutes * 60 or math.inf
        over_budget = time.time() - state.started > budget
        reason = None
        if signal_name:
            reason = f"stopped by {signal_name}"
        elif over_budget:
            reason = f"time budget of {self.config.time_budget_minutes:g} min reached"
        if self.role.workers > 1 and any_worker(self.strategy, reason is not None):
            reason = reason or "stopped with another worker (its signal or time budget)"
        return reason
