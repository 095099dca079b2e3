"""The main job's students (`lealla_tf.recipe.training`): their training configs
(`student_train_config`, the one turn of the job's flags into them, with the run's
length and what follows from it), the checks that a started student resumes at
its own rate and precision, and the train stage, which a signal does not finish."""

import collections
import dataclasses
import json
import pathlib
import types

import numpy as np
import pytest
from conftest import write_pairs

from lealla_tf.parallel_corpus import find_parallel_files, sample_pairs
from lealla_tf.recipe import training
from lealla_tf.recipe.command_line import recipe_config
from lealla_tf.recipe.planner import PLAN_AT_STEP, PLANNED_WARMUP_STEPS, planned_every
from lealla_tf.recipe.settings import (
    RECIPE_DECAY_FRACTION,
    RECIPE_LEARNING_RATE,
    RECIPE_MARGIN,
    RecipeConfig,
)
from lealla_tf.recipe.stages import StageInterrupted, Stages
from lealla_tf.recipe.training import (
    check_started_precision,
    check_started_rate,
    mixed_precision,
    started_precision,
    student_loss_weights,
    student_train_config,
    teacher_in_step,
    train_stage,
)
from lealla_tf.train import launch
from lealla_tf.train.data import LANGUAGE, pair_dataset

CORPUS = {"deu": 20000, "fra": 2000, "rus": 200}


def test_the_language_temperature_applies_once(tmp_path):
    """The sample gives each language n^alpha of it, and the students' stream
    draws languages as the sample holds them: the stream's language counts match
    n^alpha over the corpus (applied twice, they would be about n^(alpha^2),
    0.45 / 0.32 / 0.23 here instead of 0.57 / 0.29 / 0.14)."""
    for language, size in CORPUS.items():
        write_pairs(tmp_path / "parallel", language,
                    [(f"{language} {i}", f"english {i}") for i in range(size)])
    config = RecipeConfig(language_alpha=0.3, train_steps=10)
    sample = str(tmp_path / "sample")
    sample_pairs(find_parallel_files([str(tmp_path / "parallel")]), 600, sample,
                 alpha=config.language_alpha)
    train = student_train_config(config, pathlib.Path(tmp_path), {"tokenizer": "sentencepiece",
                                                                 "multilingual": True},
                                 "teacher", sample, config.objective,
                                 student_loss_weights(config),
                         in_step=True)
    data = dataclasses.replace(train.data, train_data=[sample], decontaminate=[])
    stream, info = pair_dataset(data, 64)
    drawn = collections.Counter(
        info["languages"][int(pair[LANGUAGE])] for pair in stream.take(3000).as_numpy_iterator())
    powers = {language: size ** config.language_alpha for language, size in CORPUS.items()}
    for language, power in powers.items():
        expected = power / sum(powers.values())
        assert abs(drawn[language] / 3000 - expected) < 0.03, (language, drawn, expected)
    assert np.isclose(train.data.language_alpha, 1.0)


def test_the_students_train_without_dropout_unless_asked():
    """The recipe's students run at `RecipeConfig.dropout` (0), not the preset's 0.1;
    --encoder_overrides still wins."""
    teacher = {"tokenizer": "sentencepiece", "multilingual": True}

    def dropout(**changes):
        config = RecipeConfig(train_steps=10, **changes)
        return student_train_config(config, pathlib.Path("data"), teacher, "teacher", "sample",
                                    config.objective, student_loss_weights(config),
                                    True).encoder.dropout

    assert dropout() == 0.0
    assert dropout(dropout=0.2) == 0.2
    assert dropout(encoder_overrides={"dropout": 0.05}) == 0.05


def test_the_schedule_clip_ams_and_batching_flags_reach_the_students_config():
    config = recipe_config(
        ["--decay_fraction=0.2", "--clip_norm=0", "--scale=50", "--margin=0.2",
         "--cooldown_margin=0.3", "--train_steps=100", "--one_language_batches"])
    train = student_train_config(config, pathlib.Path("data"), {"tokenizer": "sentencepiece",
                                                               "multilingual": True},
                                 "teacher", "sample", config.objective,
                                 student_loss_weights(config))
    assert (train.optimizer.decay_fraction, train.optimizer.clip_norm) == (0.2, 0.0)
    assert (train.loss.scale, train.loss.margin, train.loss.cooldown_margin) == (50.0, 0.2, 0.3)
    assert train.data.one_language_batches
    defaults = student_train_config(RecipeConfig(train_steps=100), pathlib.Path("data"),
                                    {"tokenizer": "sentencepiece", "multilingual": True},
                                    "teacher", "sample", "lealla+hd",
                                    student_loss_weights(RecipeConfig()))
    assert (defaults.optimizer.decay_fraction, defaults.optimizer.clip_norm) == (
        RECIPE_DECAY_FRACTION, 1.0)
    assert defaults.optimizer.learning_rate == RECIPE_LEARNING_RATE
    assert (defaults.loss.scale, defaults.loss.margin) == (100.0, RECIPE_MARGIN)
    assert defaults.loss.cooldown_margin is None
    assert not defaults.data.one_language_batches


