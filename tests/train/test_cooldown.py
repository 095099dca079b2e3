"""The cooldown (lealla_tf.train.cooldown): while the rate decays the teacher
runs on `cooldown_distilled_rows` of each batch, and AMS asks for
`cooldown_margin`."""

import dataclasses as dc
import os
import types

import pytest
import tensorflow as tf
from conftest import Trainer, tiny_config

from lealla_tf.configs import LossConfig, OptimizerConfig, TeacherConfig
from lealla_tf.losses.objectives import OBJECTIVES
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.train.callbacks import RunState
from lealla_tf.train.cooldown import Cooldown, cooldown_start, distilled_rows_at, margin_at
from lealla_tf.train.resolution import validate_train_config
from lealla_tf.train.schedules import WarmupLinearDecay


def _config(train_steps=100, warmup=10, fraction=0.2, rows=0.25, cooldown=1.0, margin=None):
    return types.SimpleNamespace(
        train_steps=train_steps,
        optimizer=OptimizerConfig(warmup_steps=warmup, decay_fraction=fraction),
        loss=LossConfig(distilled_rows=rows, cooldown_distilled_rows=cooldown, margin=0.15,
                        cooldown_margin=margin))


def test_the_cooldown_starts_where_the_rate_starts_to_decay():
    for steps, warmup, fraction in ((100, 10, 0.2), (6, 1, 0.5), (1618, 60, 0.2), (50, 0, 1.0)):
        config = _config(steps, warmup, fraction)
        schedule = WarmupLinearDecay(1e-3, warmup, steps, decay_fraction=fraction)
        start = cooldown_start(config)
        rates = [float(schedule(step)) for step in range(steps)]
        assert all(rate >= 1e-3 * (1 - 1e-6) for step, rate in enumerate(rates)
                   if max(warmup, 1) <= step <= start)  # the peak until the window
        assert all(rate < 1e-3 * (1 - 1e-6) for step, rate in enumerate(rates) if step > start)
        assert distilled_rows_at(config, int(start) + 1) == 1.0
        assert distilled_rows_at(config, int(start) - 1) == 0.25
    assert cooldown_start(_config()) == 82.0  # 100 - 0.2 * 90
    assert distilled_rows_at(_config(cooldown=0.0), 99) == 0.25  # 0: one share throughout


def test_the_margin_changes_where_the_rate_starts_to_decay():
    config = _config(margin=0.3)
    assert margin_at(config, 81) == 0.15 and margin_at(config, 82) == 0.3
    assert margin_at(_config(), 99) == 0.15  # unset: one margin throughout
    assert margin_at(_config(margin=0.0), 99) == 0.0  # 0 is a margin, not "unset"


def _recording_task(rows=0.25, margin=0.15):
    """A task stand-in that keeps what the callback sets, as the task does."""
    task = types.SimpleNamespace(distilled_rows=rows, margin=margin)

    def setter(name):
        def set_value(value):
            changed = value != getattr(task, name)
            setattr(task, name, value)
            return changed
        return set_value

    task.set_distilled_rows, task.set_margin = setter("distilled_rows"), setter("margin")
    return task


def _run_callback(config, task, said):
    trainer = types.SimpleNamespace(task=task, config=config, say=said.append)
    callback, state = Cooldown(), RunState(0)
    callback.on_train_begin(trainer, state)
    changes = []
    for step in range(config.train_steps):
        state.steps_done = step
        changes.append(callback.on_step_begin(trainer, state))
    return callback, changes


def test_the_cooldown_says_everything_it_changes_in_one_line():
    said, task = [], _recording_task()
    callback, changes = _run_callback(_config(margin=0.3), task, said)
    assert changes.index(True) == 82 and changes.count(True) == 1
    assert callback.started_at_step == 82 and (task.distilled_rows, task.margin) == (1.0, 0.3)
    assert said == ["step 82: cooldown, the teacher on 1 of each batch's pairs, "
                    "the AMS margin 0.3"]
    said, task = [], _recording_task()  # the margin alone
    callback, changes = _run_callback(_config(cooldown=0.0, margin=0.3), task, said)
    assert changes.count(True) == 1 and said == ["step 82: cooldown, the AMS margin 0.3"]
    assert (task.distilled_rows, task.margin) == (0.25, 0.3)


def test_the_share_changes_once_and_a_resumed_run_starts_with_the_right_one():
    said, task = [], _recording_task()
    rows, changes = _run_callback(_config(), task, said)
    assert changes.index(True) == 82 and changes.count(True) == 1
    assert rows.started_at_step == 82 and task.distilled_rows == 1.0
    assert said == ["step 82: cooldown, the teacher on 1 of each batch's pairs"]
    resumed = Cooldown()  # resumed inside the cooldown: its settings from the start
    task.distilled_rows = 0.25
    trainer = types.SimpleNamespace(task=task, config=_config(margin=0.3), say=said.append)
    resumed.on_train_begin(trainer, RunState(90))
    assert (task.distilled_rows, task.margin) == (1.0, 0.3) and resumed.started_at_step is None


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_a_cooldown_share_outside_0_to_1_is_refused(share, tiny_parallel_dir):
    config = tiny_config(50, tiny_parallel_dir, "ams")
    config = dc.replace(config, loss=dc.replace(config.loss, cooldown_distilled_rows=share))
    with pytest.raises(ValueError, match="--cooldown_distilled_rows must be in"):
        validate_train_config(config)


