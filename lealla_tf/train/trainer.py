"""The trainer: runs a `DistillationTask`'s steps, checkpoints and logs (nothing else).

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

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable

import tensorflow as tf

from lealla_tf.configs import TrainConfig
from lealla_tf.evaluation.tatoeba import (
    TATOEBA_MEAN_COSINE,
    TATOEBA_PRIMARY_METRIC,
    evaluate_tatoeba,
)
from lealla_tf.models.model_dir import CHECKPOINT_DIR
from lealla_tf.progress import progress_bar
from lealla_tf.train.distribution import any_worker, is_tpu_strategy, worker_role
from lealla_tf.train.logs import RunLogs, collapse_check, read_evaluations, truncate_log
from lealla_tf.train.optimizers import FusedAdamW
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
        self._embed = None  # the evaluations' embedding function, built at the first
        self.inserted_at_step = None  # progressive depth: where the skipped layers came in

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

    def evaluate(self) -> dict | None:
        """Tatoeba P@1 on the dev directory (None when no directory is set, and
        on workers other than the chief)."""
        if not self.config.tatoeba_dir or not self.role.chief:
            return None
        if self._embed is None:  # traced once: a new function each time retraced the model
            self._embed = self.task.embed_function() or False
        embed = self._embed
        if not embed:
            return None
        return evaluate_tatoeba(embed, self.config.tatoeba_dir,
                                max_pairs=self.config.eval_max_pairs or None, progress=False)

    # === Loop ===

    def train(self, planner: Callable[[dict], dict | None] | None = None) -> dict:
        """Runs until `train_steps` (or the time budget); returns a summary.

        `planner`, for a run that decides its own length: called after each
        step with what has been measured (`step`, `train_seconds` of the steps
        so far, `step_seconds` of each, `evaluation_seconds` of the evaluation
        at step 0 or None, `start_seconds` from this call to the start of its
        first step, the evaluation at step 0 included);
        once it returns {"train_steps": n, ...} (and optionally `eval_every`,
        `checkpoint_every`, `time_budget_minutes`), the run takes those
        settings and its learning-rate schedule decays to n. It is called only
        before the warmup ends, so the rate so far does not depend on n. Once
        planned, the planner is still called each step and may move the end
        once more (a re-plan: {"train_steps": n'[, "time_budget_minutes": m]},
        n' past the current step): the rate decays to n' from there, and a
        checkpoint at that step keeps a resume from replaying steps before it
        under the new end. The planner records its plan itself; a planner
        with a `start(steps_done)` method gives a resumed run the settings it
        recorded (a planned run resumes planned).
        """
        config = self.config
        if planner is not None and self.role.workers > 1:
            raise ValueError("a run planning its own length runs in one process; give "
                             "worker processes a fixed --train_steps")
        steps_done = self.restore_or_initialize()
        start_step = steps_done
        truncate_log(os.path.join(self.write_dir, "train_log.jsonl"), steps_done)
        # A run started over evaluates step 0 again: its earlier row goes. A resumed
        # run keeps the evaluation at its checkpoint's step (made after the save).
        truncate_log(os.path.join(self.write_dir, "eval_log.jsonl"),
                     steps_done if steps_done else -1)
        resumed = planner.start(steps_done) if hasattr(planner, "start") else None
        plan = resumed
        if resumed:  # the recorded plan, at the end it had at this step
            config = self.config = dataclasses.replace(self.config, **resumed)
            self.total_steps.assign(config.train_steps)
        iterator = iter(self.task.distributed_dataset(steps_done))
        self._set_depth(steps_done)
        step_fn = self.step_function(iterator.element_spec)
        writer = tf.summary.create_file_writer(os.path.join(self.write_dir, "logs"))
        logs = RunLogs(self.write_dir, writer)
        stop = {"signal": None}

        def request_stop(signum, _frame):
            stop["signal"] = signal.Signals(signum).name

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        started = time.time()
        # A resumed run's report keeps the evaluations made before the kill.
        evaluations = read_evaluations(os.path.join(self.write_dir, "eval_log.jsonl"))
        last, reason = {}, "train_steps reached"
        # Time in steps only (dev evaluations excluded): what "equal wall time" compares.
        train_seconds = 0.0
        logs.train_seconds = lambda: train_seconds
        evaluation_seconds = None
        if config.eval_every and steps_done == 0:
            evaluated = time.time()
            logs.evaluation(0, self.evaluate(), evaluations)
            evaluation_seconds = time.time() - evaluated
        elif config.eval_every and (steps_done % config.eval_every == 0
                                    or steps_done == config.train_steps) and not any(
                e["step"] == steps_done for e in evaluations):
            # killed after the checkpoint, before the evaluation that follows it
            logs.evaluation(steps_done, self.evaluate(), evaluations)
        step_seconds, first_step_start = [], None
        bar = progress_bar(total=config.train_steps, initial=steps_done, desc="training",
                           unit="step", disable=not self.progress, dynamic_ncols=True)
        window_start, window_steps = time.time(), 0
        try:
            while steps_done < config.train_steps:
                budget = config.time_budget_minutes * 60 or math.inf  # a plan may set it
                stopping = self._stop_reason(stop["signal"], time.time() - started > budget)
                if stopping:
                    reason = stopping
                    break
                if self._set_depth(steps_done):
                    step_fn = self.step_function(iterator.element_spec)
                    bar.write(f"step {steps_done}: pass-through layers inserted")
                step_start = time.time()
                if first_step_start is None:
                    first_step_start = step_start
                try:
                    results = step_fn(next(iterator))
                except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
                    compiled = compile_error(error) if self.task.compiled else None
                    if compiled is None:
                        raise
                    raise compiled from None
                reduced = {k: float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None))
                           for k, v in results.items()}
                step_seconds.append(time.time() - step_start)
                train_seconds += step_seconds[-1]
                reduced["total"] = sum(self.task.weights[t] * reduced[t] for t in self.task.terms)
                self.step.assign_add(1)
                steps_done += 1
                window_steps += 1
                pairs_per_second = window_steps * config.global_batch_size / max(
                    time.time() - window_start, 1e-9)
                last = {"step": steps_done, **reduced,
                        "learning_rate": float(self.optimizer.learning_rate),
                        "pairs_per_second": pairs_per_second,
                        "elapsed_seconds": time.time() - started,
                        "train_seconds": train_seconds}
                flush = steps_done % config.log_every == 0 or steps_done == config.train_steps
                logs.step(last, self.task.terms, flush)
                if flush:
                    window_start, window_steps = time.time(), 0
                bar.set_postfix(loss=f"{reduced['total']:.4f}", pairs_s=f"{pairs_per_second:.1f}")
                bar.update(1)
                saved = None  # the step a re-plan saved a checkpoint at
                if planner is not None:
                    answer = planner({"step": steps_done, "train_seconds": train_seconds,
                                      "step_seconds": list(step_seconds),
                                      "evaluation_seconds": evaluation_seconds,
                                      "start_seconds": first_step_start - started,
                                      "elapsed_seconds": time.time() - started})
                    if answer is not None:
                        if plan is not None:
                            # A re-plan moves the decay from this step on: a checkpoint
                            # here first, so that no resume replays steps before it
                            # under the new end.
                            logs.flush()
                            self.manager.save(checkpoint_number=steps_done)
                            saved = steps_done
                        config = (self._take_plan(answer, steps_done) if plan is None
                                  else self._take_replan(answer, steps_done))
                        plan = answer
                        bar.total = config.train_steps
                        bar.refresh()
                if steps_done % config.checkpoint_every == 0 and saved != steps_done:
                    logs.flush()  # the log never runs behind a checkpoint
                    self.manager.save(checkpoint_number=steps_done)
                if config.eval_every and steps_done % config.eval_every == 0:
                    metrics = logs.evaluation(steps_done, self.evaluate(), evaluations)
                    if metrics:
                        bar.write(f"step {steps_done}: Tatoeba P@1 "
                                  f"{100 * metrics[TATOEBA_PRIMARY_METRIC]:.2f}")
        except BaseException:
            logs.close()  # a failed step leaves no open log behind
            raise
        finally:
            bar.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            logs.flush()
        try:
            latest = self.manager.latest_checkpoint
            if latest is None or int(latest.rsplit("-", 1)[1]) != steps_done:
                self.manager.save(checkpoint_number=steps_done)
            if config.eval_every and steps_done > start_step and (
                    not evaluations or evaluations[-1]["step"] != steps_done):
                logs.evaluation(steps_done, self.evaluate(), evaluations)
        finally:
            logs.close()
        checkpoint = self.manager.latest_checkpoint
        if not self.role.chief:  # report the chief's checkpoint; drop this worker's files
            checkpoint = os.path.join(self.model_dir, CHECKPOINT_DIR, os.path.basename(checkpoint))
            shutil.rmtree(self.write_dir, ignore_errors=True)
        seconds = time.time() - started
        summary = {"model_dir": self.model_dir, "reason": reason, "start_step": start_step,
                   "final_step": steps_done, "seconds": seconds,
                   "pairs_per_second": (steps_done - start_step) * config.global_batch_size
                   / max(seconds, 1e-9), "train_seconds": train_seconds,
                   "last": last, "checkpoint": checkpoint,
                   "evaluations": [{"step": e["step"], "p_at_1": e[TATOEBA_PRIMARY_METRIC],
                                    "mean_cosine": e.get(TATOEBA_MEAN_COSINE),
                                    "train_seconds": e["train_seconds"]} for e in evaluations],
                   "weights": self.task.weights, "replicas": self.strategy.num_replicas_in_sync,
                   "jit_compile": self.task.jit_compile,
                   "pass_through_inserted_at_step": self.inserted_at_step,
                   "data": self.task.data_info, "initialization": self.initialization}
        if self.role.chief:  # a collapsed model is named, with or without Tatoeba
            summary.update(collapse_check(evaluations, self.task.embed_function,
                                          self.model_dir))
            with open(os.path.join(self.model_dir, "train_summary.json"), "w") as f:
                json.dump(summary, f, indent=2, default=str)
        return summary

    def _set_depth(self, steps_done: int) -> bool:
        """Progressive depth (`progressive_depth`): the student skips the task's
        pass-through layers for that share of the steps, then runs them too.
        True when this step changes what the step computes (trace it again)."""
        student = self.task.student
        skipped = (self.task.pass_through_layers
                   if steps_done < self.config.progressive_depth * self.config.train_steps
                   else frozenset())
        if getattr(student, "skipped_layers", frozenset()) == skipped:
            return False
        student.skipped_layers = skipped
        self._embed = None  # the evaluations embed at the new depth
        if not skipped:
            self.inserted_at_step = steps_done
        return True

    def _take_plan(self, plan: dict, steps_done: int) -> TrainConfig:
        """The run's settings once its planner decided its length."""
        if plan["train_steps"] < steps_done or (
                steps_done >= self.config.optimizer.warmup_steps):
            raise ValueError(f"a plan of {plan['train_steps']} steps came at step {steps_done}: "
                             "a planner must decide during the warmup and not below the "
                             "steps already run")
        self.config = dataclasses.replace(self.config, **plan)
        self.total_steps.assign(self.config.train_steps)
        return self.config

    def _take_replan(self, replan: dict, steps_done: int) -> TrainConfig:
        """The run's settings when its planner, having planned, re-measures and
        moves the end: only `train_steps` (and the time guard) may change, to a
        step after this one; the rate from here decays to the new end."""
        changed = set(replan) - {"train_steps", "time_budget_minutes"}
        if changed or replan["train_steps"] <= steps_done:
            raise ValueError(f"a re-plan at step {steps_done} may set only a later "
                             f"train_steps (and time_budget_minutes); got {replan}")
        self.config = dataclasses.replace(self.config, **replan)
        self.total_steps.assign(self.config.train_steps)
        return self.config

    def _stop_reason(self, signal_name: str | None, over_budget: bool) -> str | None:
        """Why the loop stops before the next step (None: it goes on). Workers
        agree: when one stops, all stop at the same step."""
        reason = None
        if signal_name:
            reason = f"stopped by {signal_name}"
        elif over_budget:
            reason = f"time budget of {self.config.time_budget_minutes:g} min reached"
        if self.role.workers > 1 and any_worker(self.strategy, reason is not None):
            reason = reason or "stopped with another worker (its signal or time budget)"
        return reason
