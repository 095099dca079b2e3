"""The trainer: cross-replica negatives, every objective, resume, configs."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import TEACHER_DIM, Trainer, tiny_config, vocab_size

from lealla_tf.configs import EncoderConfig, TeacherConfig
from lealla_tf.losses.objectives import default_loss_weights, parse_objective
from lealla_tf.models.model_dir import read_model_config
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.train.distribution import make_strategy


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


