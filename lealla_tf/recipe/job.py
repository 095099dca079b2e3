"""The main job end to end: `run_recipe(config) -> report`.

Its stages are one table, `STAGES`, read top to bottom: each stage's name, the
flags its output depends on besides every earlier stage's (its marker records
them all: `stage_settings`), what it runs (a `Job` method calling the library's
stage function), and when it runs, if not always. `_run_job` checks the flags
and inputs before anything is written (`lealla_tf.recipe.checks`), claims the
work dir, walks the table (`lealla_tf.recipe.stages.Stages` runs each stage
once) and writes the report (`lealla_tf.recipe.report`).
"""

import contextlib
import dataclasses
import functools
import os
import pathlib
from collections.abc import Callable

from lealla_tf.configs import TrainConfig
from lealla_tf.folder_lock import release_folder
from lealla_tf.inference.loaders import load_embedder
from lealla_tf.machine import bfloat16_arithmetic
from lealla_tf.recipe.checks import check_inputs
from lealla_tf.recipe.corpus import news_set_stage, sample_stage, vocabulary_stage
from lealla_tf.recipe.evaluations import (
    check_sentences,
    evaluate_stage,
    export_stage,
    mine_stage,
    news_stage,
)
from lealla_tf.recipe.planner import BudgetPlanner, comparison_guard, read_plan
from lealla_tf.recipe.report import build_report, write_report
from lealla_tf.recipe.settings import (
    COMPARISON,
    STUDENT,
    STUDENT_ON_TEACHER_PAIRS,
    TEACHER,
    RecipeConfig,
    find_data_dir,
)
from lealla_tf.recipe.stages import Models, Stages
from lealla_tf.recipe.teacher_stages import (
    choose_teacher_backend,
    converted_teacher,
    embed_teacher_vectors,
)
from lealla_tf.recipe.training import (
    check_started_precision,
    check_started_rate,
    mixed_precision,
    started_precision,
    student_loss_weights,
    student_train_config,
    teacher_in_step,
    train_stage,
    trained_rate,
)
from lealla_tf.recipe.work_dir import claim_work_dir
from lealla_tf.teachers.layers import teacher_embedder
from lealla_tf.train.distribution import make_strategy

# The student's export, under the work dir.
EXPORT = os.path.join("export", "lealla_small")


