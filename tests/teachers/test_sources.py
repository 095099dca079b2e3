"""Where a step's teacher vectors come from (`lealla_tf.teachers.sources`): centred
vectors (`CenteredTeacher`) and how a run keeps their mean; the teacher run in the
step on the student's tokens (`InStepTeacher`); which teacher a config and the
training records give (`build_teacher`)."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import Trainer, tiny_config, tiny_vocabulary, vocab_size

from lealla_tf.configs import TeacherConfig
from lealla_tf.teachers.layers import TeacherLayers
from lealla_tf.teachers.selection import match_rows
from lealla_tf.teachers.sources import (
    CenteredTeacher,
    EnglishOnlyTeacher,
    InStepTeacher,
    PrecomputedTeacher,
    build_teacher,
    trim_to_longest,
)
from lealla_tf.train.distribution import make_strategy
from lealla_tf.train.resolution import validate_train_config


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def batch(rng, rows, shift):
    return {"teacher_source": (rng.normal(size=(rows, 5)) + shift).astype("float32"),
            "teacher_target": (rng.normal(size=(rows, 5)) + shift).astype("float32")}


def test_centred_vectors_remove_the_mean_of_both_sides():
    rng = np.random.default_rng(0)
    shift = np.array([3.0, 0, 0, 0, 1.0])  # an anisotropic teacher: one shared direction
    batches = [batch(rng, 4, shift), batch(rng, 3, shift)]
    teacher = CenteredTeacher(PrecomputedTeacher(5, has_source=True))
    assert teacher.base is teacher.inner and teacher.dimension == 5
    info = teacher.estimate_mean(batches)
    rows = np.concatenate([unit(b[k]) for b in batches for k in ("teacher_source",
                                                                  "teacher_target")])
    mean = rows.mean(axis=0)
    assert info["pairs"] == 7 and info["mean_norm"] == pytest.approx(np.linalg.norm(mean), 1e-5)
    np.testing.assert_allclose(teacher.mean.numpy(), mean, atol=1e-6)
    source, target = teacher.vectors(batches[0])
    np.testing.assert_allclose(source, unit(unit(batches[0]["teacher_source"]) - mean), atol=1e-6)
    np.testing.assert_allclose(target, unit(unit(batches[0]["teacher_target"]) - mean), atol=1e-6)
    # The shared direction is gone: the centred rows of every batch average to about 0.
    centred = np.concatenate([np.concatenate(teacher.vectors(b)) for b in batches])
    assert np.linalg.norm(centred.mean(axis=0)) < 0.2 < np.linalg.norm(mean)


def test_no_pairs_to_estimate_from_is_a_clear_error():
    teacher = CenteredTeacher(PrecomputedTeacher(5, has_source=True))
    with pytest.raises(ValueError, match="no training pairs"):
        teacher.estimate_mean([])


def test_wrappers_reach_the_base_teacher():
    precomputed = PrecomputedTeacher(5, has_source=False)
    wrapped = CenteredTeacher(EnglishOnlyTeacher(precomputed))
    assert wrapped.base is precomputed and wrapped.english_only
    # precomputed vectors embed nothing new
    assert not hasattr(CenteredTeacher(precomputed), "embed_strings")


def test_a_centred_run_estimates_once_and_resumes_with_the_same_mean(
        teacher_records, sentence_vocab_file, tmp_path):
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, train_steps=2,
                         teacher=TeacherConfig(center=True, center_pairs=16))
    model_dir = str(tmp_path / "m")
    trainer = Trainer(config, model_dir, make_strategy("default"), sentence_vocab_file,
                      progress=False)
    summary = trainer.train()
    assert summary["initialization"]["teacher_center"]["pairs"] == 16
    mean = trainer.task.teacher.mean.numpy()
    assert np.linalg.norm(mean) > 0
    # The terms see centred vectors.
    features = next(iter(trainer.task.dataset()))
    raw = trainer.task.teacher.inner.vectors(features)[0]
    np.testing.assert_allclose(trainer.task.teacher.vectors(features)[0],
                               tf.math.l2_normalize(raw - mean, axis=-1), atol=1e-6)
    config.train_steps = 3
    resumed = Trainer(config, model_dir, make_strategy("default"), sentence_vocab_file,
                      progress=False)
    assert resumed.task.teacher.mean.numpy().sum() == 0  # not yet restored
    summary = resumed.train()
    assert summary["final_step"] == 3 and "teacher_center" not in summary["initialization"]
    np.testing.assert_array_equal(resumed.task.teacher.mean.numpy(), mean)


def test_an_objective_without_teacher_terms_has_nothing_to_centre(
        teacher_records, sentence_vocab_file, tmp_path):
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "ams", train_steps=1,
                         teacher=TeacherConfig(center=True))
    trainer = Trainer(config, str(tmp_path / "m"), make_strategy("default"),
                      sentence_vocab_file, progress=False)
    assert "teacher_center" not in trainer.train()["initialization"]


def test_the_in_step_teacher_embeds_both_sides_with_the_hd_teacher_pass(teacher):
    """`InStepTeacher`: x^t, y^t are the teacher encoder's unit mean-pooled outputs on
    the student's tokens, mapped to the teacher's ids."""
    directory, teacher_encoder, pieces = teacher
    vocabulary = tiny_vocabulary()[::-1]  # other ids than the teacher's for the same pieces
    layers = TeacherLayers(directory, vocabulary, 8, 4, 16)
    in_step = build_teacher(TeacherConfig(in_step=True), layers=layers)
    assert isinstance(in_step, InStepTeacher) and in_step.dimension == 16
    assert in_step.base is in_step and in_step.batch_features({"x": 1}) == {}
    rows = match_rows(vocabulary, pieces)
    sides = {"source": [[5, 9, 14, 3], [7, 30, 0, 0]], "target": [[6, 11, 2, 0], [8, 12, 21, 4]]}
    features = {}
    for side, ids in sides.items():
        ids = np.asarray(ids, np.int32)
        mask = (ids > 0).astype(np.int32)
        features[side] = {"input_word_ids": tf.constant(ids), "input_mask": tf.constant(mask),
                          "input_type_ids": tf.zeros_like(ids)}
    vectors = in_step.vectors(features)
    for side, got in zip(sides, vectors):
        mapped = {**features[side], "input_word_ids": tf.constant(rows[np.asarray(
            sides[side])], tf.int32)}
        # The exported encoder's `default` is the Keras encoder's pooled output.
        expected = teacher_encoder(mapped, training=False)["pooled_output"].numpy()
        np.testing.assert_allclose(got.numpy(), unit(expected), atol=1e-5)
    with pytest.raises(ValueError, match="--embedding_init_source"):
        build_teacher(TeacherConfig(in_step=True))


def test_the_in_step_teacher_trains_fd_ld_and_hd_on_plain_tsvs(
        teacher, tiny_parallel_dir, tiny_vocab_file, tmp_path):
    """`--teacher_in_step`: TSV pairs, no precomputed vectors; settings it cannot serve
    are refused before the teacher is loaded."""
    import dataclasses
    import os

    from lealla_tf.configs import (
        DataConfig,
        EncoderConfig,
        LossConfig,
        OptimizerConfig,
        TokenizerConfig,
        TrainConfig,
    )
    from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
    from lealla_tf.train.launch import train

    directory, _, pieces = teacher
    config = TrainConfig(
        encoder=EncoderConfig(vocabulary_size=len(pieces), num_layers=4, num_heads=4,
                              hidden_dim=8, intermediate_dim=16, max_sequence_length=24,
                              pooling="mean"),
        tokenizer=TokenizerConfig(max_seq_length=16), data=DataConfig([tiny_parallel_dir]),
        teacher=TeacherConfig(in_step=True),
        loss=LossConfig(objective="ams+fd+ld+hd", scale=20.0),
        optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=1),
        embedding_init="teacher_select", embedding_init_source=directory,
        global_batch_size=4, train_steps=3, checkpoint_every=3, log_every=1)
    summary = train(config, str(tmp_path / "m"), os.path.join(directory, SENTENCEPIECE_FILE),
                    progress=False)
    last = summary["last"]
    assert last["fd"] > 0 and last["ld"] >= 0 and last["hd"] > 0
    saved = tf.train.list_variables(summary["checkpoint"])
    assert not any("teacher" in name for name, _ in saved)
    # The student must read the teacher's pieces.
    with pytest.raises(ValueError, match="not a WordPiece vocabulary"):
        train(config, str(tmp_path / "w"), tiny_vocab_file, progress=False)
    for teacher_config, message in (
            (TeacherConfig(in_step=True, english_only=True), "embeds both sides"),
            (TeacherConfig(in_step=True, path=directory), "drop --teacher"),):
        with pytest.raises(ValueError, match=message):
            validate_train_config(dataclasses.replace(config, teacher=teacher_config))
    with pytest.raises(ValueError, match="--embedding_init_source"):
        validate_train_config(dataclasses.replace(config, embedding_init="random",
                                                  embedding_init_source=""))


def test_precomputed_vectors_make_the_teacher_when_there_is_no_module():
    """Without a module, the records' vectors are the teacher: both sides, or the
    English side for an English-only teacher; a both-side objective is never
    silently given English-side vectors only."""
    assert build_teacher(TeacherConfig()) is None  # no module, no vectors
    both = build_teacher(TeacherConfig(), precomputed=(6, True))
    assert isinstance(both, PrecomputedTeacher) and both.dimension == 6 and both.has_source
    english = build_teacher(TeacherConfig(english_only=True), precomputed=(6, False))
    assert isinstance(english, EnglishOnlyTeacher) and english.base.dimension == 6
    batch = {"teacher_tgt": tf.ones([2, 6]), "teacher_src": tf.zeros([2, 6])}
    assert set(english.batch_features(batch)) == {"teacher_target"}
    source, target = english.vectors({"teacher_target": tf.constant([[3.0, 4, 0, 0, 0, 0]])})
    np.testing.assert_allclose(source.numpy(), [[0.6, 0.8, 0, 0, 0, 0]], atol=1e-6)
    assert source is target  # x^t = y^t = T(en)
    with pytest.raises(ValueError, match="English side only.*--teacher_english_only"):
        build_teacher(TeacherConfig(), precomputed=(6, False))


def test_fixed_length_inputs_are_cut_to_the_longest_row():
    mask = tf.constant([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    inputs = {"input_word_ids": mask * 7, "input_mask": mask, "input_type_ids": mask * 0}
    trimmed = trim_to_longest(inputs)
    assert {name: value.shape.as_list() for name, value in trimmed.items()} == {
        name: [2, 3] for name in inputs}
    assert trimmed["input_word_ids"].dtype == tf.int32
    empty = trim_to_longest({"input_mask": tf.zeros([2, 4], tf.int32)})
    assert empty["input_mask"].shape.as_list() == [2, 1]  # never cut to nothing
