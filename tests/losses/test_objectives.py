"""The objectives table: one row per term, and a new term is one row."""

import dataclasses
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.configs import EncoderConfig, LossConfig, TrainConfig
from lealla_tf.losses import functions as losses
from lealla_tf.losses import objectives
from lealla_tf.losses.objectives import (
    ALIASES,
    OBJECTIVES,
    Objective,
    TermInputs,
    compute_terms,
    parse_objective,
)
from lealla_tf.train.resolution import resolve_train_config


def inputs(rng, rows=6, width=4, teacher=5):
    def unit(shape):
        x = rng.normal(size=shape).astype(np.float32)
        return tf.constant(x / np.linalg.norm(x, axis=1, keepdims=True))

    return TermInputs(student_source=unit((rows, width)), student_target=unit((rows, width)),
                      pooled_source=None, pooled_target=None,
                      teacher_source=unit((rows, teacher)), teacher_target=unit((rows, teacher)),
                      gather=lambda x: x, offset=0, heads=None, scale=20.0, margin=0.3,
                      temperature=100.0)


def test_every_row_is_complete_and_aliases_resolve():
    for name, row in OBJECTIVES.items():
        assert row.name == name and row.description
        assert row.default_weight(128) > 0 and row.default_weight(256) > 0
    for alias in ALIASES:
        assert all(term in OBJECTIVES for term in parse_objective(alias))
    assert parse_objective("lealla+hd") == ["ams", "fd", "ld", "hd"]
    with pytest.raises(ValueError, match="repeats"):
        parse_objective("lealla+fd")
    assert OBJECTIVES["hd"].heads == (objectives.TEACHER_LAYERS,)
    assert objectives.terms_needing(["ams", "hd", "fd"], objectives.TEACHER_LAYERS) == ["hd"]
    assert objectives.terms_needing(["fd", "mse"], objectives.PROJECTION) == ["fd", "mse"]
    assert OBJECTIVES["fd"].default_weight(128) == 1e3
    assert OBJECTIVES["fd"].default_weight(256) == 1e4
    assert OBJECTIVES["ams"].gathers and not OBJECTIVES["ams"].needs_teacher
    assert OBJECTIVES["ld"].gathers and OBJECTIVES["ld"].needs_teacher


def test_terms_are_batch_means_of_the_loss_functions():
    x = inputs(np.random.default_rng(0))
    terms = compute_terms(["ams", "ld", "mcl"], x, global_batch_size=6)
    expected = {
        "ams": losses.additive_margin_softmax_loss(x.student_source, x.student_target, 20.0, 0.3),
        "ld": losses.logit_distillation_loss(x.teacher_source, x.teacher_target,
                                             x.student_source, x.student_target, 100.0),
        "mcl": losses.multilingual_contrastive_loss(x.teacher_target, x.student_target,
                                                    x.student_source)}
    for name, values in expected.items():
        np.testing.assert_allclose(float(terms[name]), float(tf.reduce_mean(values)), rtol=1e-6)


def test_resolution_reads_the_table():
    config = TrainConfig(encoder=EncoderConfig(vocabulary_size=10, num_layers=1, num_heads=1,
                                               hidden_dim=8, intermediate_dim=8),
                         loss=LossConfig(objective="lealla", weights={"ld": 5.0}))
    resolved = resolve_train_config(config, 30, 16)
    assert resolved.loss.weights == {"ams": 1.0, "fd": 1e3, "ld": 5.0}
    assert resolved.encoder.vocabulary_size == 30 and resolved.teacher_dimension == 16
    with pytest.raises(ValueError, match="needs a teacher"):
        resolve_train_config(config, 30, None)
    distillation_first = dataclasses.replace(config, loss=LossConfig(objective="ams+df"))
    assert resolve_train_config(distillation_first, 30, 24).encoder.pooler_dim == 24


def test_a_new_term_is_one_row(monkeypatch, sentence_vocab_file, tiny_parallel_dir, tmp_path):
    """Register a term in the table only; it trains, is logged, and is weighted."""
    def alignment(x):
        return 1.0 - tf.reduce_sum(x.student_source * x.student_target, axis=-1)

    row = Objective("alignment", alignment, needs_teacher=False, gathers=False,
                    default_weight=lambda d: 2.0, description="1 - cos(x, y)")
    monkeypatch.setitem(objectives.OBJECTIVES, "alignment", row)
    from lealla_tf.configs import DataConfig, OptimizerConfig, TokenizerConfig
    from lealla_tf.train.launch import train

    vocabulary = len(pathlib.Path(sentence_vocab_file).read_text(encoding="utf-8").split("\n")) - 1
    config = TrainConfig(
        encoder=EncoderConfig(vocabulary_size=vocabulary, num_layers=1, num_heads=2,
                              hidden_dim=8, intermediate_dim=16, pooling="mean"),
        tokenizer=TokenizerConfig(max_seq_length=16), data=DataConfig([tiny_parallel_dir]),
        loss=LossConfig(objective="ams+alignment", scale=20.0),
        optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=1),
        global_batch_size=4, train_steps=2, checkpoint_every=2, log_every=1)
    summary = train(config, str(tmp_path / "m"), sentence_vocab_file, progress=False)
    assert summary["weights"] == {"ams": 1.0, "alignment": 2.0}
    assert 0.0 <= summary["last"]["alignment"] <= 2.0