def test_hidden_state_distillation_needs_a_sentencepiece_teacher(tmp_path):
    minilm = {"tokenizer": "wordpiece", "multilingual": False}
    with pytest.raises(ValueError, match=r"hidden-state distillation \(hd\).*drop '\+hd'"):
        student_train_config(RecipeConfig(embedding_init="random"), tmp_path, minilm,
                             str(tmp_path / "teacher"), str(tmp_path / "pairs"), "lealla+hd", {})
    e5 = {"tokenizer": "sentencepiece", "multilingual": True}
    with pytest.raises(ValueError, match=r"--vocabulary=teacher_pruned.*drop '\+hd'"):
        student_train_config(RecipeConfig(vocabulary="wordpiece"), tmp_path, e5,
                             str(tmp_path / "teacher"), str(tmp_path / "pairs"), "lealla+hd", {})
    config = student_train_config(RecipeConfig(embedding_init="random"), tmp_path, minilm,
                                  str(tmp_path / "teacher"), str(tmp_path / "pairs"), "lealla", {})
    assert config.embedding_init_source == ""


def test_the_teacher_runs_in_the_step_only_with_hd_and_unless_told_not_to(tmp_path):
    teacher = {"multilingual": True, "tokenizer": "sentencepiece"}
    assert teacher_in_step(RecipeConfig())
    assert not teacher_in_step(RecipeConfig(teacher_in_step=False))
    assert not teacher_in_step(RecipeConfig(objective="lealla"))
    for config, expected in ((RecipeConfig(), True), (RecipeConfig(teacher_in_step=False), False)):
        train = student_train_config(config, tmp_path, teacher, str(tmp_path / "teacher"),
                                     str(tmp_path / "data"), config.objective, {},
                                     teacher_in_step(config))
        assert train.teacher.in_step is expected
    # The AMS-only comparison has no teacher at all; a comparison with fd/ld but no
    # hd reads the same TSVs, so it runs the teacher in its step too.
    for objective, expected in (("ams", False), ("lealla", True)):
        other = student_train_config(RecipeConfig(), tmp_path, teacher,
                                     str(tmp_path / "teacher"), str(tmp_path / "data"),
                                     objective, {}, in_step=True)
        assert other.teacher.in_step is expected
        assert other.embedding_init_source == str(tmp_path / "teacher")
    # A student already started keeps what it started with: an older job's (no
    # in_step setting) resumes on its Beam vectors, whatever the flag says.
    student = tmp_path / "student"
    assert teacher_in_step(RecipeConfig(), str(student))
    student.mkdir()
    (student / "config.json").write_text(json.dumps({"teacher": {"center": False}}))
    assert not teacher_in_step(RecipeConfig(), str(student))
    (student / "config.json").write_text(json.dumps({"teacher": {"in_step": True}}))
    assert teacher_in_step(RecipeConfig(teacher_in_step=False), str(student))


E5 = {"tokenizer": "sentencepiece", "multilingual": True}


def student(config: RecipeConfig, steps, **kwargs):
    return student_train_config(config, pathlib.Path("data"), E5, "teacher", "sample",
                                config.objective, student_loss_weights(config), True, steps,
                                **kwargs)


def test_a_students_length_decides_its_warmup_evaluations_checkpoints_and_guard():
    """n steps: a tenth warming up (the planned job's warmup for a planned job's
    comparison), five evaluations and checkpoints, the last at the end, and the
    guard given; 0: provisional until the plan; None: the flags as they are."""
    fixed = student(RecipeConfig(train_steps=500), 500)
    assert (fixed.train_steps, fixed.optimizer.warmup_steps, fixed.eval_every,
            fixed.checkpoint_every, fixed.time_budget_minutes) == (500, 50, 100, 100, 0.0)
    planned = student(RecipeConfig(), 0)
    assert planned.optimizer.warmup_steps == PLANNED_WARMUP_STEPS > PLAN_AT_STEP
    assert planned.checkpoint_every == planned.eval_every == PLANNED_WARMUP_STEPS
    assert planned.train_steps > PLAN_AT_STEP
    comparison = student(RecipeConfig(), 1923, guard_minutes=9.0)
    assert comparison.optimizer.warmup_steps == PLANNED_WARMUP_STEPS
    assert comparison.time_budget_minutes == 9.0
    assert comparison.eval_every == comparison.checkpoint_every == planned_every(1923) == 385
    given = student(RecipeConfig(train_steps=500, eval_every=30, warmup_steps=7), 500)
    assert (given.eval_every, given.checkpoint_every, given.optimizer.warmup_steps) == (
        30, 100, 7)
    # A planned job's --warmup_steps: the same before its plan and once resumed planned.
    warm = RecipeConfig(warmup_steps=80)
    assert student(warm, 0).optimizer.warmup_steps == student(warm, 1923).optimizer.warmup_steps
    assert student(warm, 0).optimizer.warmup_steps == 80
    flags = student(RecipeConfig(train_steps=503), None)  # a benchmark's row
    assert (flags.train_steps, flags.eval_every, flags.checkpoint_every,
            flags.optimizer.warmup_steps) == (503, 0, 100, 50)


