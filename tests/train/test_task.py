"""The accelerator step (`--jit_compile`): XLA-compiled, it trains as the same step
run op by op, on one device and across replicas, and what it cannot compile is named."""

import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
from conftest import Trainer, tiny_config, vocab_size

from lealla_tf.configs import EncoderConfig, TeacherConfig
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.train.data import fixed_lengths, pad_to_fixed_lengths
from lealla_tf.train.distribution import make_strategy

STEPS = 20


def run(config, model_dir, vocab_file, strategy=None, compiled=True, stop_at=None):
    """Trains `config` for `STEPS` in `model_dir` (resuming what is there) with the
    accelerator step, XLA-compiled or op by op, stopped by SIGINT after step
    `stop_at` if given; returns the trainer."""
    config.jit_compile = True
    config.train_steps = STEPS
    trainer = Trainer(config, model_dir, strategy or make_strategy("default"), vocab_file,
                      progress=False)
    assert trainer.task.jit_compile and not trainer.task.student.fused_kernels
    trainer.task.compiled = compiled

    def interrupt(measured):
        if measured["step"] == stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # the trainer's handler: stop, checkpoint

    summary = trainer.train(interrupt if stop_at else None)
    assert summary["final_step"] == (stop_at or STEPS)
    return trainer


def log(model_dir):
    with open(os.path.join(model_dir, "train_log.jsonl")) as f:
        return [json.loads(line) for line in f]


# ld squares differences of nearly equal float32 cosines (about 1e-3 apart in
# these tiny runs), so its own relative precision is about 1e-4: compiled and op
# by op, it was seen 1.05e-4 apart on a Xeon.
TERM_RTOL = {"ld": 1e-3}


def assert_same_steps(a, b, terms, rtol=1e-4):
    """The same batches (fingerprints) and the same losses, step by step."""
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    assert [r["fingerprint"] for r in a] == [r["fingerprint"] for r in b]
    for name in terms + ["total"]:
        np.testing.assert_allclose([r[name] for r in a], [r[name] for r in b],
                                   rtol=max(rtol, TERM_RTOL.get(name, 0.0)), err_msg=name)


def hd_config(teacher):
    """AMS + FD + LD + HD with the in-step teacher, the student on its pieces."""
    directory, _, pieces = teacher
    config = tiny_config(len(pieces), None, "ams+fd+ld+hd",
                         embedding_init="teacher_select", embedding_init_source=directory,
                         teacher=TeacherConfig(in_step=True))
    config.encoder = EncoderConfig(vocabulary_size=len(pieces), num_layers=2, num_heads=2,
                                   hidden_dim=8, intermediate_dim=16, max_sequence_length=24,
                                   pooling="mean", dropout=0.1)
    return config, os.path.join(directory, SENTENCEPIECE_FILE)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["ams", "ams+fd+ld", "ams+fd+ld+hd"])
def test_compiled_steps_train_as_the_same_steps_op_by_op(
        objective, teacher, teacher_records, tiny_parallel_dir, sentence_vocab_file, tmp_path):
    """20 compiled steps, the compiled run stopped at 10 and resumed, give the losses
    of 20 steps of the same step op by op (float32, dropout on): same batches,
    same resume."""
    if objective.endswith("hd"):
        config, vocab_file = hd_config(teacher)
        config.data.train_data = [tiny_parallel_dir]
    else:
        vocab_file = sentence_vocab_file
        data = teacher_records if "fd" in objective else tiny_parallel_dir
        config = tiny_config(vocab_size(vocab_file), data, objective)
        config.encoder = config.encoder.replace(dropout=0.1)
    config.checkpoint_every = 5
    op_by_op = str(tmp_path / "op_by_op")
    run(config, op_by_op, vocab_file, compiled=False)
    compiled = str(tmp_path / "compiled")
    run(config, compiled, vocab_file, stop_at=STEPS // 2)
    trainer = run(config, compiled, vocab_file)
    assert trainer.task.compiled
    assert_same_steps(log(compiled), log(op_by_op), trainer.task.terms)
    with open(os.path.join(compiled, "train_summary.json")) as f:
        summary = json.load(f)
    assert summary["jit_compile"] is True and summary["start_step"] == STEPS // 2


@pytest.mark.slow
def test_two_replicas_compiled_train_as_one_device_on_the_full_batch(
        teacher_records, sentence_vocab_file, tmp_path):
    """MirroredStrategy over 2 logical CPUs, compiled (each replica half the batch,
    the candidates gathered, the gradients reduced once), gives the losses of one
    device on the whole batch, step after step."""
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "ams+fd+ld+mcl")
    mirrored = make_strategy("mirrored")
    assert mirrored.num_replicas_in_sync == 2
    two = run(config, str(tmp_path / "two"), sentence_vocab_file, mirrored)
    assert set(two.task._segments) == {"local", "global"}  # compiled in two parts
    one = run(config, str(tmp_path / "one"), sentence_vocab_file)
    assert_same_steps(log(str(tmp_path / "two")), log(str(tmp_path / "one")), one.task.terms)


