"""The main job's students: their `TrainConfig` (`student_train_config`, the one
place the job's flags become a student's settings), the checks that a student
resumes at the rate and in the precision it started with, and training to the
plan (`train_stage`)."""

import math
import os
from typing import Optional

from lealla_tf.configs import (
    DataConfig,
    LossConfig,
    OptimizerConfig,
    TeacherConfig,
    TokenizerConfig,
    TrainConfig,
)
from lealla_tf.losses.objectives import OBJECTIVES, TEACHER_LAYERS, parse_objective, terms_needing
from lealla_tf.machine import bfloat16_arithmetic
from lealla_tf.models.model_dir import (
    CONFIG_FILE,
    latest_checkpoint,
    read_model_config,
)
from lealla_tf.models.presets import get_preset
from lealla_tf.recipe.planner import (
    PLANNED_WARMUP_STEPS,
    BudgetPlanner,
    planned_every,
    planned_warmup,
    read_plan,
)
from lealla_tf.recipe.settings import RecipeConfig, recipe_loss_weights
from lealla_tf.recipe.stages import StageInterrupted
from lealla_tf.train import launch
from lealla_tf.train.resolution import validate_train_config


def student_loss_weights(config: RecipeConfig) -> dict[str, float]:
    """The student's per-term weights: `--loss_weights`, or the recipe's for its
    objective's terms (`RECIPE_LOSS_WEIGHTS`)."""
    return (config.loss_weights if config.loss_weights is not None
            else recipe_loss_weights(config.objective))


def check_learning_rates(config: RecipeConfig) -> None:
    """ValueError naming the flag of a peak rate that is negative or not a number
    (0 is kept as given: a student that does not move)."""
    for flag, rate in (("--learning_rate", config.learning_rate),
                       ("--comparison_learning_rate", config.comparison_learning_rate)):
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"{flag} must be a finite rate >= 0, got {rate!r}")


def teacher_in_step(config: RecipeConfig, student_dir: str | None = None) -> bool:
    """Whether the main job's students take their fd/ld targets from the teacher
    run in the step (the pass the hd term runs), skipping the teacher-vectors
    stage. A student already started in `student_dir` keeps what it was started
    with (an older job's trained on Beam vectors), so it resumes and reports
    what it trained on."""
    if student_dir and os.path.exists(os.path.join(student_dir, CONFIG_FILE)):
        return bool(read_model_config(student_dir)["teacher"].get("in_step", False))
    return config.teacher_in_step and bool(
        terms_needing(parse_objective(config.objective), TEACHER_LAYERS))


def mixed_precision(config: RecipeConfig, run_dir: str | None = None) -> bool:
    """Whether a run trains in bfloat16: `--mixed_precision` / `--no_mixed_precision`,
    else as the run in `run_dir` was started (a run keeps its precision), else
    where this CPU multiplies bfloat16 natively (`lealla_tf.machine`): there the
    main job's student scores about as it does in float32 and trains faster
    (benchmarks/recipe_sweep.py, its float32 and bfloat16 rows)."""
    if config.mixed_precision is not None:
        return config.mixed_precision
    recorded = trained_precision(run_dir) if run_dir else None
    return bfloat16_arithmetic() if recorded is None else recorded


