"""Planning the students' training to the budget (`lealla_tf.recipe.planner`)."""

import json

import pytest

from lealla_tf.configs import TrainConfig
from lealla_tf.recipe.planner import (
    BUDGET_PLAN_FILE,
    COMPARISON_STEP_RATIO,
    PLAN_AT_STEP,
    PLAN_SKIP_STEPS,
    PLANNED_WARMUP_STEPS,
    REPLAN_AT_FRACTION,
    BudgetPlanner,
    planned_every,
    read_plan,
    student_run_config,
)
from lealla_tf.recipe.settings import RecipeConfig
from lealla_tf.recipe.stages import Stages


def test_the_plan_is_timed_again_halfway_and_the_end_moves_to_the_budget(tmp_path):
    """Steps 16-50 ran at 2 s (the short buckets came first); the rest of the run
    takes 3 s a step. Halfway the planner times every step so far and moves the
    end so that what is left of the budget pays for the steps and evaluations
    left; once only."""
    stages = Stages(str(tmp_path), log=lambda _: None)
    stages.seconds = {"teacher": 300.0}
    planner = BudgetPlanner(RecipeConfig(time_budget_minutes=40), stages, 185.0, False,
                            str(tmp_path))
    at = PLAN_AT_STEP
    steps = [5.0] * PLAN_SKIP_STEPS + [2.0] * (at - PLAN_SKIP_STEPS)
    measured = {"evaluation_seconds": 10.0, "start_seconds": 40.0, "train_seconds": 84.0}
    plan = planner({**measured, "step": at, "step_seconds": steps, "elapsed_seconds": 150.0})
    planned = plan["train_steps"]
    half = int(REPLAN_AT_FRACTION * planned)
    assert planner({**measured, "step": half - 1, "elapsed_seconds": 1000.0,
                    "step_seconds": steps + [3.0] * (half - 1 - at)}) is None
    # The job has spent 300 s before training and 1,000 s in it.
    stages._stage_started -= 1000.0
    timed = steps + [3.0] * (half - at)
    replan = planner({**measured, "step": half, "step_seconds": timed,
                      "elapsed_seconds": 1000.0})
    per_step = sum(timed[PLAN_SKIP_STEPS:]) / len(timed[PLAN_SKIP_STEPS:])
    every = planned_every(planned)
    evaluations_left = len(range(every * (half // every + 1), planned, every)) + 1
    left = 40 * 60 * 0.95 - stages.elapsed() - 185.0
    expected = int((left - 10.0 * evaluations_left + half * per_step) // per_step)
    assert replan["train_steps"] == pytest.approx(expected, abs=1)
    assert replan["train_steps"] < planned  # slower steps than the plan's: fewer of them
    assert set(replan) == {"train_steps", "time_budget_minutes"}
    recorded = json.loads((tmp_path / BUDGET_PLAN_FILE).read_text())
    assert recorded["replanned_at_step"] == half and recorded["planned_train_steps"] == planned
    assert recorded["train_steps"] == replan["train_steps"]
    assert planner({**measured, "step": half + 1, "step_seconds": timed + [3.0],
                    "elapsed_seconds": 1003.0}) is None


def test_a_resumed_run_keeps_the_plans_spacing_after_a_replan():
    """Resumed after a re-plan to 1,923 steps, the student evaluates and saves at
    the plan's spacing (every 383), not at that of 1,923 (385)."""
    recorded = {"train_steps": 1923, "eval_every": 383, "checkpoint_every": 383,
                "replanned_at_step": 956}
    run = student_run_config(TrainConfig(train_steps=1), RecipeConfig(), 1923, 30.0, recorded)
    assert (run.train_steps, run.eval_every, run.checkpoint_every) == (1923, 383, 383)
    fresh = student_run_config(TrainConfig(train_steps=1), RecipeConfig(), 1923)
    assert fresh.eval_every == planned_every(1923) == 385


def test_the_plan_fits_both_students_and_the_later_stages_in_the_budget(tmp_path):
    stages = Stages(str(tmp_path), log=lambda _: None)
    stages.seconds = {"teacher": 300.0}
    planner = BudgetPlanner(RecipeConfig(time_budget_minutes=40), stages, 185.0, True,
                            str(tmp_path))
    at, skip = PLAN_AT_STEP, PLAN_SKIP_STEPS
    measured = {"step_seconds": [5.0] * skip + [2.0] * (at - skip), "evaluation_seconds": 10.0,
                "start_seconds": 40.0, "train_seconds": 84.0}
    assert planner({**measured, "step": at - 1,
                    "step_seconds": measured["step_seconds"][:at - 1]}) is None
    plan = planner({**measured, "step": at})
    # 40 min x 0.95 - 300 s spent - 185 s after training = 1795 s left; fixed: 5 evaluations
    # of the student's + the comparison's start and 6 evaluations = 143 s, the start being
    # the student's 40 s to its first step less its 10 s evaluation at step 0, plus the
    # 3 s its first step took over the others (tracing); the student's steps already run
    # are not paid again; a step is 2 s (the first `skip` not timed), the comparison's
    # COMPARISON_STEP_RATIO of it: (1795 - 143 + at x 2) / (2 (1 + r)).
    ratio = COMPARISON_STEP_RATIO
    steps = int((1795 - 143 + at * 2) // (2 * (1 + ratio)))
    every = -(-steps // 5)  # five evaluations, the last one at the end
    assert plan["train_steps"] == steps and plan["eval_every"] == every
    assert plan["checkpoint_every"] == every
    own = (steps - at) * 2.0 + 143.0
    assert plan["time_budget_minutes"] == pytest.approx((40 + at * 2 + 4 / 3 * own) / 60)
    recorded = json.loads((tmp_path / BUDGET_PLAN_FILE).read_text())
    assert recorded["train_steps"] == steps and recorded["pairs_per_second"] == 32.0
    assert recorded["comparison_start_seconds"] == 33.0
    assert not recorded["short"] and recorded["spent_seconds"] >= 300.0
    alone = BudgetPlanner(RecipeConfig(time_budget_minutes=40), stages, 185.0, False,
                          str(tmp_path))
    assert alone({**measured, "step": at})["train_steps"] == (1795 - 50 + at * 2) // 2
    slow = BudgetPlanner(RecipeConfig(time_budget_minutes=10), stages, 185.0, True,
                         str(tmp_path))
    assert slow({**measured, "step": at})["train_steps"] == PLANNED_WARMUP_STEPS + 1
    assert slow.plan["short"]
    # The students' configs: fixed steps, or provisional ones the planner decides.
    fixed = student_run_config(TrainConfig(train_steps=1), RecipeConfig(train_steps=500), 500)
    assert (fixed.train_steps, fixed.optimizer.warmup_steps, fixed.eval_every) == (500, 50, 100)
    planned = student_run_config(TrainConfig(train_steps=1), RecipeConfig(), None)
    assert planned.optimizer.warmup_steps == PLANNED_WARMUP_STEPS > PLAN_AT_STEP
    assert planned.checkpoint_every == planned.eval_every == PLANNED_WARMUP_STEPS
    comparison = student_run_config(TrainConfig(train_steps=1), RecipeConfig(), steps, 9.0)
    assert comparison.optimizer.warmup_steps == PLANNED_WARMUP_STEPS
    assert comparison.time_budget_minutes == 9.0


def test_a_run_without_a_plan_reads_as_none(tmp_path):
    assert read_plan(str(tmp_path)) is None and read_plan(str(tmp_path), BUDGET_PLAN_FILE) is None
    (tmp_path / "plan.json").write_text(json.dumps({"train_steps": 40}))
    assert read_plan(str(tmp_path)) == {"train_steps": 40}
