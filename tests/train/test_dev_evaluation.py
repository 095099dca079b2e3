"""Tatoeba P@1 along a run (lealla_tf.train.dev_evaluation): when it evaluates,
what it times, and what a killed run keeps."""

import json
import types

import pytest
from conftest import Trainer, tiny_config, vocab_size

from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC, TATOEBA_SENTENCES
from lealla_tf.train.callbacks import RunState
from lealla_tf.train.dev_evaluation import DevEvaluation


class FakeTrainer:
    """A chief whose scores are its step count, logging what it is given."""

    def __init__(self, tmp_path, eval_every=3, train_steps=7):
        self.write_dir = str(tmp_path)
        self.config = types.SimpleNamespace(eval_every=eval_every, train_steps=train_steps,
                                            tatoeba_dir="", eval_max_pairs=0)
        self.logged, self.said = [], []
        self.logs = types.SimpleNamespace(evaluation=self.log)

    def log(self, step, metrics, evaluations):
        self.logged.append(step)
        evaluations.append({"step": step})
        return {TATOEBA_PRIMARY_METRIC: 0.5, TATOEBA_SENTENCES: 100 + step}

    def say(self, text):
        self.said.append(text)


def test_it_evaluates_at_zero_every_few_steps_and_at_the_end(tmp_path):
    trainer, evaluation, state = FakeTrainer(tmp_path), DevEvaluation(), RunState(0)
    evaluation.on_train_begin(trainer, state)
    assert trainer.logged == [0] and state.evaluation_seconds >= 0
    assert state.evaluation_sentences == 100  # what a planner prices the later stages by
    for step in range(1, 8):
        state.steps_done = step
        evaluation.after_checkpoint(trainer, state)
    evaluation.on_train_end(trainer, state)
    assert trainer.logged == [0, 3, 6, 7]
    assert trainer.said == ["step 3: Tatoeba P@1 50.00", "step 6: Tatoeba P@1 50.00"]


def test_a_resumed_run_makes_only_the_evaluation_a_kill_cut_off(tmp_path):
    (tmp_path / "eval_log.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    trainer, evaluation = FakeTrainer(tmp_path), DevEvaluation()
    state = RunState(3)  # killed after the checkpoint at 3, before its evaluation
    evaluation.on_train_begin(trainer, state)
    assert trainer.logged == [3] and state.evaluation_seconds is None
    assert state.evaluation_sentences is None
    assert [e["step"] for e in evaluation.evaluations] == [0, 3]
    trainer = FakeTrainer(tmp_path)  # resumed at 3 with its evaluation logged: none again
    (tmp_path / "eval_log.jsonl").write_text(json.dumps({"step": 0}) + "\n"
                                             + json.dumps({"step": 3}) + "\n")
    evaluation = DevEvaluation()
    evaluation.on_train_begin(trainer, RunState(3))
    evaluation.on_train_end(trainer, RunState(3))  # no step run in this call: none at the end
    assert trainer.logged == []
    idle = FakeTrainer(tmp_path, eval_every=0)
    DevEvaluation().on_train_begin(idle, RunState(0))
    assert idle.logged == []


def test_a_run_without_a_dev_directory_scores_nothing(tmp_path):
    assert DevEvaluation().score(FakeTrainer(tmp_path)) is None


def test_a_killed_run_logs_each_evaluation_once(sentence_vocab_file, tiny_parallel_dir,
                                                tiny_tatoeba_dir, tmp_path):
    """Killed after the evaluation at step 0 and before any checkpoint, the rerun
    starts over and logs step 0 once; killed after the checkpoint at step 3 and
    before the evaluation that follows it, the rerun makes that evaluation."""
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=6, checkpoint_every=3, eval_every=3,
                         tatoeba_dir=tiny_tatoeba_dir)

    def kill_at(step):
        def planner(measured):
            if measured["step"] == step:
                raise KeyboardInterrupt
        return planner

    def run(planner=None):
        return Trainer(config, str(tmp_path), None, sentence_vocab_file,
                       progress=False).train(planner)

    def logged():
        return [json.loads(line)["step"]
                for line in (tmp_path / "eval_log.jsonl").read_text().splitlines()]

    with pytest.raises(KeyboardInterrupt):
        run(kill_at(1))
    assert logged() == [0]
    with pytest.raises(KeyboardInterrupt):
        run(kill_at(4))
    assert logged() == [0, 3]
    log = tmp_path / "eval_log.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:1]))  # the kill's
    summary = run()
    assert logged() == [0, 3, 6]
    assert [e["step"] for e in summary["evaluations"]] == [0, 3, 6]
