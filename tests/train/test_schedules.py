"""The learning-rate schedule: warmup, then linear decay or warmup-stable-decay,
and a constant-rate run's checkpoint branching into a cooldown."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
from conftest import Trainer, tiny_config, vocab_size

from lealla_tf.train.resolution import validate_train_config
from lealla_tf.train.schedules import WarmupLinearDecay


def test_warmup_then_linear_decay():
    schedule = WarmupLinearDecay(1e-3, warmup_steps=10, total_steps=110, end_fraction=0.1)
    values = [float(schedule(s)) for s in (0, 9, 10, 60, 110, 500)]
    np.testing.assert_allclose(values, [1e-4, 1e-3, 1e-3, 5.5e-4, 1e-4, 1e-4], rtol=1e-5)


def test_without_warmup_the_decay_starts_at_step_1():
    schedule = WarmupLinearDecay(1e-3, warmup_steps=0, total_steps=100)
    values = [float(schedule(s)) for s in (0, 1, 51, 101)]
    np.testing.assert_allclose(values, [1e-3, 1e-3, 5e-4, 0.0], atol=1e-9)


def test_warmup_stable_decay_holds_the_peak_then_decays_over_its_fraction():
    # 10 warmup steps, 100 after; the last 20 % of those (steps 90-110) decay.
    schedule = WarmupLinearDecay(1e-3, warmup_steps=10, total_steps=110, decay_fraction=0.2)
    values = [float(schedule(s)) for s in (9, 10, 50, 90, 100, 110)]
    np.testing.assert_allclose(values, [1e-3, 1e-3, 1e-3, 1e-3, 5e-4, 0.0], atol=1e-9)
    assert WarmupLinearDecay(1e-3, 10, 110, decay_fraction=0.2).get_config()[
        "decay_fraction"] == 0.2


def test_decay_fraction_is_checked():
    config = tiny_config(100, "unused.tsv")
    for bad in (0.0, -0.5, 1.5, float("nan")):
        config.optimizer = dataclasses.replace(config.optimizer, decay_fraction=bad)
        with pytest.raises(ValueError, match="--decay_fraction"):
            validate_train_config(config)


def train_log_rates(model_dir):
    return [json.loads(line)["learning_rate"]
            for line in (model_dir / "train_log.jsonl").read_text().splitlines()]


def test_a_cooldown_branch_equals_the_run_that_decays_there(sentence_vocab_file,
                                                            tiny_parallel_dir, tmp_path):
    """A constant-rate trunk stopped at step 4 and resumed in a copy with a later
    end and a decay over its last steps trains exactly as one warmup-stable-decay
    run of that length: same rates, same weights."""
    def config(steps, fraction):
        run = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                          train_steps=steps, checkpoint_every=100)
        run.optimizer = dataclasses.replace(run.optimizer, warmup_steps=2,
                                            decay_fraction=fraction)
        return run

    direct = Trainer(config(6, 0.5), str(tmp_path / "direct"), None, sentence_vocab_file,
                     progress=False)
    direct.train()
    # The trunk holds the peak from warmup to its end (its decay, one step,
    # would start after the last step).
    trunk = Trainer(config(4, 0.01), str(tmp_path / "trunk"), None, sentence_vocab_file,
                    progress=False)
    trunk.train()
    shutil.copytree(tmp_path / "trunk", tmp_path / "branch")
    branch = Trainer(config(6, 0.5), str(tmp_path / "branch"), None, sentence_vocab_file,
                     progress=False)
    assert branch.train()["final_step"] == 6
    # The log gives the rate after each step (the next step's): the trunk's 4th
    # line is its own end; the branch's steps 5 and 6 are the direct run's.
    branch_rates, direct_rates = (train_log_rates(tmp_path / name) for name in ("branch", "direct"))
    np.testing.assert_allclose(branch_rates[4:], direct_rates[4:], rtol=1e-6)
    np.testing.assert_allclose(branch_rates[:3], direct_rates[:3], rtol=1e-6)
    for mine, theirs in zip(branch.task.trainable, direct.task.trainable):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-6)
