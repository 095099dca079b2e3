"""Tatoeba P@1 along a run (`TrainConfig.tatoeba_dir`, `eval_every`): the
`DevEvaluation` callback, on the chief only."""

import os
import time

from lealla_tf.evaluation.tatoeba import (
    TATOEBA_PRIMARY_METRIC,
    TATOEBA_SENTENCES,
    evaluate_tatoeba,
)
from lealla_tf.train.callbacks import Callback, RunState
from lealla_tf.train.logs import read_evaluations


class DevEvaluation(Callback):
    """Evaluates at step 0 (timed, its sentences counted: a planner reads
    both), every `eval_every` steps after that step's checkpoint, and at the
    last step.

    A resumed run keeps the evaluations logged before the kill
    (eval_log.jsonl, cut to the checkpoint by `lealla_tf.train.logs.RunLogs`)
    and makes the one a kill cut off between a checkpoint and its evaluation.
    """

    def __init__(self):
        self.evaluations: list[dict] = []
        self._embed = None  # traced once a depth: a new function each time retraced the model
        self._depth = None

    def on_train_begin(self, trainer, state: RunState) -> None:
        self.evaluations = read_evaluations(os.path.join(trainer.write_dir, "eval_log.jsonl"))
        every, steps = trainer.config.eval_every, state.steps_done
        if not every:
            return
        if steps == 0:
            started = time.time()
            metrics = self.evaluate(trainer, 0)
            state.evaluation_seconds = time.time() - started
            state.evaluation_sentences = (metrics or {}).get(TATOEBA_SENTENCES)
        elif (steps % every == 0 or steps == trainer.config.train_steps) and not any(
                e["step"] == steps for e in self.evaluations):
            self.evaluate(trainer, steps)  # killed after the checkpoint, before this

    def after_checkpoint(self, trainer, state: RunState) -> None:
        every = trainer.config.eval_every
        if every and state.steps_done % every == 0:
            metrics = self.evaluate(trainer, state.steps_done)
            if metrics:
                trainer.say(f"step {state.steps_done}: Tatoeba P@1 "
                            f"{100 * metrics[TATOEBA_PRIMARY_METRIC]:.2f}")

    def on_train_end(self, trainer, state: RunState) -> None:
        if trainer.config.eval_every and state.steps_done > state.start_step and (
                not self.evaluations or self.evaluations[-1]["step"] != state.steps_done):
            self.evaluate(trainer, state.steps_done)

    def evaluate(self, trainer, step: int) -> dict | None:
        """Scores the student now and logs it as `step`'s evaluation (None when
        nothing was scored)."""
        return trainer.logs.evaluation(step, self.score(trainer), self.evaluations)

    def score(self, trainer) -> dict | None:
        """Tatoeba P@1 on the dev directory (None when no directory is set, on
        workers other than the chief, and for a task with nothing to embed)."""
        config = trainer.config
        if not config.tatoeba_dir or not trainer.role.chief:
            return None
        depth = getattr(trainer.task.student, "skipped_layers", None)
        if self._embed is None or depth != self._depth:  # the evaluations embed at this depth
            self._embed = trainer.task.embed_function() or False
            self._depth = depth
        if not self._embed:
            return None
        return evaluate_tatoeba(self._embed, config.tatoeba_dir,
                                max_pairs=config.eval_max_pairs or None, progress=False)
