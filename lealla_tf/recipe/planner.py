"""Planning the students' training to the job's time budget: `BudgetPlanner`
(the student's steps, timed on this machine; the only writer of `PLAN_FILE`),
the time guard (`overshoot_guard`; the comparison's share, `comparison_guard`)
and the spacing of evaluations and checkpoints (`planned_every`). What a
student's `TrainConfig` takes of these is decided in one place:
`lealla_tf.recipe.training.student_train_config`.

Importing it loads no TensorFlow: `lealla-recipe`'s flags name its planned
defaults, and its --help answers before TensorFlow loads (tests/cli/test_scripts.py).
"""

import json
import math
import os

from lealla_tf.losses.objectives import parse_objective, reads_teacher
from lealla_tf.recipe.settings import RecipeConfig
from lealla_tf.train.decay import decay_window

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
# The plan keeps this share of the budget in hand (the machine's speed drifts
# after the re-plan; the after-training reserve already holds its own margin).
PLAN_MARGIN = 0.02
# The comparison's step (AMS alone, no teacher pass, past its first step, which
# traces) over the student's, from the main job's report (benchmarks/main_job.py),
# with a margin: the plan scales it by what this machine measures.
COMPARISON_STEP_RATIO = 0.6
# The teacher-free part of the main job's step with the teacher on every row
# (AMS alone over the job's step: benchmarks/training_step.py, its ams_alone and
# job rows); the rest, the teacher's pass and the distillation heads, scales with
# --distilled_rows (`step_share`).
TEACHER_FREE_SHARE = 0.55
# The stages after training, each in units of the main job's step with the
# teacher on every row (the student's step as the plan times it on this
# machine, over its `step_share`): the export (written, then reloaded in a fresh
# process), the evaluations of the export (Tatoeba dev, news) and the mining
# check. Each is the largest ratio of the stage's seconds to the step that the
# main job's reports gave on the machines in docs/benchmarks.md ("The reserve
# after training"), but the export's: its batch-only reload check has run on
# one machine, whose ratio it keeps with a third in hand. A stage that runs
# for the comparison too counts twice.
AFTER_TRAINING_STEPS = {"export": 40.0, "evaluate": 57.0, "news": 7.0, "mine": 58.0}
# The same stages in sentences of the student's dev evaluation at step 0: each
# stage's seconds over that evaluation's seconds a sentence (tracing included),
# from the one main job report whose dev evaluation embeds as the export does
# (docs/benchmarks.md, "The reserve after training"), with a quarter in hand
# (`AFTER_TRAINING_IN_HAND`). That evaluation times the export's embedding path
# and its tracing on this machine; the stages also save and reload the export,
# read the corpora and run the teacher over the mining sets, which the ratios
# hold at that machine's proportions only. The plan keeps the smaller of the
# two reserves (each is an upper bound), and this one only for a job without a
# comparison (its evaluations run in float32, the dev evaluation where the CPU
# has it in bfloat16).
AFTER_TRAINING_SENTENCES = {"export": 34_000, "evaluate": 50_300, "news": 6_800,
                            "mine": 56_500}
AFTER_TRAINING_IN_HAND = 1.25
# The sentences of the dev evaluation those ratios were measured over (the job's
# --eval_max_pairs, 50 pairs of each of 56 languages, both sides). A larger
# evaluation spreads its tracing over more sentences, so its price a sentence is
# taken over this many: never below the calibration's.
DEV_EVALUATION_SENTENCES = 5_600
# Fewer steps than this and the report says the run was cut short by the budget.
SHORT_RUN_STEPS = 300
# The plan's one file, in the student's model_dir: written by the planner only
# (atomically, before the trainer takes the plan, so that a kill leaves the old
# plan or the new one), and read back by a resumed run (`BudgetPlanner.start`).
PLAN_FILE = "plan.json"


def overshoot_guard(spent: float, planned: float) -> float:
    """The time guard, in minutes (the trainer's `time_budget_minutes`), of a run
    that has spent `spent` seconds and plans `planned` more: one that overshoots
    its plan by a third stops."""
    return (spent + 4 / 3 * planned) / 60


def comparison_guard(plan: dict, steps: int) -> float:
    """The comparison's time guard, in minutes (0: none), from the student's
    `plan` (its `train_stage` result's): its own share of a planned budget, its
    start, `steps` at the student's timed step scaled to its own
    (`comparison_step_ratio`), and its evaluations. A student with fixed steps
    planned nothing: no guard."""
    if not plan.get("planned"):
        return 0.0
    start = plan.get("comparison_start_seconds", plan["start_seconds"])
    ratio = plan.get("comparison_step_ratio") or COMPARISON_STEP_RATIO
    return overshoot_guard(0.0, start + steps * plan["seconds_per_step"] * ratio
                           + (PLANNED_EVALUATIONS + 1) * plan["evaluation_seconds"])


