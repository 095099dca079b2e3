"""Progressive depth (`TrainConfig.progressive_depth`): for that share of the
steps the student skips the task's pass-through layers (the layers weight
selection did not take from the teacher), then it runs them too."""

from lealla_tf.train.callbacks import Callback, RunState


class ProgressiveDepth(Callback):
    """Sets the layers the student skips before each step; a change makes the
    loop trace the step again. `inserted_at_step`: where the skipped layers
    came in (None: they never were skipped, or not in this call)."""

    def __init__(self):
        self.inserted_at_step: int | None = None

    def on_train_begin(self, trainer, state: RunState) -> None:
        self.set_depth(trainer, state.steps_done)

    def on_step_begin(self, trainer, state: RunState) -> bool:
        changed = self.set_depth(trainer, state.steps_done)
        if changed:
            trainer.say(f"step {state.steps_done}: pass-through layers inserted")
        return changed

    def set_depth(self, trainer, steps_done: int) -> bool:
        """True when the layers skipped at `steps_done` differ from the step before."""
        student, config = trainer.task.student, trainer.config
        skipped = (trainer.task.pass_through_layers
                   if steps_done < config.progressive_depth * config.train_steps
                   else frozenset())
        if getattr(student, "skipped_layers", frozenset()) == skipped:
            return False
        student.skipped_layers = skipped
        if not skipped:
            self.inserted_at_step = steps_done
        return True
