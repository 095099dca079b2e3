"""The main job's stage runner (`lealla_tf.recipe.stages`): a finished stage is
reused only with the flags it was made with, an interrupted one leaves no marker,
and each model is loaded once for every stage."""

import json

import pytest

from lealla_tf.recipe import stages as stage_runner
from lealla_tf.recipe.stages import Models, StageInterrupted, Stages, check_same_settings


def test_stage_runner_reuses_finished_stages_only(tmp_path):
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


def test_a_finished_stage_is_reused_only_with_the_flags_it_was_made_with(tmp_path):
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


def test_every_differing_flag_is_named_in_one_line():
    check_same_settings("sample", {"a": 1}, None)  # nothing asked: nothing to compare
    with pytest.raises(ValueError) as raised:
        check_same_settings("sample", {"a": 1, "b": [1, 2], "c": "x"},
                            {"a": 2, "b": (1, 2), "d": "y"})
    message = str(raised.value)
    assert "\n" not in message and "the work dir's sample stages were made with" in message
    # A tuple flag compares as the list JSON stored.
    assert "--a=1 (now 2), --c='x' (now None), --d=None (now 'y')" in message


def test_a_stage_made_before_a_flag_existed_matches_the_value_it_trained_with():
    """The training stage's settings gained --decay_fraction, --clip_norm, --scale
    and --margin after work dirs recorded theirs: a marker without them matches
    the values those runs used, and nothing else."""
    before = {"train_steps": 10}
    check_same_settings("train_student", before, {"train_steps": 10, "decay_fraction": 1.0,
                                                  "clip_norm": 1.0, "scale": 100.0,
                                                  "margin": 0.3})
    with pytest.raises(ValueError, match=r"--margin=0.3 \(now 0.2\)"):
        check_same_settings("train_student", before, {"train_steps": 10, "margin": 0.2})


def test_a_stage_stopped_by_ctrl_c_leaves_no_marker(tmp_path):
    stages = Stages(str(tmp_path), log=lambda _: None)

    def ctrl_c():
        raise KeyboardInterrupt  # e.g. in the Beam teacher-vector stage

    with pytest.raises(StageInterrupted, match="teacher_vectors interrupted"):
        stages.run("teacher_vectors", ctrl_c)
    assert not (tmp_path / "stages" / "teacher_vectors.json").exists()
    assert stages.elapsed() >= 0 and "teacher_vectors" not in stages.seconds


def test_each_model_is_loaded_once_until_the_cache_is_cleared(monkeypatch):
    loaded = []
    monkeypatch.setattr(stage_runner, "load_embedder",
                        lambda path: loaded.append(path) or f"embedder of {path}")
    models = Models()
    assert models.get("export") == models.get("export") == "embedder of export"
    models.get("teacher")
    assert loaded == ["export", "teacher"]
    models.clear()
    models.get("export")
    assert loaded == ["export", "teacher", "export"]
    # A path registered with its own loader (the teacher in its precision) keeps it
    # across clears.
    models.register("teacher", lambda: "the teacher in bfloat16")
    models.clear()
    assert models.get("teacher") == "the teacher in bfloat16"
    assert loaded == ["export", "teacher", "export"]