def step_share(config: RecipeConfig, rows: float | None = None) -> float:
    """The student's step over the main job's step with the teacher on every
    row, as modelled: the teacher-free part, plus the teacher's part for the
    share of the rows it runs on (`rows`, default `distilled_rows`; none for an
    objective that does not read it)."""
    taught = any(reads_teacher(t) for t in parse_objective(config.objective))
    rows = config.distilled_rows if rows is None else rows
    rows = min(1.0, max(0.0, rows)) if taught else 0.0
    return TEACHER_FREE_SHARE + (1 - TEACHER_FREE_SHARE) * rows


def cooldown_premium(config: RecipeConfig) -> float:
    """How much dearer a step is while the rate decays, with the teacher on
    `cooldown_distilled_rows` of the pairs, than a step before (`step_share`
    at each share): 0 without a cooldown share, below 0 for a smaller one."""
    if not config.cooldown_distilled_rows:
        return 0.0
    return step_share(config, config.cooldown_distilled_rows) / step_share(config) - 1


def planned_warmup(config: RecipeConfig) -> int:
    """The warmup of a run whose steps the plan decides: --warmup_steps, else
    `PLANNED_WARMUP_STEPS`."""
    return config.warmup_steps if config.warmup_steps is not None else PLANNED_WARMUP_STEPS


def cooldown_begins(config: RecipeConfig, steps: float) -> float:
    """The step a planned run of `steps` starts its cooldown at: where its rate
    starts to decay (the trainer's window, `decay_window`, at `planned_warmup`)."""
    return decay_window(float(steps), planned_warmup(config), config.decay_fraction)[0]


def cooldown_seconds(config: RecipeConfig, steps: int, done: int, per_step: float,
                     premium: float) -> float:
    """What the cooldown's share adds to a run of `steps` from step `done` on,
    the steps before it taking `per_step`: `premium` (`cooldown_premium`, or
    as measured) on each cooldown step still to come."""
    if not premium:
        return 0.0
    to_come = steps - max(done, math.ceil(cooldown_begins(config, steps)))
    return premium * per_step * max(0, to_come)


