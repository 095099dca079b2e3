"""Planning the students' training to the job's time budget.

Importing it loads no TensorFlow: `lealla-recipe`'s flags name its planned
defaults, and its --help answers before TensorFlow loads (tests/cli/test_scripts.py).
"""

import dataclasses
import json
import os
from typing import Optional

from lealla_tf.configs import TrainConfig
from lealla_tf.recipe.settings import RecipeConfig
from lealla_tf.train.resolution import validate_train_config

# === Planning the training to the time budget ===

# The student decides how many steps it (and a comparison) trains after its
# first PLAN_AT_STEP steps, timing all but the first PLAN_SKIP_STEPS (tracing,
# and oneDNN's first pass over new batch shapes); both warm up over
# PLANNED_WARMUP_STEPS, so the rate before the plan does not depend on it.
# The first steps pay for new batch shapes (tracing, oneDNN's first pass), so
# the plan waits for step 50 (benchmarks/main_job.py: the report's step times).
PLAN_AT_STEP, PLAN_SKIP_STEPS, PLANNED_WARMUP_STEPS = 50, 15, 60
# Steps 16-50 time only the length buckets that came first; at this share of
# the plan the student times its steps again, over every bucket, and moves the
# end to what the budget then allows.
REPLAN_AT_FRACTION = 0.5
# Dev evaluations along each student's training when --eval_every is 0.
PLANNED_EVALUATIONS = 5
# The plan keeps this share of the budget in hand (the machine's speed drifts).
PLAN_MARGIN = 0.05
# The comparison's step (AMS alone, no teacher pass, past its first step, which
# traces) over the student's, and the stages after training (export,
# evaluations, mining, report) over the teacher's evaluation stage, both from
# the main job's report (benchmarks/main_job.py), with a margin: the plan scales
# them by what this machine measures.
COMPARISON_STEP_RATIO = 0.6
AFTER_TRAINING_PER_TEACHER_EVALUATION = 1.2
# Fewer steps than this and the report says the run was cut short by the budget.
SHORT_RUN_STEPS = 300
BUDGET_PLAN_FILE = "budget_plan.json"  # the planner's measurements, beside the trainer's plan.json


