"""Teacher-initialised students (`lealla_tf.train.initialization`): the teacher's
token embeddings by PCA or under a bottleneck, or every weight by weight selection
(which coordinates and layers it keeps: tests/teachers/test_selection.py)."""

import json

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.configs import EncoderConfig
from lealla_tf.inference.formats import export_labse_pair
from lealla_tf.models.encoder import build_encoder
from lealla_tf.teachers.conversion import TEACHER_SUMMARY
from lealla_tf.teachers.selection import teacher_hidden_ranking
from lealla_tf.tokenizers.tokenizer import Tokenizer
from lealla_tf.train.initialization import (
    pass_through_layers,
    pass_through_norm,
    pca,
    select_teacher_weights,
)

TEACHER = dict(vocabulary_size=40, num_layers=2, num_heads=4, hidden_dim=16,
               intermediate_dim=32, max_sequence_length=24, pooling="mean", dropout=0.0,
               hidden_activation="gelu")
LOUD = 5  # the teacher's hidden coordinate made far larger than the others


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_vocab_file):
    """A converted-teacher directory (encoder/ SavedModel) of a tiny random BERT whose
    coordinate LOUD carries a large constant, like BERT's outlier dimensions."""
    teacher = build_encoder(EncoderConfig(**TEACHER), name="teacher_encoder")
    rng = np.random.default_rng(0)
    for weight in teacher.weights:  # BERT-scale random weights, biases included
        weight.assign(rng.normal(scale=0.2, size=weight.shape).astype(np.float32))
    for weight in teacher.weights:  # the embeddings' and each layer's output layer norm
        if weight.path.endswith(("embeddings_layer_norm/gamma", "feedforward_layer_norm/gamma")):
            weight.assign(np.ones(weight.shape, np.float32))
        elif weight.path.endswith(("embeddings_layer_norm/beta", "feedforward_layer_norm/beta")):
            weight.assign(np.eye(TEACHER["hidden_dim"], dtype=np.float32)[LOUD] * 8.0)
    directory = str(tmp_path_factory.mktemp("teacher"))
    export_labse_pair(teacher, Tokenizer(tiny_vocab_file, max_seq_length=16), directory)
    return directory, teacher


def student(**changes):
    return build_encoder(EncoderConfig(**{**TEACHER, **changes}))


def weights_of(encoder):
    return {w.path: w.numpy() for w in encoder.weights}


def sequence_output(encoder, ids):
    inputs = {"input_word_ids": tf.constant(ids), "input_mask": tf.ones_like(ids),
              "input_type_ids": tf.zeros_like(ids)}
    return encoder(inputs, training=False)["sequence_output"].numpy()


IDS = np.array([[1, 7, 9, 12, 3, 2], [1, 30, 31, 4, 2, 0]], np.int32)


def test_a_student_as_wide_as_the_teacher_is_the_teacher(teacher_dir):
    directory, teacher = teacher_dir
    encoder = student()
    summary = select_teacher_weights(encoder, np.arange(TEACHER["vocabulary_size"]), directory)
    assert summary["hidden_coordinates"] == list(range(16))
    assert summary["layer_sources"] == [0, 1]
    np.testing.assert_allclose(sequence_output(encoder, IDS), sequence_output(teacher, IDS),
                               atol=1e-5)


