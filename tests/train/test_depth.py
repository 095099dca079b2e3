"""Progressive depth (lealla_tf.train.depth): the pass-through layers skipped
for the first share of the steps, then trained."""

import os
import types

import numpy as np
import pytest
from conftest import Trainer, tiny_config

from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.train.callbacks import RunState
from lealla_tf.train.depth import ProgressiveDepth


def test_the_layers_come_in_at_the_share_of_the_steps_and_say_so():
    said = []
    student = types.SimpleNamespace()
    trainer = types.SimpleNamespace(
        task=types.SimpleNamespace(student=student, pass_through_layers=frozenset({1, 3})),
        config=types.SimpleNamespace(progressive_depth=0.5, train_steps=4), say=said.append)
    depth, state = ProgressiveDepth(), RunState(0)
    depth.on_train_begin(trainer, state)  # skipping from the start: traced as it is
    assert student.skipped_layers == {1, 3}
    changes = []
    for step in range(4):
        state.steps_done = step
        changes.append(depth.on_step_begin(trainer, state))
    assert changes == [False, False, True, False] and student.skipped_layers == frozenset()
    assert depth.inserted_at_step == 2 and said == ["step 2: pass-through layers inserted"]
    resumed = ProgressiveDepth()  # resumed past the share: the layers run, none inserted here
    resumed.on_train_begin(trainer, RunState(3))
    assert resumed.inserted_at_step is None and student.skipped_layers == frozenset()


def test_progressive_depth_inserts_the_pass_through_layers_late(teacher, tiny_parallel_dir,
                                                                 tmp_path):
    """--progressive_depth=0.5 of 6 steps: the first 3 skip the pass-through
    layers of weight selection (left exactly as initialised while the selected
    layers train), the last 3 train every layer; the summary names the step."""
    directory, _, pieces = teacher
    config = tiny_config(len(pieces), tiny_parallel_dir, "ams", embedding_init="teacher_select",
                         embedding_init_source=directory, train_steps=6, progressive_depth=0.5)
    config.encoder = config.encoder.replace(vocabulary_size=len(pieces), num_layers=4,
                                            hidden_dim=8, intermediate_dim=16, pooling="mean",
                                            max_sequence_length=24)
    trainer = Trainer(config, str(tmp_path), None, os.path.join(directory, SENTENCEPIECE_FILE),
                      progress=False)
    assert trainer.task.pass_through_layers == {1, 3}
    layers = trainer.task.student.encoder.transformer_layers
    seen = {}

    def snapshot(measured):
        seen[measured["step"]] = [np.concatenate([w.numpy().ravel() for w in layer.weights])
                                  for layer in layers]

    summary = trainer.train(snapshot)
    assert summary["final_step"] == 6 and summary["pass_through_inserted_at_step"] == 3
    for index in (1, 3):  # skipped in steps 1-3, trained in 4-6
        np.testing.assert_array_equal(seen[1][index], seen[3][index])
        assert not np.array_equal(seen[3][index], seen[6][index])
    for index in (0, 2):
        assert not np.array_equal(seen[1][index], seen[3][index])
    assert trainer.task.student.skipped_layers == frozenset()


def test_progressive_depth_needs_pass_through_layers(teacher, tiny_parallel_dir, tmp_path):
    directory, _, pieces = teacher
    config = tiny_config(len(pieces), tiny_parallel_dir, "ams", embedding_init="teacher_select",
                         embedding_init_source=directory, progressive_depth=0.5)
    config.encoder = config.encoder.replace(vocabulary_size=len(pieces), num_layers=2,
                                            hidden_dim=8, intermediate_dim=16,
                                            max_sequence_length=24)
    with pytest.raises(ValueError, match="no pass-through layers"):
        Trainer(config, str(tmp_path), None, os.path.join(directory, SENTENCEPIECE_FILE))


