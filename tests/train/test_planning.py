"""A run that decides its own length (lealla_tf.train.planning): the plan and
re-plan a planner gives, what the trainer refuses, and a resume that follows the
recorded plan."""

import dataclasses
import json
import os
import types

import numpy as np
import pytest
from conftest import Trainer, tiny_config, vocab_size

from lealla_tf.recipe.planner import BudgetPlanner, read_plan
from lealla_tf.recipe.settings import RecipeConfig
from lealla_tf.train.callbacks import RunState
from lealla_tf.train.planning import Planning, check_plan, check_replan
from lealla_tf.train.schedules import WarmupLinearDecay


class FakeTrainer:
    """What `Planning` uses of a trainer, recording the order of its calls."""

    def __init__(self, warmup_steps=5):
        self.config = types.SimpleNamespace(optimizer=types.SimpleNamespace(
            warmup_steps=warmup_steps))
        self.calls = []

    def reconfigure(self, **settings):
        self.calls.append(("reconfigure", settings))

    def save(self, steps_done):
        self.calls.append(("save", steps_done))


def test_a_first_plan_comes_during_the_warmup_and_a_replan_moves_only_the_end():
    check_plan({"train_steps": 9}, 3, warmup_steps=5)
    with pytest.raises(ValueError, match="during the warmup"):
        check_plan({"train_steps": 9}, 5, warmup_steps=5)
    with pytest.raises(ValueError, match="not below the steps already run"):
        check_plan({"train_steps": 2}, 3, warmup_steps=5)
    check_replan({"train_steps": 12, "time_budget_minutes": 3.0}, 5)
    for replan in ({"train_steps": 5}, {"train_steps": 12, "eval_every": 3}):
        with pytest.raises(ValueError, match="re-plan at step 5"):
            check_replan(replan, 5)


def test_the_callback_saves_before_it_takes_a_replan_and_resumes_a_recorded_plan():
    answers = {3: {"train_steps": 9, "checkpoint_every": 3}, 5: {"train_steps": 12}}

    class Planner:
        def __init__(self, recorded):
            self.recorded, self.seen = recorded, []

        def start(self, steps_done):
            return self.recorded

        def __call__(self, measured):
            self.seen.append(measured["step"])
            return answers.get(measured["step"])

    trainer, planner = FakeTrainer(), Planner(None)
    planning, state = Planning(planner), RunState(0)
    planning.on_train_begin(trainer, state)
    for step in range(1, 7):
        state.steps_done = step
        planning.on_step_end(trainer, state, {})
    assert planner.seen == [1, 2, 3, 4, 5, 6]
    assert trainer.calls == [("reconfigure", answers[3]), ("save", 5),
                             ("reconfigure", answers[5])]
    # Resumed: the recorded settings first, and a later answer is a re-plan.
    trainer, planner = FakeTrainer(warmup_steps=1), Planner({"train_steps": 9})
    planning = Planning(planner)
    planning.on_train_begin(trainer, RunState(3))
    assert trainer.calls == [("reconfigure", {"train_steps": 9})]
    state = RunState(4)
    state.steps_done = 5
    planning.on_step_end(trainer, state, {})
    assert trainer.calls[1:] == [("save", 5), ("reconfigure", answers[5])]
    Planning(None).on_step_end(trainer, state, {})  # a fixed run: nothing asked
    assert len(trainer.calls) == 3