def test_a_narrower_student_takes_the_loudest_coordinates_and_keeps_the_logit_scale(
        teacher_dir):
    directory, teacher = teacher_dir
    # 8 of 16 coordinates; 4 heads of width 2 instead of 4; 16 of 32 feed-forward units.
    encoder = student(hidden_dim=8, intermediate_dim=16)
    rows = np.array([3, -1] + list(range(2, TEACHER["vocabulary_size"])))
    before = encoder.token_embedding.embeddings.numpy()
    summary = select_teacher_weights(encoder, rows, directory)
    hidden = np.array(summary["hidden_coordinates"])
    assert len(hidden) == 8 and LOUD in hidden and np.all(np.diff(hidden) > 0)
    # The same ranking from the in-memory teacher on the same random sequences.
    ids = np.random.default_rng(0).choice(rows[rows >= 0], size=(64, 16)).astype(np.int32)
    outputs = teacher({"input_word_ids": ids, "input_mask": np.ones_like(ids),
                       "input_type_ids": np.zeros_like(ids)}, training=False)["encoder_outputs"]
    magnitude = np.mean([np.abs(o.numpy()).mean(axis=(0, 1)) for o in outputs], axis=0)
    np.testing.assert_array_equal(hidden, np.sort(np.argsort(-magnitude)[:8]))
    np.testing.assert_array_equal(teacher_hidden_ranking(directory, rows[rows >= 0]),
                                  np.argsort(-magnitude, kind="stable"))
    mine, theirs = weights_of(encoder), weights_of(teacher)
    table = theirs["token_embedding/embeddings"]
    np.testing.assert_array_equal(mine["token_embedding/embeddings"][0], table[3][hidden])
    # A student token the teacher lacks keeps its random row.
    np.testing.assert_array_equal(mine["token_embedding/embeddings"][1], before[1])
    np.testing.assert_array_equal(mine["token_embedding/embeddings"][2:], table[2:][:, hidden])
    query = theirs["transformer_layer_1/self_attention_layer/query/kernel"]
    # Head dimensions 0 and 3 of 4; Q.K over half the dimensions, so the query
    # is scaled by sqrt(4 / 2).
    np.testing.assert_allclose(mine["transformer_layer_1/self_attention_layer/query/kernel"],
                               query[hidden][:, :, [0, 3]] * np.sqrt(2.0), rtol=1e-6)
    into = theirs["transformer_layer_1/feedforward_intermediate_dense/kernel"][hidden]
    out = theirs["transformer_layer_1/feedforward_output_dense/kernel"][:, hidden]
    units = np.sort(np.argsort(-np.linalg.norm(into, axis=0) * np.linalg.norm(out, axis=1))[:16])
    np.testing.assert_array_equal(
        mine["transformer_layer_1/feedforward_intermediate_dense/kernel"], into[:, units])
    np.testing.assert_array_equal(mine["transformer_layer_1/feedforward_output_dense/kernel"],
                                  out[units])
    np.testing.assert_array_equal(mine["position_embedding/embeddings"],
                                  theirs["position_embedding/embeddings"][:, hidden])


def test_a_student_with_fewer_heads_takes_the_first_heads_whole(teacher_dir):
    directory, teacher = teacher_dir
    # 2 heads of width 4 (the teacher's width): no query scaling.
    encoder = student(hidden_dim=8, num_heads=2)
    hidden = np.array(select_teacher_weights(
        encoder, np.arange(TEACHER["vocabulary_size"]), directory)["hidden_coordinates"])
    mine, theirs = weights_of(encoder), weights_of(teacher)
    attention = "transformer_layer_0/self_attention_layer/"
    for name in ("query", "key", "value"):
        np.testing.assert_array_equal(mine[f"{attention}{name}/kernel"],
                                      theirs[f"{attention}{name}/kernel"][hidden][:, :2])
        np.testing.assert_array_equal(mine[f"{attention}{name}/bias"],
                                      theirs[f"{attention}{name}/bias"][:2])
    np.testing.assert_array_equal(mine[f"{attention}attention_output/kernel"],
                                  theirs[f"{attention}attention_output/kernel"][:2][..., hidden])
    for name in ("embeddings_layer_norm/gamma", "embeddings_layer_norm/beta",
                 "transformer_layer_0/self_attention_layer_norm/beta",
                 f"{attention}attention_output/bias"):
        np.testing.assert_array_equal(mine[name], theirs[name][hidden])
    segments = mine["segment_embedding/embeddings"]
    np.testing.assert_array_equal(segments[0], theirs["segment_embedding/embeddings"][0][hidden])
    np.testing.assert_array_equal(segments[1], segments[0])


def test_a_deeper_student_interleaves_pass_through_layers(teacher_dir):
    directory, teacher = teacher_dir
    encoder = student(num_layers=4)
    select_teacher_weights(encoder, np.arange(TEACHER["vocabulary_size"]), directory)
    mine, theirs = weights_of(encoder), weights_of(teacher)
    copied = [name for name in theirs if name.startswith("transformer_layer_1/")]
    assert len(copied) == 16
    for name in copied:
        np.testing.assert_array_equal(
            mine[name.replace("transformer_layer_1/", "transformer_layer_2/")], theirs[name])
    zeroed = [name for name in mine if name.startswith((
        "transformer_layer_1/self_attention_layer/attention_output/",
        "transformer_layer_3/feedforward_output_dense/"))]
    assert len(zeroed) == 4
    for name in zeroed:
        assert not mine[name].any(), name
    # A pass-through layer keeps the rest of its random initialisation.
    assert mine["transformer_layer_3/self_attention_layer/query/kernel"].any()


