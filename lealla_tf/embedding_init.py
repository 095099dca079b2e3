"""Teacher-initialised token embeddings for the student.

A student whose vocabulary shares pieces with the teacher's (the teacher's own
SentencePiece model, or a pruned one from `lealla_tf.vocab_pruning`) can start
from the teacher's token embeddings instead of random ones:

- "teacher_pca": the rows of the teacher's table for the student's pieces,
  centred and projected to the student's width d by PCA fitted on those rows;
- "teacher_bottleneck": the teacher-width rows themselves, under the encoder's
  embedding bottleneck (Ding et al. 2022), whose trainable projection to d
  starts at the same PCA components.

Rows are matched by piece text: a SentencePiece piece to the same piece; a
WordPiece token `t` to the teacher's word-initial `▁t`, `##t` to `t`. Tokens the
teacher lacks keep their random initialisation; the match rate is reported.
"""

import os
from typing import Dict, List, Tuple

import numpy as np

WORD_START = "\u2581"


def teacher_vocabulary_and_table(teacher_dir: str) -> Tuple[List[str], np.ndarray]:
    """(pieces in id order, token embedding table [vocabulary, D]) of a converted teacher."""
    from lealla_tf.checkpoint_conversion import read_saved_model_variables
    from lealla_tf.teacher_conversion import SENTENCEPIECE_FILE

    model_file = os.path.join(teacher_dir, SENTENCEPIECE_FILE)
    if not os.path.exists(model_file):
        raise FileNotFoundError(
            f"{model_file} not found: --embedding_init_source must be a teacher converted by "
            "export/convert_teacher.py with a SentencePiece vocabulary (multilingual-e5-small)")
    from lealla_tf.sentencepiece_model import parse_model
    from lealla_tf.vocab_pruning import read_model_proto

    pieces = [p.piece for p in parse_model(read_model_proto(model_file)).pieces]
    variables = read_saved_model_variables(os.path.join(teacher_dir, "encoder"))
    tables = [v for name, v in variables.items() if name.endswith("token_embedding/embeddings")]
    if len(tables) != 1:
        raise ValueError(f"{teacher_dir}/encoder: expected one token embedding table, found "
                         f"{len(tables)}")
    return pieces, np.asarray(tables[0], np.float32)


def student_pieces(tokenizer) -> List[str]:
    """The student's vocabulary as strings, in id order."""
    if tokenizer.kind == "sentencepiece":
        from lealla_tf.sentencepiece_model import parse_model
        from lealla_tf.vocab_pruning import read_model_proto

        return [p.piece for p in parse_model(read_model_proto(
            tokenizer.vocab_file.asset_path.numpy().decode())).pieces]
    from lealla_tf.tokenizer import read_wordpiece_vocabulary

    return read_wordpiece_vocabulary(tokenizer.vocab_file.asset_path.numpy().decode())


def match_rows(student: List[str], teacher: List[str]) -> np.ndarray:
    """For each student token, the teacher row with the same piece, or -1."""
    index: Dict[str, int] = {}
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


def pca(table: np.ndarray, dimension: int) -> Tuple[np.ndarray, np.ndarray]:
    """(mean [D], components [D, dimension]) of the rows of `table`."""
    if dimension > table.shape[1]:
        raise ValueError(f"cannot project {table.shape[1]}-d teacher embeddings up to "
                         f"{dimension} dimensions by PCA")
    mean = table.mean(axis=0)
    centred = table - mean
    _, _, vt = np.linalg.svd(centred.astype(np.float64), full_matrices=False)
    return mean.astype(np.float32), vt[:dimension].T.astype(np.float32)


def initialize_token_embeddings(encoder, tokenizer, teacher_dir: str, mode: str) -> dict:
    """Sets `encoder`'s token embeddings from the teacher's (see the module docstring).

    Returns a summary: rows matched, the fraction of the teacher's variance
    the projection keeps.
    """
    teacher_pieces, table = teacher_vocabulary_and_table(teacher_dir)
    rows = match_rows(student_pieces(tokenizer), teacher_pieces)
    matched = rows >= 0
    if not matched.any():
        raise ValueError(f"no token of the student's vocabulary is in {teacher_dir}'s "
                         "vocabulary; --embedding_init needs a shared vocabulary")
    chosen = table[rows[matched]]
    width = encoder.hidden_dim
    mean, components = pca(chosen, width)
    variance = float(np.square((chosen - mean) @ components).sum()
                     / max(np.square(chosen - mean).sum(), 1e-12))
    embeddings = encoder.token_embedding.embeddings
    values = np.array(embeddings.numpy())
    if mode == "teacher_pca":
        if values.shape[1] != width:
            raise ValueError("teacher_pca needs no embedding bottleneck (embedding_dim None)")
        projected = (chosen - mean) @ components
        # BERT's initial scale (0.02), so the position and segment embeddings
        # still count after the sum.
        projected *= 0.02 / max(float(projected.std()), 1e-12)
        values[matched] = projected
    elif mode == "teacher_bottleneck":
        if values.shape[1] != table.shape[1]:
            raise ValueError(f"teacher_bottleneck needs embedding_dim={table.shape[1]} (the "
                             f"teacher's width), the encoder has {values.shape[1]}")
        values[matched] = chosen
        # The projection starts as the PCA, scaled to BERT's initial 0.02 so the
        # position and segment embeddings still count after the sum.
        kernel = components * (0.02 / max(float(((chosen - mean) @ components).std()), 1e-12))
        encoder.embedding_projection.kernel.assign(kernel)
        encoder.embedding_projection.bias.assign(-(mean @ kernel))
    else:
        raise ValueError(f"unknown embedding_init {mode!r}")
    embeddings.assign(values.astype(embeddings.dtype))
    return {"mode": mode, "source": teacher_dir, "rows": int(len(rows)),
            "rows_matched": int(matched.sum()), "matched_fraction": float(matched.mean()),
            "variance_kept": variance}