@dataclasses.dataclass
class Job:
    """What the stages share: the flags, the data directory, the stage runner and
    the model cache, and each stage's result so far (`results`, by stage name).
    After the teacher stage, `check_students` sets what the students train
    with: each one's objective, loss weights and flags (`runs`, by student),
    whether the teacher runs in their training step (`in_step`) and their
    training data (`data`).

    Each stage's method calls the library's stage function with what the job
    holds and returns its result; the folders are the work dir's (`path`)."""

    config: RecipeConfig
    data_dir: pathlib.Path
    stages: Stages
    models: Models
    results: dict[str, dict] = dataclasses.field(default_factory=dict)
    runs: dict[str, tuple[str, dict, RecipeConfig]] = dataclasses.field(default_factory=dict)
    in_step: bool = False
    data: str = ""

    def __post_init__(self):
        # The teacher embeds in bfloat16 where this CPU multiplies it natively: its
        # evaluations (Tatoeba, news, mining) cost less at the module's scores. The
        # student's float32 export is evaluated in the same precision
        # (`export_precision`), so the report's speeds compare the two models as a
        # user of this CPU would run them.
        self.teacher_precision = "bfloat16" if bfloat16_arithmetic() else "float32"
        teacher, export = self.path("teacher"), self.path(EXPORT)
        self.models.register(teacher, lambda: teacher_embedder(
            teacher, self.teacher_precision == "bfloat16"))
        self.models.register(export, lambda: load_embedder(
            export, precision="bfloat16" if self.export_precision() == "bfloat16" else None))

    def export_precision(self) -> str:
        """The precision the student's export is evaluated in: the teacher's, or
        float32 beside a comparison student, which is evaluated from its model
        directory in float32: the distillation's gain then compares like with like."""
        return "float32" if COMPARISON in self.runs else self.teacher_precision

    def path(self, name: str) -> str:
        """A folder of the work dir: "teacher", "sample", "pairs_teacher" (the
        teacher's vectors), a student's (`STUDENT`, `COMPARISON`), `EXPORT`,
        "news", "bucc", "report"."""
        return os.path.join(self.config.work_dir, name)

    @property
    def tatoeba_dir(self) -> str:
        return str(self.data_dir / "tatoeba_dev")

    @property
    def vocabulary_file(self) -> str:
        return self.results["vocabulary"]["output"]

    @functools.cached_property
    def strategy(self):
        """The training strategy (--strategy, --tpu), made when a student first trains."""
        return make_strategy(self.config.strategy, self.config.tpu or None)

    def check_students(self) -> None:
        """Right after the teacher stage: each student's flags (a started one
        keeps its rate, precision and teacher in the step) and its `TrainConfig`,
        so that an option the teacher cannot serve is refused before minutes of
        sampling and teacher vectors, not after."""
        config = self.config
        self.in_step = teacher_in_step(config, self.path(STUDENT))
        if self.in_step != teacher_in_step(config):
            print(f"teacher vectors: the student in {self.path(STUDENT)} was started "
                  f"{'with' if self.in_step else 'without'} the teacher in the step and keeps "
                  "that; --fresh to start over")
        # With the teacher run in the step, both students read the sample itself.
        self.data = self.path("sample") if self.in_step else self.path("pairs_teacher")
        runs = {STUDENT: (config.objective, student_loss_weights(config), config.learning_rate)}
        if config.comparison_objective:
            runs[COMPARISON] = (config.comparison_objective, {}, config.comparison_learning_rate)
        for name, (objective, weights, rate) in runs.items():
            check_started_rate(self.path(name), rate, "--learning_rate" if name == STUDENT
                               else "--comparison_learning_rate")
            check_started_precision(self.path(name), config.mixed_precision)
            self.runs[name] = (objective, weights, dataclasses.replace(
                config, learning_rate=rate, mixed_precision=mixed_precision(config,
                                                                            self.path(name))))
        for name in self.runs:
            self.student_config(name, config.train_steps)
        if config.mixed_precision is None:
            precision = self.precision(STUDENT)
            if started_precision(self.path(STUDENT)) is not None:
                print(f"training precision: {precision} (the student in {self.path(STUDENT)} "
                      "was started so and keeps it; --fresh to start over)")
            else:
                print(f"training precision: {precision} (the default on this CPU: bfloat16 "
                      "where it multiplies it natively; --mixed_precision / "
                      "--no_mixed_precision to choose)")

    def precision(self, name: str) -> str:
        return "bfloat16" if self.runs[name][2].mixed_precision else "float32"

    def student_config(self, name: str, steps: int, guard_minutes: float = 0.0,
                       recorded: dict | None = None) -> TrainConfig:
        """Student `name`'s `TrainConfig` (`student_train_config`) for `steps`
        (0: planned by its `BudgetPlanner`)."""
        objective, weights, config = self.runs[name]
        return student_train_config(config, self.data_dir, self.results["teacher"],
                                    self.path("teacher"), self.data, objective, weights,
                                    self.in_step, steps, guard_minutes, recorded)

    def students(self) -> dict[str, dict]:
        """What the report states of each student (`build_report`)."""
        return {name: {"loss_weights": weights, "learning_rate": trained_rate(self.path(name)),
                       "precision": self.precision(name)}
                for name, (_, weights, _) in self.runs.items()}

    # === The stages ===

    def teacher(self) -> dict:
        return converted_teacher(self.config.teacher, self.path("teacher"))

    def vocabulary(self) -> dict:
        return vocabulary_stage(self.config, self.data_dir, self.path("teacher"),
                                self.config.work_dir)

    def sample(self) -> dict:
        return sample_stage(self.config, self.data_dir, self.path("sample"))

    def news_set(self) -> dict:
        return news_set_stage(self.config, self.data_dir, self.path("news"))

    def teacher_evaluation(self) -> dict:
        """The teacher on Tatoeba dev and the news set, before training: its time
        tells the plan this machine's speed."""
        teacher = self.path("teacher")
        return {"precision": self.teacher_precision,
                "tatoeba": evaluate_stage({TEACHER: (teacher, self.config.teacher_eval_pairs)},
                                          self.tatoeba_dir, self.models)[TEACHER],
                "news": news_stage({TEACHER: teacher}, self.path("news"),
                                   self.results["news_set"]["languages"],
                                   self.vocabulary_file, self.models)}

    def teacher_vectors(self) -> dict:
        config, sample = self.config, self.path("sample")
        backend = choose_teacher_backend(config.teacher, self.path("teacher"),
                                         config.teacher_backend, config.truncate_teacher,
                                         sample, self.models.get)
        return embed_teacher_vectors(sample, backend, self.path("pairs_teacher"),
                                     config.beam_workers,
                                     not self.results["teacher"]["multilingual"],
                                     config.max_seq_length if config.truncate_teacher else None)

    def vectors_in_step(self) -> dict:
        """What stands for the teacher_vectors stage when the teacher runs in the step."""
        print("teacher vectors: from the teacher pass in each training step (hd); no stage")
        return {"backend": {"backend": "in_step", "model": self.path("teacher")}}

    def train_student(self) -> dict:
        """Fixed --train_steps, or the steps a `BudgetPlanner` plans to the budget;
        a killed planned run resumes with the plan it recorded (`BudgetPlanner.start`)."""
        config = self.config
        if config.train_steps:
            return self.train(STUDENT, self.student_config(STUDENT, config.train_steps), None)
        recorded = read_plan(self.path(STUDENT))
        planner = BudgetPlanner(config, self.stages, None, COMPARISON in self.runs,
                                self.path(STUDENT), recorded)
        steps = (recorded or {}).get("train_steps", 0)  # 0: the planner decides
        return self.train(STUDENT, self.student_config(STUDENT, steps, recorded=recorded),
                          planner)

    def train_comparison(self) -> dict:
        """The student's steps, in the comparison's own share of a planned budget."""
        student = self.results[f"train_{STUDENT}"]
        steps = student["final_step"]
        return self.train(COMPARISON, self.student_config(
            COMPARISON, steps, comparison_guard(student["plan"], steps)), None)

    def train(self, name: str, train: TrainConfig, planner: BudgetPlanner | None) -> dict:
        """Trains student `name` (`train_stage`). Training seeds TensorFlow, so the
        models loaded before it, and by it, are dropped (`Models.clear`)."""
        self.models.clear()
        result = train_stage(train, self.path(name), self.vocabulary_file, self.strategy,
                             planner)
        self.models.clear()
        return result

    def export(self) -> dict:
        return export_stage(self.path(STUDENT), self.path(EXPORT),
                            check_sentences(self.tatoeba_dir), self.models)

    def evaluate(self) -> dict:
        """Tatoeba dev: the export and the comparison on all pairs, and the export
        on the teacher's pairs too when the teacher was evaluated on fewer."""
        evaluated = {STUDENT: (self.path(EXPORT), 0)}
        if COMPARISON in self.runs:
            evaluated[COMPARISON] = (self.path(COMPARISON), 0)
        if self.config.teacher_eval_pairs:
            evaluated[STUDENT_ON_TEACHER_PAIRS] = (self.path(EXPORT),
                                                   self.config.teacher_eval_pairs)
        results = evaluate_stage(evaluated, self.tatoeba_dir, self.models)
        for name, (path, _) in evaluated.items():
            results[name]["precision"] = (self.export_precision() if path == self.path(EXPORT)
                                          else "float32")
        return results

    def news(self) -> dict:
        return news_stage({STUDENT: self.path(EXPORT)}, self.path("news"),
                          self.results["news_set"]["languages"], self.vocabulary_file,
                          self.models)

    def mine(self) -> dict:
        return mine_stage(self.config, self.data_dir, self.path("sample"), self.path("bucc"),
                          {STUDENT: self.path(EXPORT), TEACHER: self.path("teacher")},
                          self.path("report"), self.models)


