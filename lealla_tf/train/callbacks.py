"""What plugs into the training loop (`lealla_tf.train.trainer.Trainer.train`).

The loop runs steps and saves checkpoints; everything else is a `Callback`: the
logs and progress bar (`lealla_tf.train.logs.ProgressLog`), a run that plans
its own length (`lealla_tf.train.planning`), progressive depth
(`lealla_tf.train.depth`), the teacher's share and the margin in the cooldown
(`lealla_tf.train.cooldown`) and the dev evaluations
(`lealla_tf.train.dev_evaluation`). `RunState` is what the loop has done and
measured so far, shared with them.

Each hook gets the trainer (its `config`, `task`, `logs`, `reconfigure`, `save`
and `say`) and the state. The loop calls them in the order of its callbacks:

    on_train_begin                     once, before the first step
    for each step:
        on_step_begin -> bool          True: the step computes something else
                                       (the loop traces it again)
        (the step)
        on_step_end(measured)          the step's terms and learning rate
        (the step's checkpoint, every `checkpoint_every` steps)
        after_checkpoint               what a kill may cut off: a resumed run
                                       redoes it from the checkpoint
    close                              always, also when a step raised
    on_train_end                       after the last checkpoint
"""

import dataclasses
import time


@dataclasses.dataclass
class RunState:
    """What the loop has done and measured so far."""

    steps_done: int
    # The step this call started at (0, or a resumed checkpoint's): `steps_done` at first.
    start_step: int = dataclasses.field(init=False)
    started: float = dataclasses.field(default_factory=time.time)
    # Each step's seconds in this call; their sum: time in steps only, the dev
    # evaluations excluded (what "equal wall time" compares).
    step_seconds: list = dataclasses.field(default_factory=list)
    train_seconds: float = 0.0
    first_step_start: float | None = None
    # The evaluation at step 0 (None: none was made in this call) and the
    # sentences it embedded (None also when it scored nothing).
    evaluation_seconds: float | None = None
    evaluation_sentences: int | None = None
    # The last step's row of the train log.
    last: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.start_step = self.steps_done

    def measured(self) -> dict:
        """What a planner is given after each step (`lealla_tf.train.planning`):
        the step, the seconds of the steps so far and of each, the evaluation at
        step 0 (its seconds and sentences), from this call to its first step
        (the evaluation at step 0 included), and from this call to now."""
        return {"step": self.steps_done, "train_seconds": self.train_seconds,
                "step_seconds": list(self.step_seconds),
                "evaluation_seconds": self.evaluation_seconds,
                "evaluation_sentences": self.evaluation_sentences,
                "start_seconds": (self.first_step_start or time.time()) - self.started,
                "elapsed_seconds": time.time() - self.started}


class Callback:
    """A part of a run that is not the step: override the hooks it needs."""

    def on_train_begin(self, trainer, state: RunState) -> None:
        pass

    def on_step_begin(self, trainer, state: RunState) -> bool:
        return False

    def on_step_end(self, trainer, state: RunState, measured: dict) -> None:
        pass

    def after_checkpoint(self, trainer, state: RunState) -> None:
        pass

    def close(self, trainer, state: RunState) -> None:
        pass

    def on_train_end(self, trainer, state: RunState) -> None:
        pass
