"""The trainer: cross-replica negatives, every objective, resume, configs."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import TEACHER_DIM, Trainer, tiny_config, vocab_size

from lealla_tf.configs import EncoderConfig, TeacherConfig
from lealla_tf.losses.objectives import default_loss_weights, parse_objective
from lealla_tf.models.model_dir import read_model_config
from lealla_tf.recipe.planner import BudgetPlanner, read_plan
from lealla_tf.recipe.settings import RecipeConfig
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.train.distribution import make_strategy
from lealla_tf.train.trainer import WarmupLinearDecay


def loss_and_gradients(task, batch):
    """Total loss and all-reduced gradients of the task's own step function."""
    _, total, gradients = task.strategy.run(tf.function(task.replica_gradients), args=(batch,))
    total = task.strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None)
    gradients = [task.strategy.experimental_local_results(g)[0] for g in gradients]
    # One replica's lookup-table gradients are sparse (tf.IndexedSlices): compare dense.
    return float(total), [tf.convert_to_tensor(g).numpy() for g in gradients]


def test_two_replicas_see_the_global_batch(teacher_records, sentence_vocab_file, tmp_path):
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records,
                         objective="ams+fd+ld+mcl+mse")
    single = Trainer(config, str(tmp_path / "single"), make_strategy("default"),
                     sentence_vocab_file, progress=False).task
    mirrored_strategy = make_strategy("mirrored")
    assert mirrored_strategy.num_replicas_in_sync == 2
    mirrored = Trainer(config, str(tmp_path / "mirrored"), mirrored_strategy,
                       sentence_vocab_file, progress=False).task
    for source, target in zip(single.trainable, mirrored.trainable):
        target.assign(source.numpy())
    full_batch = next(iter(single.distributed_dataset(0)))
    def share(context):  # replica i's 4 rows of the global batch
        start = 4 * context.replica_id_in_sync_group
        return tf.nest.map_structure(lambda t: t[start:start + 4], full_batch)

    split = mirrored.strategy.experimental_distribute_values_from_function(share)
    single_total, single_gradients = loss_and_gradients(single, full_batch)
    mirrored_total, mirrored_gradients = loss_and_gradients(mirrored, split)
    np.testing.assert_allclose(mirrored_total, single_total, rtol=1e-5)
    for a, b in zip(mirrored_gradients, single_gradients):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    # Without gathering (each replica only its own 4 negatives) the AMS loss differs.
    from lealla_tf.losses import functions as losses

    encoder = single.student.encoder
    embeddings = encoder(full_batch["source"])["sentence_embedding"]
    targets = encoder(full_batch["target"])["sentence_embedding"]
    halves = sum(float(tf.reduce_sum(losses.additive_margin_softmax_loss(
        embeddings[i:i + 4], targets[i:i + 4], 20.0))) for i in (0, 4))
    assert abs(halves / 8 - float(tf.reduce_mean(losses.additive_margin_softmax_loss(
        embeddings, targets, 20.0)))) > 1e-3


@pytest.mark.parametrize("objective", ["ams", "fd", "ld", "ams+fd", "ams+ld", "fd+ld",
                                       "lealla", "reimers", "ding", "ams+df", "xtr+ams"])
def test_every_objective_trains(teacher_records, sentence_vocab_file, tmp_path, objective):
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, objective, train_steps=2)
    if "df" in parse_objective(objective):
        config.encoder = config.encoder.replace(pooler_dim=TEACHER_DIM, output_dim=8)
    trainer = Trainer(config, str(tmp_path / "m"), make_strategy("default"), sentence_vocab_file,
                      progress=False)
    summary = trainer.train()
    assert summary["final_step"] == 2
    assert all(np.isfinite(summary["last"][t]) for t in parse_objective(objective))


def test_dimension_reduction_then_synchronized(teacher_records, sentence_vocab_file, tmp_path):
    size = vocab_size(sentence_vocab_file)
    reduction = tiny_config(size, teacher_records, "ams", student="dimension_reduction",
                            train_steps=2)
    reduction.encoder = EncoderConfig(vocabulary_size=size, num_layers=1, num_heads=1,
                                      hidden_dim=8, intermediate_dim=1)
    Trainer(reduction, str(tmp_path / "reduction"), make_strategy("default"),
            sentence_vocab_file, progress=False).train()
    assert read_model_config(str(tmp_path / "reduction"))["teacher_dimension"] == TEACHER_DIM
    synchronized = tiny_config(size, teacher_records, "ams+syn", train_steps=2,
                               teacher=TeacherConfig(reduction_dir=str(tmp_path / "reduction")))
    summary = Trainer(synchronized, str(tmp_path / "syn"), make_strategy("default"),
                      sentence_vocab_file, progress=False).train()
    assert np.isfinite(summary["last"]["syn"])


def test_distillation_without_a_teacher_is_a_clear_error(sentence_vocab_file, tiny_parallel_dir,
                                                         tmp_path):
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "lealla")
    with pytest.raises(ValueError, match="needs a teacher"):
        Trainer(config, str(tmp_path / "m"), make_strategy("default"), sentence_vocab_file)