def test_a_planner_sets_the_length_during_warmup(sentence_vocab_file, tiny_parallel_dir,
                                                 tmp_path):
    """A run that plans its own length: the planner sees every step's time, its
    answer sets the steps, the evaluations and checkpoints, and the rate's decay
    (the schedule reads the new total in the traced step). The trainer writes
    no plan file: the planner owns it (`lealla_tf.recipe.planner.PLAN_FILE`)."""
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=1000, checkpoint_every=1000)
    config.optimizer.warmup_steps = 5
    seen = []

    def planner(measured):
        seen.append(measured)
        if measured["step"] != 3:
            return None
        return {"train_steps": 9, "checkpoint_every": 3}

    summary = Trainer(config, str(tmp_path), None, sentence_vocab_file,
                      progress=False).train(planner)
    # Called after every step: it plans at 3, and could re-plan after.
    assert summary["final_step"] == 9 and [m["step"] for m in seen] == list(range(1, 10))
    seen = seen[:3]
    assert len(seen[-1]["step_seconds"]) == 3 and seen[-1]["train_seconds"] > 0
    assert seen[-1]["start_seconds"] >= 0 and seen[-1]["evaluation_seconds"] is None
    # The start is the time to the first step, the same at every call.
    assert seen[0]["start_seconds"] == seen[-1]["start_seconds"]
    assert not (tmp_path / "plan.json").exists()
    rates = [json.loads(line)["learning_rate"]
             for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    expected = [float(WarmupLinearDecay(1e-3, 5, 9)(step)) for step in range(1, 10)]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert rates[-1] == pytest.approx(0.0, abs=1e-9)  # decayed to the planned end
    saved = {int(name.split("-")[1].split(".")[0])
             for name in os.listdir(tmp_path / "checkpoints") if name.startswith("ckpt-")}
    assert saved == {3, 6, 9}  # every 3 steps, as planned (none at the provisional 1000)


def test_a_replan_moves_the_end_and_the_decay(sentence_vocab_file, tiny_parallel_dir,
                                              tmp_path):
    """Planned at step 3 for 9 steps, re-planned at step 5 for 12: the run ends at
    12, the rate follows the first schedule to step 5 and decays to 12 after,
    with a checkpoint at step 5, so a resumed run never replays a step before
    the re-plan under the new end."""
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=1000, checkpoint_every=1000, keep_checkpoints=10)
    config.optimizer.warmup_steps = 4

    def planner(measured):
        assert measured["elapsed_seconds"] >= measured["train_seconds"]
        return {3: {"train_steps": 9, "checkpoint_every": 3},
                5: {"train_steps": 12}}.get(measured["step"])

    summary = Trainer(config, str(tmp_path), None, sentence_vocab_file,
                      progress=False).train(planner)
    assert summary["final_step"] == 12
    saved = {int(name.split("-")[1].split(".")[0])
             for name in os.listdir(tmp_path / "checkpoints") if name.startswith("ckpt-")}
    assert saved == {3, 5, 6, 9, 12}
    rates = [json.loads(line)["learning_rate"]
             for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    expected = ([float(WarmupLinearDecay(1e-3, 4, 9)(step)) for step in range(1, 6)]
                + [float(WarmupLinearDecay(1e-3, 4, 12)(step)) for step in range(6, 13)])
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="re-plan"):
        Trainer(dataclasses.replace(config, train_steps=20), str(tmp_path / "again"), None,
                sentence_vocab_file, progress=False).train(
            lambda measured: {1: {"train_steps": 9}, 2: {"eval_every": 3}}.get(
                measured["step"]))


def test_a_replan_moves_the_cooldown_of_a_held_rate(sentence_vocab_file, tiny_parallel_dir,
                                                     tmp_path):
    """The main job's schedule (warmup-stable-decay, the last half decaying here):
    planned at step 3 for 12 steps, re-planned at step 6 for 16, while the rate
    still holds; the cooldown then starts at 10, not 8, and every rate before
    the re-plan was the peak."""
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=1000, checkpoint_every=1000)
    config.optimizer.warmup_steps = 4
    config.optimizer.decay_fraction = 0.5

    def planner(measured):
        return {3: {"train_steps": 12}, 6: {"train_steps": 16}}.get(measured["step"])

    summary = Trainer(config, str(tmp_path), None, sentence_vocab_file,
                      progress=False).train(planner)
    assert summary["final_step"] == 16
    rates = [json.loads(line)["learning_rate"]
             for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    # The log's rate is the one the next step uses: steps 4-9 hold the peak.
    np.testing.assert_allclose(rates[3:10], 1e-3, rtol=1e-6)
    expected = [float(WarmupLinearDecay(1e-3, 4, 16, decay_fraction=0.5)(step))
                for step in range(1, 17)]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert rates[-1] == pytest.approx(0.0, abs=1e-9)


def test_a_plan_after_the_warmup_is_refused(sentence_vocab_file, tiny_parallel_dir, tmp_path):
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=10)
    config.optimizer.warmup_steps = 2
    with pytest.raises(ValueError, match="during the warmup"):
        Trainer(config, str(tmp_path), None, sentence_vocab_file, progress=False).train(
            lambda measured: {"train_steps": 6} if measured["step"] == 3 else None)