def steps_that_fit(config: RecipeConfig, seconds: float, done: int, per_step: float,
                   ratio: float, premium: float) -> int:
    """The most steps whose time from step `done` on fits in `seconds`: each step
    left `per_step`, the comparison's `ratio` of it for every step, and the
    cooldown's `premium` on its steps still to come (`cooldown_seconds`)."""
    steps = int((seconds + done * per_step) // (per_step * (1 + ratio)))
    if not premium:
        return steps

    def fits(n):
        return ((n - done) * per_step * (1 + ratio) + done * ratio * per_step
                + cooldown_seconds(config, n, done, per_step, premium) <= seconds)

    low, high = done, max(done, 2 * steps + 1)  # a cheaper cooldown fits more steps
    while low < high:  # the time grows with the steps: the last that fits
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def timed_cooldown(config: RecipeConfig, step_seconds: list, steps: int):
    """(the seconds of a step before the cooldown, the cooldown's premium) as
    the steps timed so far show them, in a run planned to `steps`; None when
    fewer than `PLAN_SKIP_STEPS` cooldown steps were timed past its first
    `PLAN_SKIP_STEPS` (their new traces): the re-plan then times every step
    and takes the modelled premium."""
    begins = math.ceil(cooldown_begins(config, steps))
    before = step_seconds[PLAN_SKIP_STEPS:begins]
    during = step_seconds[begins + PLAN_SKIP_STEPS:]
    if not before or len(during) < PLAN_SKIP_STEPS:
        return None
    per_step = sum(before) / len(before)
    return per_step, sum(during) / len(during) / per_step - 1


def after_training_seconds(seconds_per_step: float, comparison: bool,
                           share: float = 1.0,
                           evaluation: tuple[float, int] | None = None) -> float:
    """What the stages after training will take on this machine:
    `AFTER_TRAINING_STEPS` of the student's step (over its `step_share`) or,
    when it is less and the job has no comparison, `AFTER_TRAINING_SENTENCES`
    at the seconds a sentence of the student's dev evaluation at step 0
    (`evaluation`: its seconds and the sentences it embedded, at most
    `DEV_EVALUATION_SENTENCES` counted), `AFTER_TRAINING_IN_HAND` of it."""
    units = dict(AFTER_TRAINING_STEPS)
    if comparison:
        units["evaluate"] *= 2
    reserve = seconds_per_step / share * sum(units.values())
    seconds, embedded = evaluation or (0.0, 0)
    if seconds and embedded and not comparison:
        per_sentence = seconds / min(embedded, DEV_EVALUATION_SENTENCES)
        reserve = min(reserve, AFTER_TRAINING_IN_HAND * per_sentence
                      * sum(AFTER_TRAINING_SENTENCES.values()))
    return reserve


class BudgetPlanner:
    """The student's `planner` (`lealla_tf.train.trainer.Trainer.train`): at step
    `PLAN_AT_STEP` it gives the student (and a comparison, when asked for) the
    steps that fit what is left of `--time_budget_minutes`.

    What is left: the budget less `PLAN_MARGIN`, less what the job has spent
    (`stages.elapsed()`), less the stages after training (`after_training`
    seconds; None: `after_training_seconds` of the step and the dev evaluation
    timed here). It pays
    for the student's remaining steps and evaluations and the comparison's
    start, steps (`COMPARISON_STEP_RATIO` of the student's) and evaluations:
    (n - k) p + n r p + c + fixed = left, for n (c: the cooldown's dearer steps
    still to come, `cooldown_seconds`; `steps_that_fit`). At `REPLAN_AT_FRACTION` of n it
    solves the same for the steps left, with p timed over every step so far
    (`replan`).

    Every decision is written to `PLAN_FILE` before the trainer takes it.
    `recorded`: the plan a killed run wrote; the resumed run follows it
    (`start`), takes its re-plan again at the step it was made, and re-plans
    itself if the killed run had not yet.
    """

    def __init__(self, config: RecipeConfig, stages, after_training: float | None,
                 comparison: bool, model_dir: str, recorded: dict | None = None):
        self.config, self.stages = config, stages
        self.after_training, self.comparison = after_training, comparison
        self.model_dir = model_dir
        self.plan: dict | None = dict(recorded) if recorded else None
        self.resumed_at: int | None = None

    def start(self, steps_done: int) -> dict | None:
        """The settings a run resuming at `steps_done` trains with (None: no plan
        was recorded): the recorded plan, its end the one before the re-plan
        until the step the re-plan was made at."""
        if self.plan is None:
            return None
        self.resumed_at = steps_done
        replanned = self.plan.get("replanned_at_step")
        before = replanned and steps_done < replanned
        end = (self.plan.get("planned_train_steps", self.plan["train_steps"]) if before
               else self.plan["train_steps"])
        guard = self.plan.get("planned_time_budget_minutes") if before else None
        settings = {"train_steps": end,
                    "time_budget_minutes": guard or self.plan.get("time_budget_minutes", 0.0)}
        settings.update({key: self.plan[key] for key in ("eval_every", "checkpoint_every")
                         if key in self.plan})
        return settings

    def __call__(self, measured: dict) -> dict | None:
        step = measured["step"]
        if self.plan is not None:
            replanned = self.plan.get("replanned_at_step")
            if self.resumed_at is not None and replanned:  # a resumed run replays its re-plan
                return ({"train_steps": self.plan["train_steps"],
                         "time_budget_minutes": self.plan["time_budget_minutes"]}
                        if step == replanned and step > self.resumed_at else None)
            return self.replan(measured)
        if step < PLAN_AT_STEP:
            return None
        per_step = self.seconds_per_step(measured)
        evaluation = measured["evaluation_seconds"] or 0.0
        budget = self.config.time_budget_minutes * 60
        spent = self.stages.elapsed()
        after_training = (self.after_training if self.after_training is not None
                          else after_training_seconds(
                              per_step, self.comparison, step_share(self.config),
                              (evaluation, measured.get("evaluation_sentences") or 0)))
        left = budget * (1 - PLAN_MARGIN) - spent - after_training
        # The comparison's step against this student's (cheaper with fewer distilled rows).
        ratio = COMPARISON_STEP_RATIO / step_share(self.config) if self.comparison else 0.0
        # The comparison's start: the student's, less its evaluation at step 0
        # (counted with the others), plus its first step's tracing.
        comparison_start = (max(0.0, measured["start_seconds"] - evaluation)
                            + max(0.0, measured["step_seconds"][0] - per_step))
        fixed = PLANNED_EVALUATIONS * evaluation + self.comparison_seconds(
            comparison_start, evaluation)
        premium = cooldown_premium(self.config)
        steps = steps_that_fit(self.config, left - fixed, step, per_step, ratio, premium)
        steps = max(steps, PLANNED_WARMUP_STEPS + 1)
        own = ((steps - step) * per_step + fixed
               + cooldown_seconds(self.config, steps, step, per_step, premium))
        every = self.config.eval_every or planned_every(steps)
        answer = {"train_steps": steps, "eval_every": every,
                  "checkpoint_every": planned_every(steps),
                  "time_budget_minutes": overshoot_guard(
                      measured["start_seconds"] + step * per_step, own)}
        self.plan = {**answer, "planned": True, "planned_at_step": step,
                     "budget_seconds": budget, "spent_seconds": spent,
                     "after_training_seconds": after_training,
                     "seconds_per_step": per_step, "pairs_per_second":
                     self.config.global_batch_size / per_step,
                     "evaluation_seconds": evaluation,
                     "evaluation_sentences": measured.get("evaluation_sentences"),
                     "start_seconds": measured["start_seconds"],
                     "comparison_start_seconds": comparison_start,
                     "comparison_step_ratio": ratio, "short": steps < SHORT_RUN_STEPS}
        print(f"\nplan: {per_step:.2f} s a step ({self.plan['pairs_per_second']:.1f} pairs/s); "
              f"budget {budget / 60:.0f} min, {spent / 60:.1f} spent, "
              f"{after_training / 60:.1f} kept for after training -> {steps} steps a "
              "student" + (" (short: this machine is slow for the budget)"
                           if self.plan["short"] else ""))
        self.write()
        return answer

    @staticmethod
    def seconds_per_step(measured: dict) -> float:
        """The mean step time past the first `PLAN_SKIP_STEPS` (tracing, new shapes);
        a resumed run with fewer steps timed skips only its first (tracing)."""
        times = measured["step_seconds"]
        timed = times[PLAN_SKIP_STEPS:] if len(times) > 2 * PLAN_SKIP_STEPS else times[1:]
        return float(sum(timed) / max(1, len(timed)))

    def comparison_seconds(self, start: float, evaluation: float) -> float:
        """The comparison's time besides its steps: its start and evaluations."""
        return start + (PLANNED_EVALUATIONS + 1) * evaluation if self.comparison else 0.0

    def replan(self, measured: dict) -> dict | None:
        """At `REPLAN_AT_FRACTION` of the plan (once): the steps that fit what is
        left, timed over every step so far, so the job ends at its budget
        whichever length buckets came first. Only the end moves (the
        evaluations and checkpoints keep their spacing; the last step is
        evaluated and saved anyway)."""
        step, plan = measured["step"], self.plan
        if plan.get("replanned_at_step") or step < max(
                plan["planned_at_step"] + 1, int(REPLAN_AT_FRACTION * plan["train_steps"])):
            return None
        per_step, premium = self.seconds_per_step(measured), cooldown_premium(self.config)
        timed = premium and timed_cooldown(self.config, measured["step_seconds"],
                                           plan["train_steps"])
        if timed:  # the cooldown began before the re-plan: its steps' own price
            per_step, premium = timed
        evaluation = plan["evaluation_seconds"]
        left = (plan["budget_seconds"] * (1 - PLAN_MARGIN) - self.stages.elapsed()
                - plan["after_training_seconds"])
        every = self.config.eval_every or planned_every(plan["train_steps"])
        evaluations_left = len(range(every * (step // every + 1), plan["train_steps"], every)) + 1
        fixed = evaluations_left * evaluation + self.comparison_seconds(
            plan["comparison_start_seconds"], evaluation)
        steps = max(step + 1, steps_that_fit(self.config, left - fixed, step, per_step,
                                             plan["comparison_step_ratio"], premium))
        own = ((steps - step) * per_step + evaluations_left * evaluation
               + cooldown_seconds(self.config, steps, step, per_step, premium))
        answer = {"train_steps": steps,
                  "time_budget_minutes": overshoot_guard(measured["elapsed_seconds"], own)}
        self.plan.update(replanned_at_step=step, planned_train_steps=plan["train_steps"],
                         planned_time_budget_minutes=plan["time_budget_minutes"],
                         seconds_per_step=per_step,
                         pairs_per_second=self.config.global_batch_size / per_step,
                         short=steps < SHORT_RUN_STEPS, **answer)
        print(f"\nre-plan at step {step}: {per_step:.2f} s a step over every step so far -> "
              f"{steps} steps (planned {self.plan['planned_train_steps']})")
        self.write()
        return answer

    def write(self) -> None:
        """`PLAN_FILE`, atomically: a kill leaves the old plan or the new one."""
        path = os.path.join(self.model_dir, PLAN_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(self.plan, f, indent=2)
        os.replace(path + ".tmp", path)


def planned_every(steps: int) -> int:
    """Steps between evaluations (and checkpoints): `PLANNED_EVALUATIONS` of them,
    the last at the last step rather than one beside it."""
    return max(1, -(-steps // PLANNED_EVALUATIONS))


def read_plan(model_dir: str) -> dict | None:
    """The plan a student's run recorded (`PLAN_FILE`), or None."""
    path = os.path.join(model_dir, PLAN_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