def test_the_pass_through_layers_are_the_ones_no_teacher_layer_starts(teacher_dir):
    """What a progressive-depth run skips: the layers weight selection zeroes."""
    directory, _ = teacher_dir
    assert pass_through_layers(4, directory) == {1, 3}
    assert pass_through_layers(5, directory) == {1, 3, 4}
    assert pass_through_layers(2, directory) == frozenset()


def test_the_pass_through_layers_come_from_teacher_json_without_loading_the_teacher(tmp_path):
    """A converted teacher's summary names its depth; its encoder is not read."""
    (tmp_path / TEACHER_SUMMARY).write_text(json.dumps({"num_layers": 12}))
    assert pass_through_layers(24, str(tmp_path)) == set(range(1, 24, 2))


@pytest.mark.parametrize("changes, message", [
    ({"hidden_dim": 32}, "hidden width 32 exceeds the teacher's 16"),
    ({"num_heads": 8, "hidden_dim": 16}, "heads 8 exceeds the teacher's 4"),
    ({"intermediate_dim": 64}, "feed-forward width 64 exceeds the teacher's 32"),
    ({"embedding_dim": 16}, "without embedding bottleneck"),
    ({"num_unique_layers": 1}, "parameter recurrence"),
])
def test_a_student_the_teacher_cannot_cover_is_a_clear_error(teacher_dir, changes, message):
    directory, _ = teacher_dir
    with pytest.raises(ValueError, match=message):
        select_teacher_weights(student(**changes), np.arange(40), directory)


def test_pca_keeps_the_leading_variance():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(200, 6)) * np.array([5.0, 3.0, 1.0, 0.1, 0.1, 0.1])
    mean, components = pca(table.astype(np.float32), 2)
    np.testing.assert_allclose(mean, table.mean(0), atol=1e-5)
    # The two leading principal axes are the two widest coordinates.
    assert set(np.argmax(np.abs(components), axis=0)) == {0, 1}
    with pytest.raises(ValueError, match="cannot project 6-d"):
        pca(table, 8)


def test_pass_through_layers_hand_their_input_on(teacher_dir):
    """A student twice the teacher's depth, as wide: its step-0 output is 0.21
    (relative L2) from the teacher's, where layer norms left at (1, 0), which
    re-standardise every placed layer's output and drop the teacher's loud
    coordinate, put it 0.65 away. A layer norm cannot do better than the
    first: a token's own spread over coordinates moves with its value on the
    loud one, and one constant scale serves every token."""
    directory, teacher = teacher_dir
    encoder = student(num_layers=4)
    select_teacher_weights(encoder, np.arange(TEACHER["vocabulary_size"]), directory)
    theirs = sequence_output(teacher, IDS)
    mask = IDS > 0

    def distance(ours):
        return (np.linalg.norm((ours - theirs)[mask]) / np.linalg.norm(theirs[mask]))

    kept = distance(sequence_output(encoder, IDS))
    for layer in (encoder.transformer_layers[1], encoder.transformer_layers[3]):
        for weight in layer.weights:
            if "layer_norm/" in weight.path:
                weight.assign(np.full(weight.shape, weight.path.endswith("gamma"), np.float32))
    standardised = distance(sequence_output(encoder, IDS))
    assert kept < 0.25, kept
    assert standardised > 2.5 * kept, (kept, standardised)


def test_pass_through_norm_keeps_the_spread_and_offset_of_the_norm_before():
    """For y = gamma z + beta with z standardised, y's mean over coordinates is about
    mean(beta) and its variance about mean(gamma^2) + var(beta)."""
    rng = np.random.default_rng(3)
    gamma = rng.uniform(0.5, 2.0, size=64).astype(np.float32)
    beta = rng.normal(size=64).astype(np.float32)
    scale, offset = pass_through_norm(gamma, beta)
    assert scale.shape == gamma.shape and offset.shape == beta.shape
    np.testing.assert_allclose(scale, np.sqrt(np.mean(gamma ** 2) + np.var(beta)), rtol=1e-6)
    np.testing.assert_allclose(offset, np.mean(beta), rtol=1e-6)
    z = rng.normal(size=(20000, 64))
    z = (z - z.mean(axis=1, keepdims=True)) / z.std(axis=1, keepdims=True)
    y = gamma * z + beta  # the previous layer norm's output, token by token
    np.testing.assert_allclose(y.std(axis=1).mean(), scale[0], rtol=0.05)
    np.testing.assert_allclose(y.mean(axis=1).mean(), offset[0], atol=0.05)
