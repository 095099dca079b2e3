"""What changes in the cooldown: while the learning rate decays, the teacher
runs on `LossConfig.cooldown_distilled_rows` of each batch's pairs instead of
`distilled_rows`, and the AMS term asks for `LossConfig.cooldown_margin`
instead of `margin`."""

from lealla_tf.train.callbacks import Callback, RunState
from lealla_tf.train.decay import decay_window


def cooldown_start(config) -> float:
    """The step a run's rate starts to decay at (its `TrainConfig`, whose
    `train_steps` a plan may have moved; warmup resolved)."""
    optimizer = config.optimizer
    start, _ = decay_window(float(config.train_steps), optimizer.warmup_steps or 0,
                            optimizer.decay_fraction)
    return start


def in_cooldown(config, steps_done: int) -> bool:
    """Whether the step after `steps_done` is one of the cooldown's."""
    return steps_done >= cooldown_start(config)


def distilled_rows_at(config, steps_done: int) -> float:
    """The share of each batch's pairs the teacher runs on in the step after
    `steps_done`: the cooldown's from the step the rate starts to decay at."""
    loss = config.loss
    if loss.cooldown_distilled_rows and in_cooldown(config, steps_done):
        return loss.cooldown_distilled_rows
    return loss.distilled_rows


def margin_at(config, steps_done: int) -> float:
    """The AMS term's margin in the step after `steps_done`: the cooldown's
    (when set) from the step the rate starts to decay at."""
    loss = config.loss
    if loss.cooldown_margin is not None and in_cooldown(config, steps_done):
        return loss.cooldown_margin
    return loss.margin


class Cooldown(Callback):
    """Sets the task's teacher share and margin before each step; a change
    makes the loop trace the step again. `started_at_step`: where the cooldown's
    settings came in (None: not in this call, or they change nothing)."""

    def __init__(self):
        self.started_at_step: int | None = None

    def on_train_begin(self, trainer, state: RunState) -> None:
        trainer.task.set_distilled_rows(distilled_rows_at(trainer.config, state.steps_done))
        trainer.task.set_margin(margin_at(trainer.config, state.steps_done))

    def on_step_begin(self, trainer, state: RunState) -> bool:
        share = distilled_rows_at(trainer.config, state.steps_done)
        margin = margin_at(trainer.config, state.steps_done)
        changed = [what for what, change in (
            (f"the teacher on {share:g} of each batch's pairs",
             trainer.task.set_distilled_rows(share)),
            (f"the AMS margin {margin:g}", trainer.task.set_margin(margin))) if change]
        if changed and in_cooldown(trainer.config, state.steps_done):
            self.started_at_step = state.steps_done
            trainer.say(f"step {state.steps_done}: cooldown, {', '.join(changed)}")
        return bool(changed)
