"""The teacher's share in the cooldown (`LossConfig.cooldown_distilled_rows`):
while the learning rate decays, the teacher runs on that share of each batch's
pairs instead of `distilled_rows`."""

from lealla_tf.train.callbacks import Callback, RunState
from lealla_tf.train.decay import decay_window


def cooldown_start(config) -> float:
    """The step a run's rate starts to decay at (its `TrainConfig`, whose
    `train_steps` a plan may have moved; warmup resolved)."""
    optimizer = config.optimizer
    start, _ = decay_window(float(config.train_steps), optimizer.warmup_steps or 0,
                            optimizer.decay_fraction)
    return start


def distilled_rows_at(config, steps_done: int) -> float:
    """The share of each batch's pairs the teacher runs on in the step after
    `steps_done`: the cooldown's from the step the rate starts to decay at."""
    loss = config.loss
    if loss.cooldown_distilled_rows and steps_done >= cooldown_start(config):
        return loss.cooldown_distilled_rows
    return loss.distilled_rows


class CooldownRows(Callback):
    """Sets the task's share before each step; a change makes the loop trace the
    step again. `started_at_step`: where the cooldown's share came in (None: not
    in this call)."""

    def __init__(self):
        self.started_at_step: int | None = None

    def on_train_begin(self, trainer, state: RunState) -> None:
        trainer.task.set_distilled_rows(distilled_rows_at(trainer.config, state.steps_done))

    def on_step_begin(self, trainer, state: RunState) -> bool:
        share = distilled_rows_at(trainer.config, state.steps_done)
        changed = trainer.task.set_distilled_rows(share)
        if changed and state.steps_done >= cooldown_start(trainer.config):
            self.started_at_step = state.steps_done
            trainer.say(f"step {state.steps_done}: cooldown, the teacher on {share:g} of "
                        "each batch's pairs")
        return changed