def test_a_resumed_run_keeps_the_plans_spacing_after_a_replan():
    """Resumed after a re-plan to 1,923 steps, the student evaluates and saves at
    the plan's spacing (every 383), not at that of 1,923 (385)."""
    recorded = {"train_steps": 1923, "eval_every": 383, "checkpoint_every": 383,
                "replanned_at_step": 956}
    run = student(RecipeConfig(), 1923, guard_minutes=30.0, recorded=recorded)
    assert (run.train_steps, run.eval_every, run.checkpoint_every) == (1923, 383, 383)
    assert student(RecipeConfig(), 1923).eval_every == planned_every(1923) == 385


def test_a_student_started_at_another_rate_is_named_with_the_flag_that_resumes_it(tmp_path):
    """A work dir begun before the main job's default rates changed resumes only
    with its old rate or --fresh, said in one line (the trainer's own refusal
    lists every differing setting over several lines)."""
    student = tmp_path / "student"
    (student / "checkpoints").mkdir(parents=True)
    (student / "config.json").write_text(json.dumps({"optimizer": {"learning_rate": 5e-4}}))
    check_started_rate(str(student), 2e-3, "--learning_rate")  # no checkpoint: a new start
    (student / "checkpoints" / "ckpt-40.index").write_text("")
    (student / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-40"\n')
    check_started_rate(str(student), 5e-4, "--learning_rate")  # the same rate resumes
    with pytest.raises(ValueError, match=r"started at peak rate 0\.0005, not 0\.002: pass "
                                         r"--learning_rate=0\.0005 to resume it, or --fresh"):
        check_started_rate(str(student), 2e-3, "--learning_rate")


def test_the_training_precision_is_the_flag_the_started_run_or_the_cpus(tmp_path, monkeypatch):
    """--mixed_precision / --no_mixed_precision; without either, a started run keeps
    its own, and a new one trains in bfloat16 where the CPU multiplies it natively."""
    def parsed(*flags):
        return recipe_config(flags).mixed_precision

    assert parsed() is None and parsed("--mixed_precision") is True
    assert parsed("--no_mixed_precision") is False
    for native in (True, False):
        monkeypatch.setattr(training, "bfloat16_arithmetic", lambda native=native: native)
        assert mixed_precision(RecipeConfig()) is native
        assert mixed_precision(RecipeConfig(mixed_precision=not native)) is (not native)
    run = tmp_path / "student"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"mixed_precision": True}))
    assert mixed_precision(RecipeConfig(), str(run)) is True  # started in bfloat16, kept
    assert mixed_precision(RecipeConfig(mixed_precision=False), str(run)) is False


def test_a_student_started_in_another_precision_is_named_with_the_flag_that_resumes_it(
        tmp_path):
    """The opposite precision flag on a started run: one line naming the flag that
    resumes it or --fresh (the trainer's own refusal lists every setting)."""
    student = tmp_path / "student"
    (student / "checkpoints").mkdir(parents=True)
    (student / "config.json").write_text(json.dumps({"mixed_precision": True}))
    assert started_precision(str(student)) is None  # no checkpoint yet: a new start
    check_started_precision(str(student), False)
    (student / "checkpoints" / "ckpt-40.index").write_text("")
    (student / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-40"\n')
    assert started_precision(str(student)) is True
    for wanted in (True, None):
        check_started_precision(str(student), wanted)  # its own precision, or no flag
    with pytest.raises(ValueError, match=r"started in bfloat16, not float32: pass "
                                         r"--mixed_precision \(or neither\) to resume it, or "
                                         r"--fresh"):
        check_started_precision(str(student), False)


@pytest.mark.parametrize("reason", ["stopped by SIGINT",
                                    "stopped with another worker (its signal or time budget)"])
def test_a_training_stopped_by_a_signal_is_not_a_finished_stage(tmp_path, monkeypatch, reason):
    def stopped(config, model_dir, vocab_file, strategy, planner=None):
        return {"reason": reason, "final_step": 3}

    monkeypatch.setattr(launch, "train", stopped)
    stages = Stages(str(tmp_path), log=lambda _: None)
    config = types.SimpleNamespace(train_steps=200)
    with pytest.raises(StageInterrupted, match="step 3 of 200.*rerun the same command"):
        stages.run("train_student", lambda: train_stage(config, "m", "v", None))
    assert not (tmp_path / "stages" / "train_student.json").exists()  # the rerun resumes


def test_a_training_its_time_budget_ended_is_a_finished_stage(tmp_path, monkeypatch):
    """The plan's time guard ends a run short of its steps as planned: the stage
    finishes, and states the plan it ran to."""
    monkeypatch.setattr(launch, "train", lambda *args, **kwargs: {
        "reason": "time budget reached", "final_step": 150})
    result = train_stage(types.SimpleNamespace(train_steps=200), str(tmp_path), "v", None)
    assert result["final_step"] == 150
    assert result["plan"] == {"train_steps": 200, "planned": False}
