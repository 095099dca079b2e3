"""benchmarks/long_run.py: the main job it starts (its flags, a failure passed on
with the way to resume), and the checkpoints it evaluates. A whole run is the main
job's (tests/recipe/test_job.py runs one on tiny data)."""

import pytest

from benchmarks import long_run


def test_the_job_gets_the_steps_the_checkpoints_and_the_flags_after_dashes(tmp_path, capsys,
                                                                          monkeypatch):
    """A job that stops gives its status and the way to resume; nothing is written."""
    started = []
    monkeypatch.setattr(long_run, "run_passing_stop_signals",
                        lambda command: started.append(command) or 2)
    output = tmp_path / "long.json"
    code = long_run.main([f"--work_dir={tmp_path / 'long'}", "--train_steps=10",
                          "--checkpoints=4", f"--output_json={output}", "--",
                          "--sample_pairs=500"])
    assert code == 2 and not output.exists()
    (command,) = started
    assert command[1:3] == ["-m", "lealla_tf.recipe"]
    assert command[3:] == [f"--work_dir={tmp_path / 'long'}", "--train_steps=10",
                           "--eval_every=3", "--keep_checkpoints=5", "--sample_pairs=500"]
    assert "rerun the same command to resume it" in capsys.readouterr().err


def test_a_model_dir_without_checkpoints_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoints in"):
        long_run.kept_checkpoints(str(tmp_path))


@pytest.mark.parametrize("flags", [["--train_steps=0"], ["--checkpoints=0"]])
def test_counts_must_be_positive(tmp_path, capsys, flags):
    with pytest.raises(SystemExit):
        long_run.main([f"--output_json={tmp_path / 'r.json'}", *flags])
    assert "must be positive" in capsys.readouterr().err
