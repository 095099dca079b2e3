"""A run that decides its own length: the `Planning` callback gives the trainer
what its planner decides (the main job's planner is
`lealla_tf.recipe.planner.BudgetPlanner`).

A planner is called after each step with `RunState.measured()`. Once it
returns {"train_steps": n, ...} (and optionally `eval_every`,
`checkpoint_every`, `time_budget_minutes`), the run takes those settings and its
learning-rate schedule decays to n. It must decide before the warmup ends, so
that the rate so far does not depend on n. Once planned, it is still called each
step and may move the end once more (a re-plan: {"train_steps": n'[,
"time_budget_minutes": m]}, n' past the current step): the rate decays to n' from
there, and a checkpoint at that step keeps a resume from replaying steps before
it under the new end. The planner records its plan itself; one with a
`start(steps_done)` method gives a resumed run the settings it recorded (a
planned run resumes planned).
"""

from collections.abc import Callable

from lealla_tf.train.callbacks import Callback, RunState

# What a re-plan may change.
REPLAN_SETTINGS = frozenset({"train_steps", "time_budget_minutes"})


def check_plan(plan: dict, steps_done: int, warmup_steps: int) -> None:
    """ValueError unless a first plan comes during the warmup and not below the
    steps already run."""
    if plan["train_steps"] < steps_done or steps_done >= warmup_steps:
        raise ValueError(f"a plan of {plan['train_steps']} steps came at step {steps_done}: "
                         "a planner must decide during the warmup and not below the "
                         "steps already run")


def check_replan(replan: dict, steps_done: int) -> None:
    """ValueError unless a re-plan sets only a later `train_steps` (and the time
    guard)."""
    if set(replan) - REPLAN_SETTINGS or replan["train_steps"] <= steps_done:
        raise ValueError(f"a re-plan at step {steps_done} may set only a later "
                         f"train_steps (and time_budget_minutes); got {replan}")


class Planning(Callback):
    """Calls `planner` (None: a run of fixed length) after each step and gives
    the trainer what it decides (see the module docstring)."""

    def __init__(self, planner: Callable[[dict], dict | None] | None):
        self.planner = planner
        self.plan: dict | None = None

    def on_train_begin(self, trainer, state: RunState) -> None:
        start = getattr(self.planner, "start", None)
        resumed = start(state.steps_done) if start is not None else None
        if resumed:  # the recorded plan, at the end it had at this step
            trainer.reconfigure(**resumed)
            self.plan = resumed

    def on_step_end(self, trainer, state: RunState, measured: dict) -> None:
        if self.planner is None:
            return
        answer = self.planner(state.measured())
        if answer is None:
            return
        if self.plan is None:
            check_plan(answer, state.steps_done, trainer.config.optimizer.warmup_steps)
        else:
            check_replan(answer, state.steps_done)
            # The decay moves from this step on: a checkpoint here first, so that
            # no resume replays steps before it under the new end.
            trainer.save(state.steps_done)
        trainer.reconfigure(**answer)
        self.plan = answer