@dataclasses.dataclass(frozen=True)
class Stage:
    """A row of `STAGES`: the stage's name (its marker: stages/<name>.json), the
    flags its output depends on besides every earlier stage's, and the `Job`
    method it runs; `when`: whether the job runs it (None: always), `otherwise`:
    what stands for its result when it does not, `after`: what the job does
    next, whether the stage ran or was reused."""

    name: str
    flags: tuple[str, ...]
    run: Callable[[Job], dict]
    when: Callable[[Job], bool] | None = None
    otherwise: Callable[[Job], dict] | None = None
    after: Callable[[Job], None] | None = None


# The flags a student's training depends on (its `TrainConfig`, its plan, its strategy).
TRAINING_FLAGS = (
    "preset", "pooling", "encoder_overrides", "dropout", "embedding_init", "objective",
    "loss_weights", "comparison_objective", "comparison_learning_rate", "teacher_center",
    "time_budget_minutes", "train_steps", "global_batch_size", "length_buckets",
    "one_language_batches", "learning_rate", "warmup_steps", "decay_fraction", "clip_norm",
    "scale", "margin", "cooldown_margin", "distilled_rows", "cooldown_distilled_rows",
    "progressive_depth",
    "eval_every", "eval_max_pairs", "mixed_precision", "strategy")

