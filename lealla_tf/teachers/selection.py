"""What a student keeps of its teacher: the teacher's row of each student piece
(`match_rows`), the teacher's hidden coordinates a narrower student keeps
(`selected_coordinates`), the teacher layer each student layer starts from
(`layer_sources`) and the pairs of layers whose outputs correspond
(`distilled_layer_pairs`).

Weight selection (`lealla_tf.train.initialization`, `--embedding_init=teacher_select`)
sets the student's weights from these choices, and the hd term's targets
(`lealla_tf.teachers.layers.TeacherLayers`) are read at the same coordinates and
layers, so the two always agree.

Rows are matched by piece text: a SentencePiece piece to the same piece; a
WordPiece token `t` to the teacher's word-initial `▁t`, `##t` to `t`.
"""

import os

import numpy as np
import tensorflow as tf

from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
from lealla_tf.tokenizers.pruning import read_model_proto
from lealla_tf.tokenizers.sentencepiece_model import parse_model
from lealla_tf.tokenizers.tokenizer import read_wordpiece_vocabulary

WORD_START = "\u2581"


def teacher_pieces(teacher_dir: str) -> list[str]:
    """The pieces, in id order, of a converted teacher's SentencePiece vocabulary."""
    model_file = os.path.join(teacher_dir, SENTENCEPIECE_FILE)
    if not os.path.exists(model_file):
        raise FileNotFoundError(
            f"{model_file} not found: --embedding_init_source must be a teacher converted by "
            "export/convert_teacher.py with a SentencePiece vocabulary (multilingual-e5-small)")
    return [p.piece for p in parse_model(read_model_proto(model_file)).pieces]


def student_pieces(tokenizer) -> list[str]:
    """The student's vocabulary as strings, in id order."""
    if tokenizer.kind == "sentencepiece":
        return [p.piece for p in parse_model(read_model_proto(
            tokenizer.vocab_file.asset_path.numpy().decode())).pieces]
    return read_wordpiece_vocabulary(tokenizer.vocab_file.asset_path.numpy().decode())


def match_rows(student: list[str], teacher: list[str]) -> np.ndarray:
    """For each student token, the teacher row with the same piece, or -1."""
    index: dict[str, int] = {}
    for i, piece in enumerate(teacher):
        index.setdefault(piece, i)
    rows = []
    for token in student:
        if token in index:
            rows.append(index[token])
        elif token.startswith("##") and token[2:] in index:
            rows.append(index[token[2:]])
        elif WORD_START + token in index:
            rows.append(index[WORD_START + token])
        else:
            rows.append(-1)
    return np.asarray(rows, np.int64)


def teacher_hidden_ranking(teacher_dir: str, token_rows: np.ndarray, sequences: int = 64,
                           length: int = 16, seed: int = 0, encoder=None) -> np.ndarray:
    """The teacher's hidden coordinates, most active first.

    Mean |activation| over every layer's output, on `sequences` random
    sequences of `token_rows` (the student's pieces): BERT-style models carry
    a few coordinates of much larger magnitude that the others depend on, and
    random text finds nearly the same ones as real sentences. `encoder`: the
    teacher's encoder module, when the caller has loaded it already.
    """
    if encoder is None:
        encoder = tf.saved_model.load(os.path.join(teacher_dir, "encoder"))
    rng = np.random.default_rng(seed)
    ids = rng.choice(token_rows, size=(sequences, length)).astype(np.int32)
    inputs = {"input_word_ids": tf.constant(ids), "input_mask": tf.ones_like(ids),
              "input_type_ids": tf.zeros_like(ids)}
    outputs = encoder(inputs)["encoder_outputs"]
    magnitude = np.mean([np.abs(o.numpy()).mean(axis=(0, 1)) for o in outputs], axis=0)
    return np.argsort(-magnitude, kind="stable")


def selected_coordinates(teacher_dir: str, rows: np.ndarray, width: int,
                         encoder=None) -> np.ndarray:
    """The `width` teacher hidden coordinates a student of that width keeps (sorted):
    the most active ones on the student's matched pieces (`rows >= 0`)."""
    return np.sort(teacher_hidden_ranking(teacher_dir, rows[rows >= 0],
                                          encoder=encoder)[:width])


def distilled_layer_pairs(student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) whose outputs correspond under `layer_sources`.

    A student layer's output corresponds to the teacher layer it started from,
    or, when pass-through layers follow it, the last of those (a deeper student:
    teacher layer i placed at student layer j is matched at the layer before the
    next placed one, and the last teacher layer at the student's last).
    """
    sources = layer_sources(student_layers, teacher_layers)
    pairs = []
    for j, source in enumerate(sources):
        if source is None:
            continue
        end = j
        while end + 1 < student_layers and sources[end + 1] is None:
            end += 1
        pairs.append((end, source))
    return pairs


def layer_sources(student_layers: int, teacher_layers: int) -> list[int | None]:
    """For each student layer, the teacher layer it starts from, or None (a pass-through layer).

    A deeper student spreads the teacher's layers evenly (the ones in between
    start as pass-through layers); a shallower one takes evenly spaced teacher
    layers.
    """
    if student_layers >= teacher_layers:
        sources: list[int | None] = [None] * student_layers
        for i in range(teacher_layers):
            sources[int(np.floor(i * student_layers / teacher_layers))] = i
        return sources
    return [int(np.floor(j * teacher_layers / student_layers)) for j in range(student_layers)]
