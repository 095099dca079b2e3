"""benchmarks/recipe_sweep.py: which rows it accepts, and what it refuses before
anything trains (a row's training is the main job's own, tested in tests/recipe)."""

import json
import os

import pytest

from benchmarks.recipe_sweep import main, parse_variant, resolved_recipe
from lealla_tf.recipe.command_line import recipe_config


def test_a_recipe_sweep_row_changes_only_training_flags(tmp_path, capsys):
    """benchmarks/recipe_sweep.py: a row is the main job with training flags
    or sample flags changed (a row then draws its own sample); a flag that needs
    another teacher or vocabulary, a non-hd objective
    that needs Beam teacher vectors, a setting the main job would refuse, an
    unknown flag or a malformed row is refused, naming it, before anything trains."""
    name, argv = parse_variant("lr1e-3=--learning_rate=1e-3 --train_steps=300")
    assert name == "lr1e-3" and argv == ["--learning_rate=1e-3", "--train_steps=300"]
    config = recipe_config(argv)
    assert (config.learning_rate, config.train_steps) == (1e-3, 300)
    assert parse_variant("main_job=") == ("main_job", [])
    assert parse_variant("ams=--objective=ams")[1] == ["--objective=ams"]
    assert parse_variant("hot=--language_alpha=0.7")[1] == ["--language_alpha=0.7"]
    for bad, named in (("big=--vocab_size=5000", "--vocab_size"),
                       ("more=--preset=lealla_base", "--preset"),
                       ("beam=--objective=lealla", "teacher vectors"),
                       ("slow=--learning_rate=-1", "--learning_rate"),
                       ("none=--global_batch_size=0", "--global_batch_size"),
                       ("typo=--lerning_rate=1", "unrecognized arguments"),
                       ("no flags", "NAME=FLAGS"), ("=--train_steps=3", "NAME=FLAGS")):
        with pytest.raises(ValueError, match=named):
            parse_variant(bad)
    # No finished main job in the work dir: one line naming what to run, exit 2
    # (with a data directory, so that this holds on a machine without ../shared/data).
    data = tmp_path / "data"
    for folder in ("parallel", "tatoeba_dev"):
        (data / folder).mkdir(parents=True)
    out = str(tmp_path / "out.json")
    assert main([f"--work_dir={tmp_path}", f"--data_dir={data}", "--variant=a=",
                 "--output_json", out]) == 2
    assert "run the main job" in capsys.readouterr().err
    # A finished main job (its stage markers), and rows left by earlier runs.
    work = tmp_path / "work"
    (work / "stages").mkdir(parents=True)
    for stage in ("teacher", "vocabulary", "sample"):
        (work / "stages" / f"{stage}.json").write_text('{"result": {}}')
    (work / "sweep").mkdir()
    common = [f"--work_dir={work}", f"--data_dir={data}", "--output_json", out]
    # A row trained under other settings than its flags give now (a default moved):
    # refused, not silently reused; the message names the file and its folder.
    (work / "sweep" / "old.json").write_text(json.dumps(
        {"flags": [], "recipe": resolved_recipe(["--learning_rate=5e-4"])}))
    assert main(common + ["--variant=old="]) == 2
    assert "other settings" in capsys.readouterr().err
    # A half-written row or output: one line naming it, no traceback.
    (work / "sweep" / "cut.json").write_text('{"flags": [')
    assert main(common + ["--variant=cut="]) == 2
    assert "cut.json cannot be read" in capsys.readouterr().err
    assert not os.path.exists(out)


def test_a_row_finished_before_a_flag_was_added_matches_at_its_value():
    """A row recorded before `--cooldown_distilled_rows` and `--cooldown_margin`
    existed trained without them (0, unset): it matches today's defaults and no
    other value."""
    from benchmarks.recipe_sweep import recorded_recipe

    today = resolved_recipe(["--train_steps=500"])
    older = {key: value for key, value in today.items()
             if key not in ("cooldown_distilled_rows", "cooldown_margin")}
    assert recorded_recipe({"recipe": older}) == today
    for added in ("--cooldown_distilled_rows=1", "--cooldown_margin=0.3"):
        assert recorded_recipe({"recipe": older}) != resolved_recipe(["--train_steps=500", added])
    assert recorded_recipe({}) == {}


def test_a_row_the_trainer_refuses_stops_the_sweep_naming_the_row(tmp_path, capfd):
    """A row whose training is refused (here: the job's teacher stage names no
    SentencePiece teacher for the student's embedding init) exits 2 with the
    reason, no traceback, and a line naming the row."""
    data = tmp_path / "data"
    for folder in ("parallel", "tatoeba_dev"):
        (data / folder).mkdir(parents=True)
    work = tmp_path / "work"
    (work / "stages").mkdir(parents=True)
    for stage in ("teacher", "sample"):
        (work / "stages" / f"{stage}.json").write_text('{"result": {}}')
    (work / "stages" / "vocabulary.json").write_text(json.dumps(
        {"result": {"output": str(work / "vocab.model")}}))
    out = str(tmp_path / "out.json")
    assert main([f"--work_dir={work}", f"--data_dir={data}", "--variant=gone=",
                 "--output_json", out]) == 2
    err = capfd.readouterr().err  # the row trains in a child process
    assert "error: gone: --embedding_init=teacher_select needs a SentencePiece teacher" in err
    assert "gone: stopped with exit 2" in err and "Traceback" not in err, err
    assert not os.path.exists(out)