def test_an_op_xla_cannot_compile_is_named_with_the_flag(sentence_vocab_file,
                                                         tiny_parallel_dir, tmp_path):
    """A string op in the compiled step stops the run at its first step with one
    line: the op, what it is, and the flag that avoids it."""
    from lealla_tf.train.trainer import CompileError

    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         jit_compile=True)
    trainer = Trainer(config, str(tmp_path), make_strategy("default"), sentence_vocab_file,
                      progress=False)
    task_terms = trainer.task.loss_terms

    def with_a_string_op(batch, training=True):
        terms = task_terms(batch, training)
        text = tf.strings.as_string(terms["ams"])
        return {"ams": terms["ams"] + 0.0 * tf.strings.to_number(text)}

    trainer.task.loss_terms = with_a_string_op
    with pytest.raises(CompileError) as raised:
        trainer.train()
    message = str(raised.value)
    assert "\n" not in message and "AsString" in message and "string op" in message
    assert "--jit_compile=false" in message and "tf.data" in message
    # Run op by op, the same step trains.
    trainer.task.compiled = False
    assert trainer.train()["final_step"] == config.train_steps


def test_batches_are_padded_to_a_few_fixed_lengths():
    assert fixed_lengths(128) == [8, 16, 32, 64, 128]
    assert fixed_lengths(16) == [8, 16] and fixed_lengths(24) == [8, 16, 24]

    def inputs(length, rows=2):
        return {"input_word_ids": tf.fill([rows, length], 7), "input_mask": tf.ones(
            [rows, length], tf.int32), "input_type_ids": tf.zeros([rows, length], tf.int32)}

    padded = pad_to_fixed_lengths({"source": inputs(5), "target": inputs(9),
                                   "teacher_target_inputs": inputs(3), "language": tf.zeros([2])},
                                  fixed_lengths(24), pad_id=1)
    assert padded["source"]["input_word_ids"].shape == [2, 16]
    assert padded["target"]["input_mask"].shape == [2, 16]
    assert padded["teacher_target_inputs"]["input_word_ids"].shape == [2, 8]
    ids = padded["source"]["input_word_ids"].numpy()
    assert (ids[:, :5] == 7).all() and (ids[:, 5:] == 1).all()
    assert padded["source"]["input_mask"].numpy()[:, 5:].sum() == 0
    assert padded["teacher_target_inputs"]["input_word_ids"].numpy()[:, 3:].sum() == 0


def test_a_hub_teachers_encoder_runs_in_the_compiled_step(teacher, tiny_parallel_dir,
                                                          tiny_vocab_file, tmp_path):
    """A LaBSE/2-format teacher: its preprocessor runs in tf.data (its token dicts
    padded to fixed lengths too), its encoder inside the compiled step."""
    directory, _, _ = teacher
    config = tiny_config(vocab_size(tiny_vocab_file), tiny_parallel_dir, "ams+fd+ld",
                         teacher=TeacherConfig(path=directory), jit_compile=True)
    trainer = Trainer(config, str(tmp_path), make_strategy("default"), tiny_vocab_file,
                      progress=False)
    batch = next(iter(trainer.task.dataset()))
    assert batch["teacher_source_inputs"]["input_word_ids"].shape[1] in fixed_lengths(16)
    summary = trainer.train()
    assert summary["jit_compile"] and summary["final_step"] == config.train_steps
    assert all(np.isfinite(summary["last"][t]) for t in ("ams", "fd", "ld"))