def student_train_config(config: RecipeConfig, data_dir, teacher: dict, teacher_dir: str,
                         data: str, objective: str, loss_weights: dict, in_step: bool = False,
                         steps: int | None = None, guard_minutes: float = 0.0,
                         recorded: dict | None = None) -> TrainConfig:
    """The main job's turn of its flags (`config`) into a student's `TrainConfig`,
    the only one: what the job knows (the `teacher` stage's summary and its
    folder, the training `data`, the student's `objective` and `loss_weights`)
    and the run's length, with every default that follows from it decided here.

    `in_step`: a student whose objective needs teacher vectors gets them from
    the teacher run in the step (`data` is then plain TSV pairs). `steps`:
      - n > 0: a run of n steps (the fixed --train_steps, the plan a killed
        run recorded, or the comparison's: the student's). It warms up over
        --warmup_steps, else `PLANNED_WARMUP_STEPS` in a planned job (the rate
        before the plan must not depend on it), else a tenth of the steps; it
        is evaluated every --eval_every, else at `PLANNED_EVALUATIONS` points
        (`planned_every`), and saved at those points. `recorded` (the plan a
        resumed run made, `plan.json`) keeps the plan's spacing, which a
        re-plan does not move; `guard_minutes` is its time guard
        (`lealla_tf.recipe.planner.overshoot_guard`; 0: none).
      - 0: a planned run before its plan: the `BudgetPlanner` gives the steps,
        spacing and guard at `PLAN_AT_STEP`; until then a provisional length,
        nothing saved or evaluated, and the warmup it keeps once planned
        (--warmup_steps, else `PLANNED_WARMUP_STEPS`).
      - None: the flags as they are (a benchmark's row, trained without the
        job's schedule): --train_steps (at least 1), --eval_every (0: none), a
        checkpoint every fifth of the steps, a tenth of them warming up.
    """
    encoder = get_preset(config.preset).encoder.replace(pooling=config.pooling,
                                                        **{"dropout": config.dropout,
                                                           **config.encoder_overrides})
    embedding_init = config.embedding_init
    sentencepiece = "sentencepiece" in str(teacher.get("tokenizer"))
    if embedding_init != "random" and not sentencepiece:
        raise ValueError(f"--embedding_init={embedding_init} needs a SentencePiece teacher")
    layered = bool(terms_needing(parse_objective(objective), TEACHER_LAYERS))
    if layered and not sentencepiece:
        raise ValueError(f"--objective={objective}: hidden-state distillation (hd) needs a "
                         "SentencePiece teacher (multilingual-e5-small); drop '+hd'")
    if layered and config.vocabulary != "teacher_pruned":
        raise ValueError(f"--objective={objective}: hidden-state distillation (hd) needs the "
                         "student to read the teacher's tokens (--vocabulary=teacher_pruned); "
                         "drop '+hd'")
    in_step = in_step and any(OBJECTIVES[t].needs_teacher for t in parse_objective(objective))
    if steps is None:  # the flags as they are
        length = max(1, config.train_steps)
        warmup = (config.warmup_steps if config.warmup_steps is not None
                  else max(1, config.train_steps // 10))
        eval_every, checkpoint_every = config.eval_every, max(1, config.train_steps // 5)
    elif steps:
        length = steps
        warmup = (planned_warmup(config) if not config.train_steps
                  else config.warmup_steps if config.warmup_steps is not None
                  else max(1, steps // 10))
        recorded = recorded or {}
        eval_every = recorded.get("eval_every", config.eval_every or planned_every(steps))
        checkpoint_every = recorded.get("checkpoint_every", planned_every(steps))
    else:  # planned at PLAN_AT_STEP: nothing saved or evaluated before
        # The warmup a resumed run (n > 0 above) takes too, or its rates would differ.
        length = 100 * PLANNED_WARMUP_STEPS
        warmup = planned_warmup(config)
        eval_every = checkpoint_every = PLANNED_WARMUP_STEPS
    train = TrainConfig(
        preset=config.preset, encoder=encoder,
        tokenizer=TokenizerConfig(max_seq_length=config.max_seq_length),
        # The sample already holds languages at n^language_alpha: the stream
        # draws them as the sample has them (alpha 1), so the temperature
        # applies once and no language's pairs repeat before the others'.
        data=DataConfig(train_data=[data], language_alpha=1.0,
                        decontaminate=[str(data_dir / "tatoeba_dev")],
                        length_buckets=config.length_buckets,
                        one_language_batches=config.one_language_batches, seed=config.seed),
        teacher=TeacherConfig(english_only=not teacher["multilingual"],
                              center=config.teacher_center, in_step=in_step),
        loss=LossConfig(objective=objective, scale=config.scale, margin=config.margin,
                        distilled_rows=config.distilled_rows,
                        cooldown_distilled_rows=config.cooldown_distilled_rows,
                        cooldown_margin=config.cooldown_margin,
                        weights=dict(loss_weights)),
        optimizer=OptimizerConfig(
            learning_rate=config.learning_rate, decay_fraction=config.decay_fraction,
            clip_norm=config.clip_norm, warmup_steps=warmup),
        embedding_init=embedding_init,
        embedding_init_source=(teacher_dir if embedding_init != "random" or layered or in_step
                               else ""),
        global_batch_size=config.global_batch_size, train_steps=length,
        checkpoint_every=checkpoint_every, log_every=10,
        keep_checkpoints=config.keep_checkpoints,
        eval_every=eval_every, tatoeba_dir=str(data_dir / "tatoeba_dev"),
        eval_max_pairs=config.eval_max_pairs, mixed_precision=config.mixed_precision,
        progressive_depth=config.progressive_depth, time_budget_minutes=guard_minutes)
    validate_train_config(train)
    return train


def trained_rate(model_dir: str) -> float | None:
    """The peak rate a student in `model_dir` was trained at (its config.json),
    or None when it has none."""
    if not os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        return None
    return read_model_config(model_dir)["optimizer"]["learning_rate"]


def check_started_rate(model_dir: str, rate: float | None, flag: str) -> None:
    """A student already started in `model_dir` (a checkpoint there) resumes only
    at the rate it started with: ValueError in one line naming it and the flag,
    instead of the trainer's list of differing settings (the default rates of the
    main job changed at 36830e7; a work dir begun before resumes with --fresh or
    its old rate)."""
    started = trained_rate(model_dir)
    if started is None or rate is None or started == rate or latest_checkpoint(model_dir) is None:
        return
    raise ValueError(f"the student in {model_dir} was started at peak rate {started:g}, not "
                     f"{rate:g}: pass {flag}={started:g} to resume it, or --fresh to start over")


def trained_precision(model_dir: str) -> bool | None:
    """Whether a student in `model_dir` was trained in bfloat16 (its config.json),
    or None when it has none."""
    if not os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        return None
    return bool(read_model_config(model_dir).get("mixed_precision", False))


def started_precision(model_dir: str) -> bool | None:
    """Whether the run started in `model_dir` (a checkpoint there) trains in
    bfloat16; None when nothing was started there."""
    recorded = trained_precision(model_dir)
    return None if recorded is None or latest_checkpoint(model_dir) is None else recorded


def check_started_precision(model_dir: str, wanted: bool | None) -> None:
    """A run already started resumes only in its own precision: ValueError in one
    line naming it and the flags, instead of the trainer's list of differing
    settings."""
    started = started_precision(model_dir)
    if started is None or wanted is None or started == wanted:
        return
    name = {True: "bfloat16", False: "float32"}
    raise ValueError(f"the student in {model_dir} was started in {name[started]}, not "
                     f"{name[wanted]}: pass --{'' if started else 'no_'}mixed_precision (or "
                     "neither) to resume it, or --fresh to start over")


def train_stage(train: "TrainConfig", model_dir: str, vocab_file: str, strategy,
                planner: Optional["BudgetPlanner"] = None) -> dict:
    """Trains (with `planner`, a run that decides its own length); a run stopped
    by a signal (Ctrl-C, SIGTERM) raises `StageInterrupted` instead of passing a
    half-trained student on to export and evaluation."""
    result = launch.train(train, model_dir, vocab_file, strategy, planner=planner)
    plan = read_plan(model_dir) if planner is not None else None  # this run's, or the killed one's
    target = plan["train_steps"] if plan else train.train_steps
    if result["final_step"] < target and not result["reason"].startswith(
            "time budget"):  # a signal; the plan's time guard ends the stage as planned
        raise StageInterrupted(
            f"training {model_dir} {result['reason']} at step {result['final_step']} of "
            f"{target}; its checkpoint is saved: rerun the same command to resume")
    result["plan"] = plan or {"train_steps": target, "planned": False}
    return result