class ScriptedPlanner(BudgetPlanner):
    """The budget planner's records and resume (`start`, the replayed re-plan),
    with its decisions fixed: 9 steps at step 3, re-planned to 12 at step 5; a
    "kill" (KeyboardInterrupt) right after the re-plan is recorded, before the
    trainer saves the checkpoint that goes with it."""

    def __init__(self, model_dir, recorded=None, kill=False):
        super().__init__(RecipeConfig(), None, 0.0, False, model_dir, recorded)
        self.kill = kill

    def __call__(self, measured):
        step = measured["step"]
        if self.resumed_at is not None and (self.plan or {}).get("replanned_at_step"):
            return super().__call__(measured)
        if step == 3 and self.plan is None:
            self.evaluation_sentences = measured["evaluation_sentences"]
            answer = {"train_steps": 9, "checkpoint_every": 3, "eval_every": 3}
            self.plan = {**answer, "planned_at_step": 3}
        elif step == 5 and self.plan and not self.plan.get("replanned_at_step"):
            answer = {"train_steps": 12, "time_budget_minutes": 0.0}
            self.plan.update(replanned_at_step=5, planned_train_steps=9, **answer)
        else:
            return None
        self.write()
        if self.kill and step == 5:
            raise KeyboardInterrupt
        return answer


def test_a_run_killed_after_its_replan_resumes_to_the_replanned_end(
        sentence_vocab_file, tiny_parallel_dir, tiny_tatoeba_dir, tmp_path):
    """Killed after the re-plan was recorded but before its checkpoint, the run
    resumes at step 3 with the first plan's end, takes the re-plan again at
    step 5, and ends where an uninterrupted run ends: the same rates and
    losses, the same last step; its summary keeps the evaluations made before
    the kill."""
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=1000, checkpoint_every=1000, keep_checkpoints=10,
                         eval_every=1000, tatoeba_dir=tiny_tatoeba_dir)
    config.optimizer.warmup_steps = 4

    def run(model_dir, planner):
        return Trainer(config, str(model_dir), None, sentence_vocab_file,
                       progress=False).train(planner)

    def log(model_dir):
        return [json.loads(line) for line in
                (model_dir / "train_log.jsonl").read_text().splitlines()]

    scripted = ScriptedPlanner(str(tmp_path / "a"))
    reference = run(tmp_path / "a", scripted)
    assert reference["final_step"] == 12
    # the planner is told what the evaluation at step 0 embedded (it prices the
    # stages after training by it)
    first = json.loads((tmp_path / "a" / "eval_log.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and scripted.evaluation_sentences == first["tatoeba/sentences"] > 0
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b", ScriptedPlanner(str(tmp_path / "b"), kill=True))
    recorded = read_plan(str(tmp_path / "b"))
    assert recorded["replanned_at_step"] == 5 and recorded["train_steps"] == 12
    resumed = run(tmp_path / "b", ScriptedPlanner(str(tmp_path / "b"), recorded))
    assert resumed["start_step"] == 3 and resumed["final_step"] == 12
    expected, got = log(tmp_path / "a"), log(tmp_path / "b")
    assert [row["step"] for row in got] == list(range(1, 13))
    np.testing.assert_allclose([r["learning_rate"] for r in got],
                               [r["learning_rate"] for r in expected], rtol=1e-6)
    np.testing.assert_allclose([r["total"] for r in got], [r["total"] for r in expected],
                               rtol=1e-5)
    steps = [e["step"] for e in reference["evaluations"]]
    assert steps == [0, 3, 6, 9, 12]
    assert [e["step"] for e in resumed["evaluations"]] == steps


