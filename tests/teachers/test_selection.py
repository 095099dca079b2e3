"""What a student keeps of its teacher (`lealla_tf.teachers.selection`): the teacher
row of each student piece, the hidden coordinates, and which teacher layer each
student layer starts from and is distilled against."""

import numpy as np
import pytest
from conftest import tiny_vocabulary

from lealla_tf.configs import EncoderConfig
from lealla_tf.models.encoder import build_encoder
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.teachers.selection import (
    WORD_START,
    distilled_layer_pairs,
    layer_sources,
    match_rows,
    selected_coordinates,
    student_pieces,
    teacher_hidden_ranking,
    teacher_pieces,
)
from lealla_tf.tokenizers import sentencepiece_model as spm_model
from lealla_tf.tokenizers.tokenizer import Tokenizer


def test_layers_spread_evenly_and_the_rest_start_as_pass_through():
    assert layer_sources(24, 12) == [0, None, 1, None, 2, None, 3, None, 4, None, 5, None,
                                     6, None, 7, None, 8, None, 9, None, 10, None, 11, None]
    assert layer_sources(12, 12) == list(range(12))
    assert layer_sources(3, 2) == [0, 1, None]
    assert layer_sources(4, 12) == [0, 3, 6, 9]


def test_distilled_layers_are_the_last_of_each_pass_through_run():
    assert distilled_layer_pairs(24, 12) == [(2 * i + 1, i) for i in range(12)]
    assert distilled_layer_pairs(12, 12) == [(i, i) for i in range(12)]
    assert distilled_layer_pairs(3, 2) == [(0, 0), (2, 1)]
    assert distilled_layer_pairs(4, 12) == [(0, 0), (1, 3), (2, 6), (3, 9)]




def test_rows_match_by_piece():
    teacher = ["<s>", WORD_START + "dog", "s", WORD_START + "the"]
    # A piece to the same piece; a WordPiece token to the word-initial piece,
    # `##s` to `s`; what the teacher lacks is -1.
    assert match_rows(["the", "##s", "dog", "cat", "<s>"], teacher).tolist() == [3, 2, 1, -1, 0]
    assert match_rows(["s", "s"], ["s", "s"]).tolist() == [0, 0]  # the first of a repeat


def test_the_pieces_of_a_teacher_and_of_a_student(tiny_vocab_file, tmp_path):
    pieces = ["<pad>", "<s>", "</s>", "<unk>", WORD_START + "dog", "s"]
    model = spm_model.SentencePieceModel(
        [spm_model.Piece(p, 0, spm_model.CONTROL) for p in pieces[:3]]
        + [spm_model.Piece("<unk>", 0, spm_model.UNKNOWN)]
        + [spm_model.Piece(p, -1.0) for p in pieces[4:]],
        spm_model.normalizer_spec_from_map({}, "identity"))
    (tmp_path / SENTENCEPIECE_FILE).write_bytes(model.serialize())
    assert teacher_pieces(str(tmp_path)) == pieces
    assert student_pieces(Tokenizer(tiny_vocab_file, max_seq_length=16)) == tiny_vocabulary()
    with pytest.raises(FileNotFoundError, match="--embedding_init_source must be a teacher"):
        teacher_pieces(str(tmp_path / "elsewhere"))


LOUD = 5  # the teacher's hidden coordinate made far larger than the others


def test_a_narrower_student_keeps_the_teachers_most_active_coordinates():
    teacher = build_encoder(EncoderConfig(
        vocabulary_size=40, num_layers=2, num_heads=4, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=24, pooling="mean", dropout=0.0))
    for weight in teacher.weights:  # the embeddings' and each layer's output layer norm
        if weight.path.endswith(("embeddings_layer_norm/beta", "feedforward_layer_norm/beta")):
            weight.assign(np.eye(16, dtype=np.float32)[LOUD] * 8.0)
    rows = np.array([3, -1, 7, 9, 12, 30, -1, 31])
    ranking = teacher_hidden_ranking("unused", rows[rows >= 0], encoder=teacher)
    assert sorted(ranking.tolist()) == list(range(16)) and ranking[0] == LOUD
    # The same sequences, so the same ranking, every time.
    np.testing.assert_array_equal(ranking, teacher_hidden_ranking("unused", rows[rows >= 0],
                                                                  encoder=teacher))
    kept = selected_coordinates("unused", rows, 8, encoder=teacher)
    np.testing.assert_array_equal(kept, np.sort(ranking[:8]))
    # Unmatched student pieces (-1) play no part: more of them change nothing.
    more = np.concatenate([rows, [-1, -1]])
    np.testing.assert_array_equal(selected_coordinates("unused", more, 8, encoder=teacher), kept)
