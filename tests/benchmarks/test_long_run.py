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


def test_branches_make_the_job_a_constant_rate_trunk(tmp_path, monkeypatch):
    """With --branches the job holds its rate until its last --cooldown, and keeps
    a checkpoint at every branch point."""
    started = []
    monkeypatch.setattr(long_run, "run_passing_stop_signals",
                        lambda command: started.append(command) or 2)
    long_run.main([f"--work_dir={tmp_path / 'long'}", "--train_steps=10", "--branches=4",
                   "--cooldown=0.2", "--warmup_steps=2", f"--output_json={tmp_path / 'r.json'}"])
    (command,) = started
    # decay over the last 2 of the 8 steps after warmup; every checkpoint (each
    # 2 steps, a fifth of 10) kept
    assert command[3:] == [f"--work_dir={tmp_path / 'long'}", "--train_steps=10",
                           "--warmup_steps=2", "--decay_fraction=0.250000",
                           "--keep_checkpoints=6"]
    assert long_run.cooldown_end(800, 0.2) == 1000


@pytest.mark.parametrize("flags, message", [
    (["--branches=9"], "before the trunk's decay starts"),
    (["--branches=1"], "after the warmup"),
    (["--branches=x"], "comma-separated"),
    (["--branches=5"], "multiples of 2"),
    (["--cooldown=1"], "--cooldown")])
def test_branches_must_lie_on_the_constant_part(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        long_run.main(["--train_steps=10", "--warmup_steps=2",
                       f"--output_json={tmp_path / 'r.json'}", *flags])
    assert message in capsys.readouterr().err


def test_a_cooldown_branch_resumes_the_trunks_checkpoint_and_decays(
        sentence_vocab_file, tiny_parallel_dir, tmp_path):
    """The branch copies the trunk's checkpoint at its point, trains to its end
    with the rate decaying from the point, leaves the trunk as it was, and is
    reused once finished."""
    import dataclasses
    import json

    from conftest import Trainer, tiny_config, vocab_size

    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=6, checkpoint_every=2, keep_checkpoints=5)
    config.optimizer = dataclasses.replace(config.optimizer, warmup_steps=1,
                                           decay_fraction=0.2)
    trunk = tmp_path / "trunk"
    Trainer(config, str(trunk), None, sentence_vocab_file, progress=False).train()
    before = sorted(p.name for p in (trunk / "checkpoints").iterdir())
    final = long_run.cooldown_branch(str(trunk), 4, 5, str(tmp_path / "branch"))
    assert final.endswith("ckpt-5") and long_run.kept_checkpoints(str(tmp_path / "branch"))
    rates = [json.loads(line)["learning_rate"]
             for line in (tmp_path / "branch" / "train_log.jsonl").read_text().splitlines()]
    assert rates == [pytest.approx(0.0, abs=1e-9)]  # one step, decayed to its end
    assert json.loads((tmp_path / "branch" / "branch.json").read_text())["point"] == 4
    assert sorted(p.name for p in (trunk / "checkpoints").iterdir()) == before
    assert long_run.cooldown_branch(str(trunk), 4, 5, str(tmp_path / "branch")) == final
