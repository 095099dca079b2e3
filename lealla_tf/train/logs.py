"""What a training run writes for people and tools: train_log.jsonl,
eval_log.jsonl, TensorBoard scalars, the progress bar (`ProgressLog`, the
loop's callback that writes them each step), and the one-screen summary at the end."""

import json
import os
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from lealla_tf.evaluation.tatoeba import TATOEBA_MEAN_COSINE, TATOEBA_PRIMARY_METRIC
from lealla_tf.inference import formats
from lealla_tf.inference.collapse import collapse_warning, mean_cosine
from lealla_tf.progress import progress_bar
from lealla_tf.train.callbacks import Callback, RunState


class RunLogs:
    """train_log.jsonl, eval_log.jsonl and TensorBoard scalars of one run."""

    def __init__(self, model_dir: str, writer):
        self.writer = writer
        self.train_seconds = lambda: 0.0
        self.train = open(os.path.join(model_dir, "train_log.jsonl"), "a")
        self.eval = open(os.path.join(model_dir, "eval_log.jsonl"), "a")

    @classmethod
    def resume(cls, model_dir: str, steps_done: int) -> "RunLogs":
        """The logs of a run (re)starting at `steps_done`: rows past its checkpoint
        go (`truncate_log`). A run started over evaluates step 0 again, so its
        earlier row goes too; a resumed run keeps the evaluation at its
        checkpoint's step (made after the save)."""
        truncate_log(os.path.join(model_dir, "train_log.jsonl"), steps_done)
        truncate_log(os.path.join(model_dir, "eval_log.jsonl"), steps_done if steps_done else -1)
        return cls(model_dir, tf.summary.create_file_writer(os.path.join(model_dir, "logs")))

    def step(self, row: dict, terms, flush: bool) -> None:
        self.train.write(json.dumps(row) + "\n")
        if flush:
            self.train.flush()
            with self.writer.as_default(step=row["step"]):
                for key in list(terms) + ["total", "gradient_norm"]:
                    tf.summary.scalar(f"loss/{key}", row[key])
                tf.summary.scalar("learning_rate", row["learning_rate"])
                tf.summary.scalar("pairs_per_second", row["pairs_per_second"])

    def evaluation(self, step: int, metrics: dict | None, evaluations: list):
        if not metrics:
            return None
        row = {"step": step, "train_seconds": self.train_seconds(), **metrics}
        evaluations.append(row)
        self.eval.write(json.dumps(row) + "\n")
        self.eval.flush()
        with self.writer.as_default(step=step):
            tf.summary.scalar(TATOEBA_PRIMARY_METRIC, metrics[TATOEBA_PRIMARY_METRIC])
        return metrics

    def flush(self) -> None:
        if not self.train.closed:
            self.train.flush()

    def close(self) -> None:
        self.train.close()
        self.eval.close()
        self.writer.flush()


class ProgressLog(Callback):
    """Writes each step's row (train_log.jsonl, TensorBoard every `log_every`
    steps) and moves the progress bar; the row's pairs/s is over the steps
    since the last flush."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bar = None
        self.window = (time.time(), 0)

    def on_train_begin(self, trainer, state: RunState) -> None:
        trainer.logs.train_seconds = lambda: state.train_seconds

    def on_step_begin(self, trainer, state: RunState) -> bool:
        if self.bar is None:  # after the evaluation at step 0 and a resumed plan
            self.bar = progress_bar(total=trainer.config.train_steps, initial=state.steps_done,
                                    desc="training", unit="step", disable=not self.enabled,
                                    dynamic_ncols=True)
            self.window = (time.time(), 0)
        return False

    def on_step_end(self, trainer, state: RunState, measured: dict) -> None:
        config = trainer.config
        start, steps = self.window[0], self.window[1] + 1
        pairs_per_second = steps * config.global_batch_size / max(time.time() - start, 1e-9)
        state.last = {**measured, "pairs_per_second": pairs_per_second,
                      "elapsed_seconds": time.time() - state.started,
                      "train_seconds": state.train_seconds}
        flush = state.steps_done % config.log_every == 0 or state.steps_done == config.train_steps
        trainer.logs.step(state.last, trainer.task.terms, flush)
        self.window = (time.time(), 0) if flush else (start, steps)
        self.bar.set_postfix(loss=f"{measured['total']:.4f}", pairs_s=f"{pairs_per_second:.1f}")
        self.bar.update(1)

    def after_checkpoint(self, trainer, state: RunState) -> None:
        if self.bar.total != trainer.config.train_steps:  # planned, or re-planned
            self.bar.total = trainer.config.train_steps
            self.bar.refresh()

    def write(self, text: str) -> None:
        """A line above the bar (printed when there is none)."""
        (self.bar.write if self.bar is not None else print)(text)

    def close(self, trainer, state: RunState) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


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


def read_evaluations(path: str) -> list:
    """The evaluations a run logged (eval_log.jsonl, already cut to its last
    checkpoint by `truncate_log`), so that a resumed run's summary and curve
    keep those made before the kill; [] without a log."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def collapse_check(evaluations: list, embed_function: Callable, model_dir: str) -> dict:
    """What the summary says about a model that maps every sentence to one point:
    `collapse_warning` (None when it does not), measured from the spread of the
    last Tatoeba evaluation's English side; a run without one (no --tatoeba_dir)
    embeds the export's check sentences (`lealla_tf.inference.formats.
    SPREAD_SENTENCES`) with `embed_function()`'s function, strings -> vectors, and
    adds their `mean_cosine`, so the summary and the export agree. Empty when
    there is nothing to measure with (`embed_function()` gives None)."""
    what = f"the model in {model_dir}"
    if evaluations:
        return {"collapse_warning": collapse_warning(
            evaluations[-1].get(TATOEBA_MEAN_COSINE, float("nan")), what)}
    embed = embed_function()
    if not embed:
        return {}
    cosine = mean_cosine(np.asarray(embed(tf.constant(formats.SPREAD_SENTENCES))))
    return {"mean_cosine": cosine, "collapse_warning": collapse_warning(cosine, what)}


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
    if summary.get("collapse_warning"):
        lines.append(summary["collapse_warning"])
    lines.append(f"checkpoint: {summary['checkpoint']}")
    lines.append(f"logs: {os.path.join(summary['model_dir'], 'logs')} (TensorBoard), "
                 "train_log.jsonl, eval_log.jsonl, train_summary.json")
    lines.append("=" * 72)
    return "\n".join(lines)
