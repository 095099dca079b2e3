"""What plugs into the training loop (lealla_tf.train.callbacks): the state it
shares and the order it calls the hooks in."""

import time

from conftest import Trainer, tiny_config, vocab_size

from lealla_tf.train.callbacks import Callback, RunState


def test_the_state_measures_from_the_call_to_the_first_step():
    state = RunState(7)
    assert state.start_step == 7 and state.step_seconds == [] and state.last == {}
    state.first_step_start = state.started + 2.0
    state.step_seconds += [0.5, 0.25]
    state.train_seconds, state.steps_done, state.evaluation_seconds = 0.75, 9, 1.5
    state.evaluation_sentences = 40
    measured = state.measured()
    assert measured["step"] == 9 and measured["train_seconds"] == 0.75
    assert measured["start_seconds"] == 2.0 and measured["evaluation_seconds"] == 1.5
    assert measured["evaluation_sentences"] == 40
    assert 0 <= measured["elapsed_seconds"] <= time.time() - state.started
    measured["step_seconds"].append(9.0)  # a copy: the planner cannot change the state
    assert state.step_seconds == [0.5, 0.25]


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_train_begin(self, trainer, state):
        self.calls.append(("begin", state.steps_done))

    def on_step_begin(self, trainer, state):
        self.calls.append(("step_begin", state.steps_done))
        return False

    def on_step_end(self, trainer, state, measured):
        assert measured["step"] == state.steps_done and "total" in measured
        self.calls.append(("step_end", state.steps_done))

    def after_checkpoint(self, trainer, state):
        saved = trainer.manager.latest_checkpoint
        self.calls.append(("after_checkpoint", state.steps_done, saved and saved[-6:]))

    def close(self, trainer, state):
        self.calls.append(("close", state.steps_done))

    def on_train_end(self, trainer, state):
        self.calls.append(("end", state.steps_done, trainer.manager.latest_checkpoint[-6:]))


def test_the_loop_calls_the_hooks_in_order(sentence_vocab_file, tiny_parallel_dir, tmp_path):
    """A run of 3 steps, a checkpoint every 2: each step's hooks in the
    documented order, after_checkpoint after the step's checkpoint, close
    before the last checkpoint, the end after it."""
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=3, checkpoint_every=2)
    recorder = Recorder()
    Trainer(config, str(tmp_path), None, sentence_vocab_file, progress=False).train(
        callbacks=[recorder])
    assert recorder.calls == [
        ("begin", 0),
        ("step_begin", 0), ("step_end", 1), ("after_checkpoint", 1, None),
        ("step_begin", 1), ("step_end", 2), ("after_checkpoint", 2, "ckpt-2"),
        ("step_begin", 2), ("step_end", 3), ("after_checkpoint", 3, "ckpt-2"),
        ("close", 3), ("end", 3, "ckpt-3")]