def test_objective_parsing_and_paper_weights():
    assert parse_objective("lealla") == ["ams", "fd", "ld"]
    assert parse_objective("ding") == ["mcl", "mse"]
    with pytest.raises(ValueError, match="unknown terms"):
        parse_objective("ams+kd")
    with pytest.raises(ValueError, match="repeats"):
        parse_objective("ams+ams")
    assert default_loss_weights(128)["fd"] == 1e3 and default_loss_weights(256)["fd"] == 1e4
    assert default_loss_weights(192)["ld"] == 1e-2 and default_loss_weights(128)["ams"] == 1


def test_logs_and_config_are_written(teacher_records, sentence_vocab_file, tiny_tatoeba_dir,
                                     tmp_path):
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "lealla",
                         train_steps=4, eval_every=2, tatoeba_dir=tiny_tatoeba_dir,
                         checkpoint_every=2)
    summary = Trainer(config, str(tmp_path / "m"), make_strategy("default"), sentence_vocab_file,
                      progress=False).train()
    assert [e["step"] for e in summary["evaluations"]] == [0, 2, 4]
    stored = read_model_config(str(tmp_path / "m"))
    assert stored["loss"]["objective"] == "lealla" and stored["encoder"]["hidden_dim"] == 8
    assert stored["tokenizer"]["vocab_file"] == "vocab.txt"
    assert os.path.exists(tmp_path / "m" / "vocab.txt")
    steps = [json.loads(line)["step"]
             for line in (tmp_path / "m" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert any(name.startswith("events") for name in os.listdir(tmp_path / "m" / "logs"))
    assert summary["checkpoint"].endswith("ckpt-4")


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


def test_a_collapsed_student_is_named_in_the_summary(sentence_vocab_file, tiny_parallel_dir,
                                                     tiny_tatoeba_dir, tmp_path):
    """Every layer norm's scale at 0 and a rate of 0: every sentence gets one vector.
    The run still reaches its steps, and its summary says loudly that the model has
    collapsed, measured from the spread of the evaluation's embeddings."""
    from lealla_tf.train.logs import format_summary

    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=2, eval_every=2, tatoeba_dir=tiny_tatoeba_dir)
    config.optimizer.learning_rate = 0.0
    trainer = Trainer(config, str(tmp_path), None, sentence_vocab_file, progress=False)
    trainer.restore_or_initialize()
    for weight in trainer.task.trainable:
        if "gamma" in weight.path:
            weight.assign(tf.zeros_like(weight))
    trainer.restore_or_initialize = lambda: 0  # keep the collapsed weights
    summary = trainer.train()
    assert summary["final_step"] == 2 and summary["evaluations"][-1]["mean_cosine"] > 0.999
    assert "has collapsed" in summary["collapse_warning"]
    assert "has collapsed" in format_summary(summary)
    assert json.loads((tmp_path / "train_summary.json").read_text())["collapse_warning"]


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

    reference = run(tmp_path / "a", ScriptedPlanner(str(tmp_path / "a")))
    assert reference["final_step"] == 12
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


def test_distilled_rows_run_the_teacher_on_the_first_rows_only(teacher, tiny_parallel_dir,
                                                               tmp_path):
    """--distilled_rows=0.5: AMS reads all 8 pairs; the teacher runs on the first
    4 and the terms that read it (fd, ld, hd) equal those of a whole-batch task
    given only those 4 pairs (each term the mean over its own rows); a run
    with it trains."""
    import dataclasses as dc

    directory, _, pieces = teacher
    config = tiny_config(len(pieces), tiny_parallel_dir, "ams+fd+ld+hd",
                         embedding_init="teacher_select", embedding_init_source=directory,
                         teacher=TeacherConfig(in_step=True))
    config.encoder = config.encoder.replace(vocabulary_size=len(pieces), num_layers=4,
                                            pooling="mean", max_sequence_length=24)
    vocab = os.path.join(directory, SENTENCEPIECE_FILE)
    half = dc.replace(config, loss=dc.replace(config.loss, distilled_rows=0.5))
    whole = Trainer(config, str(tmp_path / "whole"), None, vocab, progress=False).task
    part = Trainer(half, str(tmp_path / "part"), None, vocab, progress=False).task
    for task in (whole, part):
        task.initialize_weights()
    for mine, theirs in zip(part.heads.trainable_weights + part.student.trainable_weights,
                            whole.heads.trainable_weights + whole.student.trainable_weights):
        mine.assign(theirs)
    batch = next(iter(whole.dataset()))
    first = {side: {k: v[:4] for k, v in value.items()} if side in ("source", "target")
             else value for side, value in batch.items()}

    def terms(task, rows):
        return {k: float(v) for k, v in task.loss_terms(rows, training=False).items()}

    on_half, on_first, on_all = terms(part, batch), terms(whole, first), terms(whole, batch)
    scale = 4 / 8  # the whole-batch task divides the 4 rows' sums by its global batch of 8
    np.testing.assert_allclose(on_half["ams"], on_all["ams"], rtol=1e-5)
    for term in ("fd", "hd"):
        np.testing.assert_allclose(on_half[term], on_first[term] / scale, rtol=1e-4)
    np.testing.assert_allclose(on_half["ld"], on_first["ld"] / scale, rtol=1e-4)
    assert part._distilled_batch_size() == 4
    summary = Trainer(dc.replace(half, train_steps=2), str(tmp_path / "run"), None, vocab,
                      progress=False).train()
    assert summary["final_step"] == 2 and all(np.isfinite(summary["last"][t])
                                              for t in ("ams", "fd", "ld", "hd"))


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
