"""The frozen teacher run on the student's own tokens (`lealla_tf.teachers.layers`):
its layer outputs for hidden-state distillation (`TeacherLayers`, the hd term), at
the coordinates and layers weight selection gave the student."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import TEACHER_LAYERS, TEACHER_WIDTH, tiny_vocabulary

from lealla_tf.configs import (
    DataConfig,
    EncoderConfig,
    LossConfig,
    OptimizerConfig,
    TokenizerConfig,
    TrainConfig,
)
from lealla_tf.models.encoder import build_encoder
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.teachers.layers import TeacherLayers, prefix_pieces, teacher_prefix
from lealla_tf.teachers.selection import match_rows
from lealla_tf.train.initialization import select_teacher_weights
from lealla_tf.train.launch import train
from lealla_tf.train.resolution import resolve_train_config

# Students at the shape of conftest's `teacher`, unless a test says otherwise.
WIDTH, LAYERS = TEACHER_WIDTH, TEACHER_LAYERS


def student_inputs(ids):
    ids = np.asarray(ids, np.int32)
    return {"input_word_ids": tf.constant(ids), "input_mask": tf.constant((ids > 0).astype(
        np.int32)), "input_type_ids": tf.zeros_like(ids)}


def test_a_student_selected_from_the_teacher_at_its_shape_has_zero_loss(teacher):
    from lealla_tf.losses.functions import hidden_state_distillation_loss

    directory, teacher_encoder, pieces = teacher
    student_vocabulary = tiny_vocabulary()[::-1]  # other ids for the same pieces
    head = TeacherLayers(directory, student_vocabulary, WIDTH, LAYERS, 16)
    assert head.pairs == [(0, 0), (1, 1)] and head.matched_fraction == 1.0
    rows = match_rows(student_vocabulary, pieces)
    np.testing.assert_array_equal(head.ids.numpy(), rows)
    student = build_encoder(EncoderConfig(
        vocabulary_size=len(student_vocabulary), num_layers=LAYERS, num_heads=4,
        hidden_dim=WIDTH, intermediate_dim=32, max_sequence_length=24, pooling="mean",
        dropout=0.0, hidden_activation="gelu"))
    select_teacher_weights(student, rows, directory)
    inputs = student_inputs([[5, 9, 14, 20, 3], [7, 30, 2, 0, 0]])
    targets = head(inputs)
    # The teacher's own layer outputs on the mapped ids, at every coordinate.
    mapped = {**inputs, "input_word_ids": tf.constant(rows[inputs["input_word_ids"].numpy()],
                                                      tf.int32)}
    expected = teacher_encoder(mapped, training=False)["encoder_outputs"]
    for target, reference in zip(targets, expected):
        np.testing.assert_allclose(target.numpy(), reference.numpy(), atol=1e-5)
    states = head.student_states(student(inputs, training=False)["encoder_outputs"])
    loss = hidden_state_distillation_loss(states, targets, inputs["input_mask"])
    np.testing.assert_allclose(loss.numpy(), 0.0, atol=1e-9)


def test_a_narrower_deeper_student_gets_the_selected_coordinates_and_layers(teacher):
    directory, teacher_encoder, pieces = teacher
    student_vocabulary = tiny_vocabulary() + ["not-in-the-teacher"]
    head = TeacherLayers(directory, student_vocabulary, 8, 4, 16)
    assert head.pairs == [(1, 0), (3, 1)]
    rows = match_rows(student_vocabulary, pieces)
    student = build_encoder(EncoderConfig(
        vocabulary_size=len(student_vocabulary), num_layers=4, num_heads=4, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=24, pooling="mean"))
    summary = select_teacher_weights(student, rows, directory)
    assert head.coordinates.numpy().tolist() == summary["hidden_coordinates"]
    # A piece the teacher lacks reads as the teacher's <unk>.
    assert head.ids.numpy()[-1] == pieces.index("<unk>")
    inputs = student_inputs([[5, len(student_vocabulary) - 1, 3]])
    unknown = pieces.index("<unk>")
    mapped = {**inputs, "input_word_ids": tf.constant([[rows[5], unknown, rows[3]]], tf.int32)}
    expected = teacher_encoder(mapped, training=False)["encoder_outputs"][1].numpy()
    np.testing.assert_allclose(head(inputs)[1].numpy(), expected[..., summary[
        "hidden_coordinates"]], atol=1e-5)
    with pytest.raises(ValueError, match="width 32 exceeds the teacher's 16"):
        TeacherLayers(directory, student_vocabulary, 32, 4, 16)
    with pytest.raises(ValueError, match="no token of the student's vocabulary"):
        TeacherLayers(directory, ["x1", "x2"], 8, 4, 16)
    # The teacher has 24 positions: 24 tokens are fine, 25 are refused up front
    # rather than inside the training step.
    assert TeacherLayers(directory, student_vocabulary, 8, 4, max_seq_length=24).pairs
    with pytest.raises(ValueError, match="--max_seq_length=25 exceeds the 24 positions"):
        TeacherLayers(directory, student_vocabulary, 8, 4, max_seq_length=25)


def test_the_hd_term_trains_and_needs_a_teacher_directory(teacher, tiny_vocab_file,
                                                          tiny_parallel_dir, tmp_path):
    directory, _, pieces = teacher
    # The student tokenizes with the teacher's own SentencePiece vocabulary.
    vocab_file = os.path.join(directory, SENTENCEPIECE_FILE)
    config = TrainConfig(
        encoder=EncoderConfig(vocabulary_size=len(pieces), num_layers=4, num_heads=4,
                              hidden_dim=8, intermediate_dim=16, max_sequence_length=24,
                              pooling="mean"),
        tokenizer=TokenizerConfig(max_seq_length=16), data=DataConfig([tiny_parallel_dir]),
        loss=LossConfig(objective="ams+hd", scale=20.0),
        optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=1),
        embedding_init="teacher_select", embedding_init_source=directory,
        global_batch_size=4, train_steps=3, checkpoint_every=3, log_every=1)
    summary = train(config, str(tmp_path / "m"), vocab_file, progress=False)
    assert summary["weights"] == {"ams": 1.0, "hd": 1.0}
    assert 0.0 < summary["last"]["hd"] < 100.0
    # The frozen teacher is not saved with the student.
    saved = tf.train.list_variables(summary["checkpoint"])
    assert saved and not any("teacher" in name for name, _ in saved)
    # A WordPiece student does not read the teacher's tokens: refused.
    with pytest.raises(ValueError, match="not a WordPiece vocabulary"):
        train(config, str(tmp_path / "w"), tiny_vocab_file, progress=False)
    # Nor a student whose coordinates are not the teacher's selection.
    with pytest.raises(ValueError, match="--embedding_init=teacher_select"):
        resolve_train_config(dataclasses.replace(config, embedding_init="random"), 60, None)
    without = TrainConfig(encoder=config.encoder, tokenizer=config.tokenizer,
                          loss=LossConfig(objective="ams+hd"))
    with pytest.raises(ValueError, match="--embedding_init_source"):
        resolve_train_config(without, 60, None)


def test_hdsrc_is_the_source_half_of_hd_and_runs_the_teacher_on_it_only(teacher):
    import types

    from lealla_tf.losses.functions import hidden_state_distillation_loss
    from lealla_tf.losses.objectives import TermInputs, compute_terms

    directory, _, pieces = teacher
    student_vocabulary = tiny_vocabulary()
    head = TeacherLayers(directory, student_vocabulary, 8, 4, 16)
    student = build_encoder(EncoderConfig(
        vocabulary_size=len(student_vocabulary), num_layers=4, num_heads=4, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=24, pooling="mean"))
    select_teacher_weights(student, match_rows(student_vocabulary, pieces), directory)
    source = student_inputs([[5, 9, 14, 3], [7, 30, 0, 0]])
    target = student_inputs([[6, 11, 0, 0], [8, 12, 21, 4]])
    calls = []

    class Counting:  # the head, counting the batches the teacher is run on
        def __getattr__(self, name):
            return getattr(head, name)

        def __call__(self, tokens):
            calls.append(tokens)
            return head(tokens)

    hidden = {side: student(tokens, training=False)["encoder_outputs"]
              for side, tokens in (("source", source), ("target", target))}
    x = TermInputs(*[None] * 6, gather=None, offset=0,
                   heads=types.SimpleNamespace(teacher_layers=Counting()), scale=1.0,
                   margin=0.0, temperature=1.0, batch={"source": source, "target": target},
                   hidden_source=hidden["source"], hidden_target=hidden["target"])
    halves = {side: float(tf.reduce_sum(hidden_state_distillation_loss(
        head.student_states(hidden[side]), head(tokens), tokens["input_mask"])))
        for side, tokens in (("source", source), ("target", target))}
    assert halves["source"] > 0 and halves["target"] > 0
    source_only = compute_terms(["hdsrc"], x, global_batch_size=2)["hdsrc"].numpy()
    assert len(calls) == 1 and calls[0] is source
    both = compute_terms(["hd"], x, global_batch_size=2)["hd"].numpy()
    np.testing.assert_allclose(source_only, halves["source"] / 2, rtol=1e-5)
    np.testing.assert_allclose(both, (halves["source"] + halves["target"]) / 2, rtol=1e-5)


def test_one_teacher_pass_a_side_serves_every_term_that_asks(teacher):
    """`TeacherLayers.outputs` runs the encoder once per token tensor: the hd term
    and the in-step teacher's vectors share it, eagerly and inside a traced step."""
    directory, _, _ = teacher
    head = TeacherLayers(directory, tiny_vocabulary(), 8, 4, 16)
    encoder, calls = head.encoder, []

    def counting(inputs):
        calls.append(inputs["input_word_ids"])
        return encoder(inputs)

    head.encoder = counting
    source = student_inputs([[5, 9, 14, 3], [7, 30, 0, 0]])
    target = student_inputs([[6, 11, 0, 0], [8, 12, 21, 4]])
    states = head(source)
    assert head.outputs(source)["encoder_outputs"][1] is not None and len(calls) == 1
    np.testing.assert_array_equal(head(source)[0].numpy(), states[0].numpy())
    head(target)
    head(target)
    assert len(calls) == 2
    # Only the last few are kept: a long eager loop does not hold every batch, and
    # an evicted batch is run again, to the same values.
    for i in range(TeacherLayers.MEMORY + 2):
        head(student_inputs([[5 + i, 3]]))
    assert len(head._memory) == TeacherLayers.MEMORY
    calls_before = len(calls)
    np.testing.assert_allclose(head(source)[1].numpy(), states[1].numpy(), atol=1e-6)
    assert len(calls) == calls_before + 1

    @tf.function
    def step(source, target):
        return (tf.add_n([tf.reduce_sum(s) for s in head(source) + head(target)])
                + tf.reduce_sum(head.outputs(source)["default"])
                + tf.reduce_sum(head.outputs(target)["default"]))

    del calls[:]
    first = step(source, target)
    assert len(calls) == 2  # one trace: source and target, once each
    # Another shape traces again: a new pass a side, nothing taken from the old graph.
    longer = student_inputs([[5, 9, 14, 3, 6], [7, 30, 0, 0, 0]])
    second = step(longer, target)
    assert len(calls) == 4 and float(second) != float(first)
    np.testing.assert_allclose(float(step(source, target)), float(first), rtol=1e-5)