@pytest.mark.parametrize("margin", [-0.1, 1.0, float("nan")])
def test_a_margin_outside_0_to_1_is_refused(margin, tiny_parallel_dir):
    config = tiny_config(50, tiny_parallel_dir, "ams")
    for flag in ("margin", "cooldown_margin"):
        wrong = dc.replace(config, loss=dc.replace(config.loss, **{flag: margin}))
        with pytest.raises(ValueError, match=f"--{flag} must be in"):
            validate_train_config(wrong)


def _tiny_run(teacher, tiny_parallel_dir, tmp_path, objective, **loss):
    directory, _, pieces = teacher
    config = tiny_config(len(pieces), tiny_parallel_dir, objective,
                         embedding_init="teacher_select", embedding_init_source=directory,
                         teacher=TeacherConfig(in_step=True), train_steps=6)
    config.encoder = config.encoder.replace(vocabulary_size=len(pieces), num_layers=4,
                                            pooling="mean", max_sequence_length=24)
    config = dc.replace(config, loss=dc.replace(config.loss, **loss),
                        optimizer=dc.replace(config.optimizer, decay_fraction=0.5))
    return Trainer(config, str(tmp_path), None, os.path.join(directory, SENTENCEPIECE_FILE),
                   progress=False)


def _train_counting_traces(trainer, *train_args):
    """Trains `trainer`; (its summary, the step specs it traced the step for)."""
    traces, step_function = [], trainer.step_function
    trainer.step_function = lambda spec: traces.append(spec) or step_function(spec)
    return trainer.train(*train_args), traces


def test_a_run_distils_every_row_in_its_cooldown(teacher, tiny_parallel_dir, tmp_path):
    """6 steps, the rate decaying over the last half of those after its 2
    warmup steps (from step 4): the traced step runs the teacher on 4 of the 8
    pairs in steps 1-4 and on all 8 in steps 5-6 (counted inside the graph),
    the step traced twice, and the summary names where the cooldown came in."""
    trainer = _tiny_run(teacher, tiny_parallel_dir, tmp_path, "ams+fd+ld+hd",
                        distilled_rows=0.5, cooldown_distilled_rows=1.0)
    task = trainer.task
    rows = tf.Variable(0, dtype=tf.int64)
    vectors = task.teacher.vectors

    def counted(features):  # runs where the step is traced: adds in the graph
        rows.assign_add(tf.cast(tf.shape(features["source"]["input_word_ids"])[0], tf.int64))
        return vectors(features)

    task.teacher.vectors = counted
    seen = []

    def rows_of_the_step(measured):
        seen.append(int(rows.numpy()))
        rows.assign(0)

    summary, traces = _train_counting_traces(trainer, rows_of_the_step)
    assert summary["final_step"] == 6 and summary["cooldown_from_step"] == 4
    assert seen == [4, 4, 4, 4, 8, 8] and len(traces) == 2


def test_a_run_whose_terms_do_not_read_the_teacher_keeps_its_step(teacher, tiny_parallel_dir,
                                                                  tmp_path):
    """AMS alone (the main job's comparison): no teacher runs, so the cooldown's
    share changes nothing and the step is not traced again."""
    trainer = _tiny_run(teacher, tiny_parallel_dir, tmp_path, "ams",
                        distilled_rows=0.5, cooldown_distilled_rows=1.0)
    summary, traces = _train_counting_traces(trainer)
    assert summary["final_step"] == 6 and summary["cooldown_from_step"] is None
    assert len(traces) == 1


def test_a_run_traces_its_cooldown_margin_into_the_ams_term(teacher, tiny_parallel_dir, tmp_path,
                                                            monkeypatch):
    """The step traced before the cooldown computes AMS at --margin, the step
    traced where it starts at --cooldown_margin; the teacher's share stays."""
    traced = []

    def recording(x):
        traced.append(x.margin)  # runs where the step is traced
        return ams.compute(x)

    ams = OBJECTIVES["ams"]
    monkeypatch.setitem(OBJECTIVES, "ams", dc.replace(ams, compute=recording))
    trainer = _tiny_run(teacher, tiny_parallel_dir, tmp_path, "ams+fd", distilled_rows=0.5,
                        margin=0.15, cooldown_margin=0.3)
    summary = trainer.train()
    assert summary["final_step"] == 6 and summary["cooldown_from_step"] == 4
    assert traced == [0.15, 0.3] and trainer.task.distilled_rows == 0.5


def test_a_run_whose_terms_do_not_read_the_margin_keeps_its_step(teacher, tiny_parallel_dir,
                                                                 tmp_path):
    """fd alone: no term reads the margin, so the cooldown's margin changes
    nothing and the step is not traced again."""
    trainer = _tiny_run(teacher, tiny_parallel_dir, tmp_path, "fd", cooldown_margin=0.3)
    summary, traces = _train_counting_traces(trainer)
    assert summary["final_step"] == 6 and summary["cooldown_from_step"] is None
    assert len(traces) == 1