# The main job, in the order it runs its stages (`lealla_tf.recipe` says what each makes).
STAGES = (
    Stage("teacher", ("data_dir", "teacher"), Job.teacher, after=Job.check_students),
    Stage("vocabulary", ("vocabulary", "vocab_size"), Job.vocabulary),
    Stage("sample", ("sample_pairs", "language_alpha", "seed"), Job.sample),
    Stage("news_set", ("news_languages",), Job.news_set),
    Stage("teacher_evaluation", ("teacher_backend", "teacher_eval_pairs", "truncate_teacher"),
          Job.teacher_evaluation),
    Stage("teacher_vectors", ("teacher_in_step", "max_seq_length", "beam_workers"),
          Job.teacher_vectors, when=lambda job: not job.in_step,
          otherwise=Job.vectors_in_step),
    Stage(f"train_{STUDENT}", TRAINING_FLAGS, Job.train_student),
    Stage(f"train_{COMPARISON}", (), Job.train_comparison,
          when=lambda job: COMPARISON in job.runs),  # --comparison_objective
    Stage("export", (), Job.export),
    Stage("evaluate", (), Job.evaluate),
    Stage("news", (), Job.news),
    Stage("mine", ("bucc_languages", "bucc_gold", "bucc_distractors"), Job.mine),
)


def stage_settings(config: RecipeConfig, data_dir, precision: bool) -> dict[str, dict]:
    """The flags each stage's output depends on: its own (`STAGES`) and every
    earlier stage's (`Stages.run(settings=)`)."""
    values = dataclasses.asdict(config)
    values.update(data_dir=str(data_dir), mixed_precision=precision)
    settings, flags = {}, []
    for stage in STAGES:
        flags += stage.flags
        settings[stage.name] = {flag: values[flag] for flag in flags}
    return settings


def run_recipe(config: RecipeConfig, fresh: bool = False) -> dict:
    """Runs the main job (see the module docstring); returns the report. The
    job is its --work_dir's one writer until it returns (`claim_work_dir`)."""
    with contextlib.ExitStack() as exits:
        return _run_job(config, fresh, exits)


def _run_job(config: RecipeConfig, fresh: bool, exits: contextlib.ExitStack) -> dict:
    data_dir = find_data_dir(config.data_dir)
    check_inputs(config, data_dir)
    exits.callback(release_folder, claim_work_dir(config.work_dir, fresh))
    os.makedirs(os.path.join(config.work_dir, "report"), exist_ok=True)
    print(f"data: {data_dir}\nwork: {config.work_dir}")
    job = Job(config, data_dir, Stages(config.work_dir), Models())
    settings = stage_settings(config, data_dir, mixed_precision(config, job.path(STUDENT)))
    job.stages.check_settings(settings)
    for stage in STAGES:
        if stage.when is None or stage.when(job):
            job.results[stage.name] = job.stages.run(
                stage.name, functools.partial(stage.run, job), settings[stage.name])
        elif stage.otherwise is not None:
            job.results[stage.name] = stage.otherwise(job)
        if stage.after is not None:
            stage.after(job)
    report = build_report(config, data_dir, job.results, job.students(), job.stages.summary())
    write_report(report, {name: job.path(name) for name in job.runs})
    return report