class BudgetPlanner:
    """The student's `planner` (`lealla_tf.train.trainer.Trainer.train`): at step
    `PLAN_AT_STEP` it gives the student (and a comparison, when asked for) the
    steps that fit what is left of `--time_budget_minutes`.

    What is left: the budget less `PLAN_MARGIN`, less what the job has spent
    (`stages.elapsed()`), less the stages after training (`after_training`
    seconds). It pays for the student's remaining steps and evaluations and
    the comparison's start, steps (`COMPARISON_STEP_RATIO` of the student's)
    and evaluations: (n - k) p + n r p + fixed = left, for n. At
    `REPLAN_AT_FRACTION` of n it solves the same for the steps left, with p
    timed over every step so far (`replan`).
    """

    def __init__(self, config: RecipeConfig, stages, after_training: float,
                 comparison: bool, model_dir: str):
        self.config, self.stages = config, stages
        self.after_training, self.comparison = after_training, comparison
        self.model_dir = model_dir
        self.plan: Optional[dict] = None

    def __call__(self, measured: dict) -> Optional[dict]:
        step = measured["step"]
        if self.plan is not None:
            return self.replan(measured)
        if step < PLAN_AT_STEP:
            return None
        per_step = self.seconds_per_step(measured)
        evaluation = measured["evaluation_seconds"] or 0.0
        budget = self.config.time_budget_minutes * 60
        spent = self.stages.elapsed()
        left = budget * (1 - PLAN_MARGIN) - spent - self.after_training
        ratio = COMPARISON_STEP_RATIO if self.comparison else 0.0
        # The comparison's start: the student's, less its evaluation at step 0
        # (counted with the others), plus its first step's tracing.
        comparison_start = (max(0.0, measured["start_seconds"] - evaluation)
                            + max(0.0, measured["step_seconds"][0] - per_step))
        fixed = PLANNED_EVALUATIONS * evaluation + self.comparison_seconds(
            comparison_start, evaluation)
        steps = int((left - fixed + step * per_step) // (per_step * (1 + ratio)))
        steps = max(steps, PLANNED_WARMUP_STEPS + 1)
        own = (steps - step) * per_step + fixed
        self.plan = {"train_steps": steps, "planned": True, "planned_at_step": step,
                     "budget_seconds": budget, "spent_seconds": spent,
                     "after_training_seconds": self.after_training,
                     "seconds_per_step": per_step, "pairs_per_second":
                     self.config.global_batch_size / per_step,
                     "evaluation_seconds": evaluation,
                     "start_seconds": measured["start_seconds"],
                     "comparison_start_seconds": comparison_start,
                     "comparison_step_ratio": ratio, "short": steps < SHORT_RUN_STEPS}
        print(f"\nplan: {per_step:.2f} s a step ({self.plan['pairs_per_second']:.1f} pairs/s); "
              f"budget {budget / 60:.0f} min, {spent / 60:.1f} spent, "
              f"{self.after_training / 60:.1f} kept for after training -> {steps} steps a "
              "student" + (" (short: this machine is slow for the budget)"
                           if self.plan["short"] else ""))
        self.write()
        every = self.config.eval_every or planned_every(steps)
        return {"train_steps": steps, "eval_every": every,
                "checkpoint_every": planned_every(steps),
                # a run that overshoots its plan by a third stops
                "time_budget_minutes": (measured["start_seconds"] + step * per_step
                                        + 4 / 3 * own) / 60}


    @staticmethod
    def seconds_per_step(measured: dict) -> float:
        """The mean step time past the first `PLAN_SKIP_STEPS` (tracing, new shapes)."""
        timed = measured["step_seconds"][PLAN_SKIP_STEPS:]
        return float(sum(timed) / max(1, len(timed)))

    def comparison_seconds(self, start: float, evaluation: float) -> float:
        """The comparison's time besides its steps: its start and evaluations."""
        return start + (PLANNED_EVALUATIONS + 1) * evaluation if self.comparison else 0.0

    def replan(self, measured: dict) -> Optional[dict]:
        """At `REPLAN_AT_FRACTION` of the plan (once): the steps that fit what is
        left, timed over every step so far, so the job ends at its budget
        whichever length buckets came first. Only the end moves (the
        evaluations and checkpoints keep their spacing; the last step is
        evaluated and saved anyway)."""
        step, plan = measured["step"], self.plan
        if plan.get("replanned_at_step") or step < max(
                plan["planned_at_step"] + 1, int(REPLAN_AT_FRACTION * plan["train_steps"])):
            return None
        per_step = self.seconds_per_step(measured)
        evaluation = plan["evaluation_seconds"]
        left = (plan["budget_seconds"] * (1 - PLAN_MARGIN) - self.stages.elapsed()
                - self.after_training)
        every = self.config.eval_every or planned_every(plan["train_steps"])
        evaluations_left = len(range(every * (step // every + 1), plan["train_steps"], every)) + 1
        fixed = evaluations_left * evaluation + self.comparison_seconds(
            plan["comparison_start_seconds"], evaluation)
        ratio = plan["comparison_step_ratio"]
        steps = max(step + 1, int((left - fixed + step * per_step) // (per_step * (1 + ratio))))
        own = (steps - step) * per_step + evaluations_left * evaluation
        self.plan.update(replanned_at_step=step, planned_train_steps=plan["train_steps"],
                         train_steps=steps, seconds_per_step=per_step,
                         pairs_per_second=self.config.global_batch_size / per_step,
                         short=steps < SHORT_RUN_STEPS)
        print(f"\nre-plan at step {step}: {per_step:.2f} s a step over every step so far -> "
              f"{steps} steps (planned {self.plan['planned_train_steps']})")
        self.write()
        return {"train_steps": steps,
                "time_budget_minutes": (measured["elapsed_seconds"] + 4 / 3 * own) / 60}

    def write(self) -> None:
        with open(os.path.join(self.model_dir, BUDGET_PLAN_FILE), "w") as f:
            json.dump(self.plan, f, indent=2)


def planned_every(steps: int) -> int:
    """Steps between evaluations (and checkpoints): `PLANNED_EVALUATIONS` of them,
    the last at the last step rather than one beside it."""
    return max(1, -(-steps // PLANNED_EVALUATIONS))


def student_run_config(train: "TrainConfig", config: RecipeConfig, steps: Optional[int],
                       guard_minutes: float = 0.0,
                       recorded: Optional[dict] = None) -> "TrainConfig":
    """A student's config: `steps` (with warmup, evaluations and checkpoints that
    follow from them), or a provisional one whose `BudgetPlanner` decides.
    `recorded`: the plan a resumed run made (`plan.json`); its evaluations and
    checkpoints keep the plan's spacing, which a re-plan does not move."""
    if steps:
        warmup = (config.warmup_steps if config.warmup_steps is not None
                  else (PLANNED_WARMUP_STEPS if not config.train_steps
                        else max(1, steps // 10)))
        every = config.eval_every or planned_every(steps)
        changes = dict(train_steps=steps, eval_every=every, checkpoint_every=planned_every(steps))
        changes.update({key: recorded[key] for key in ("eval_every", "checkpoint_every")
                        if key in (recorded or {})})
    else:  # planned at PLAN_AT_STEP: nothing saved or evaluated before
        warmup = PLANNED_WARMUP_STEPS
        changes = dict(train_steps=100 * PLANNED_WARMUP_STEPS, eval_every=PLANNED_WARMUP_STEPS,
                       checkpoint_every=PLANNED_WARMUP_STEPS)
    run = dataclasses.replace(train, time_budget_minutes=guard_minutes,
                              optimizer=dataclasses.replace(train.optimizer,
                                                            warmup_steps=warmup), **changes)
    validate_train_config(run)
    return run


def read_plan(model_dir: str, name: str = "plan.json") -> Optional[dict]:
    """The plan a student's run recorded (the trainer's `plan.json`, or the
    budget planner's `BUDGET_PLAN_FILE`), or None."""
    path = os.path.join(model_dir, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