def test_the_teachers_prefix_runs_before_the_sentence_and_leaves_the_hd_targets(
        teacher, tmp_path):
    """A teacher module with a text prefix (e5's "query: ") sees [start] prefix
    [sentence]: asked for it, the in-step pass puts the prefix's pieces there,
    pools over them as the module does, and gives hd the sentence's positions
    only. By default it runs without (measured better on the student's pieces)."""
    import json
    import shutil

    from lealla_tf.teachers.conversion import TEACHER_SUMMARY

    directory, teacher_encoder, pieces = teacher
    prefixed = tmp_path / "prefixed"
    shutil.copytree(directory, prefixed)
    (prefixed / TEACHER_SUMMARY).write_text(json.dumps({"prefix": "dog is "}))
    assert teacher_prefix(str(prefixed)) == "dog is " and teacher_prefix(directory) == ""
    extra = [pieces.index("\u2581dog"), pieces.index("\u2581is")]
    assert prefix_pieces(str(prefixed), "dog is ") == extra
    student_vocabulary = tiny_vocabulary()
    rows = match_rows(student_vocabulary, pieces)
    head = TeacherLayers(str(prefixed), student_vocabulary, WIDTH, LAYERS, 16,
                         prefix=teacher_prefix(str(prefixed)))
    plain = TeacherLayers(str(prefixed), student_vocabulary, WIDTH, LAYERS, 16)
    assert head.prefix == "dog is " and plain.prefix == ""
    inputs = student_inputs([[3, 9, 14, 20, 4], [3, 30, 4, 0, 0]])
    ids = rows[inputs["input_word_ids"].numpy()]
    mask = inputs["input_mask"].numpy()
    full_ids = np.concatenate([ids[:, :1], np.tile(extra, (2, 1)), ids[:, 1:]], axis=1)
    full_mask = np.concatenate([mask[:, :1], np.ones((2, 2), np.int32), mask[:, 1:]], axis=1)
    expected = teacher_encoder({"input_word_ids": tf.constant(full_ids, tf.int32),
                                "input_mask": tf.constant(full_mask),
                                "input_type_ids": tf.zeros_like(full_ids)}, training=False)
    outputs = head.outputs(inputs)
    np.testing.assert_allclose(outputs["default"].numpy(), expected["pooled_output"].numpy(),
                               atol=1e-5)
    for target, reference in zip(head(inputs), expected["encoder_outputs"]):
        assert target.shape == (2, 5, WIDTH)
        np.testing.assert_allclose(target.numpy(), np.delete(reference.numpy(), [1, 2], axis=1),
                                   atol=1e-5)
    # The same tokens without the prefix are another pass, with other values.
    assert not np.allclose(plain.outputs(inputs)["default"].numpy(),
                           outputs["default"].numpy(), atol=1e-3)
    # The prefix counts towards the teacher's 24 positions.
    with pytest.raises(ValueError, match="plus the 2 pieces of the prefix 'dog is '"):
        TeacherLayers(str(prefixed), student_vocabulary, WIDTH, LAYERS, max_seq_length=23,
                      prefix="dog is ")
    assert TeacherLayers(str(prefixed), student_vocabulary, WIDTH, LAYERS, 23).pairs
    # A prefix that merges with the sentence's first piece cannot run in the step.
    with pytest.raises(ValueError, match="does not tokenize apart"):
        prefix_pieces(str(prefixed), "dog")


def test_a_teacher_with_its_architecture_runs_as_a_rebuilt_network(teacher, tmp_path):
    """teacher.json's encoder_config: the network runs in-process (the fused
    kernels where usable, the compute dtype of the policy) with the module's outputs."""
    import json
    import shutil

    import keras

    from lealla_tf.configs import config_to_dict

    directory, teacher_encoder, _ = teacher
    rebuilt = tmp_path / "teacher"
    shutil.copytree(directory, rebuilt)
    (rebuilt / "teacher.json").write_text(json.dumps(
        {"encoder_config": config_to_dict(teacher_encoder.encoder_config)}))
    student_vocabulary = tiny_vocabulary()
    module = TeacherLayers(directory, student_vocabulary, 8, 4, 16)
    network = TeacherLayers(str(rebuilt), student_vocabulary, 8, 4, 16)
    assert module.network is None and network.network is not None
    assert not network.network.trainable_weights
    inputs = student_inputs([[3, 8, 9, 10, 4, 0], [3, 11, 4, 0, 0, 0]])
    ours, theirs = network.outputs(inputs), module.outputs(inputs)
    for name in ("default", "sequence_output"):
        np.testing.assert_allclose(ours[name], theirs[name], atol=1e-5, err_msg=name)
    for a, b in zip(ours["encoder_outputs"], theirs["encoder_outputs"]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_array_equal(network.coordinates, module.coordinates)
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        half = TeacherLayers(str(rebuilt), student_vocabulary, 8, 4, 16)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert half.network.compute_dtype == "bfloat16"
    outputs = half.outputs(inputs)
    assert outputs["default"].dtype == tf.float32
    np.testing.assert_allclose(outputs["default"], theirs["default"], atol=5e-2)


def test_the_teacher_embeds_in_bfloat16_at_the_modules_vectors(teacher, tmp_path):
    """`teacher_embedder`: a teacher that records its architecture embeds with its
    network rebuilt in bfloat16, through the module's own tokenizer, within
    rounding of the float32 module; asked for float32, or without a recorded
    architecture, it is the module itself."""
    import json
    import shutil

    from lealla_tf.configs import config_to_dict
    from lealla_tf.inference.loaders import load_embedder
    from lealla_tf.teachers.conversion import TEACHER_SUMMARY
    from lealla_tf.teachers.layers import teacher_embedder

    directory, encoder, _ = teacher
    recorded = str(tmp_path / "teacher")
    shutil.copytree(directory, recorded)
    (tmp_path / "teacher" / TEACHER_SUMMARY).write_text(
        json.dumps({"encoder_config": config_to_dict(encoder.encoder_config)}))
    sentences = ["The dog is nice.", "Der Hund ist nett.", "a much longer sentence " * 3]
    module = load_embedder(directory).encode(sentences)
    fast = teacher_embedder(recorded, bfloat16=True)
    assert "bfloat16" in fast.description
    vectors = fast.encode(sentences)
    assert vectors.shape == module.shape
    assert np.min(np.sum(vectors * module, axis=1)) > 0.99
    assert "bfloat16" not in teacher_embedder(recorded, bfloat16=False).description
    plain = teacher_embedder(directory, bfloat16=True)  # no architecture recorded
    assert "bfloat16" not in plain.description
    np.testing.assert_allclose(plain.encode(sentences), module, atol=1e-6)
