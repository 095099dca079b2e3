"""Teacher-initialised students: token embeddings, or every teacher-shaped weight.

A student whose vocabulary shares pieces with the teacher's (the teacher's own
SentencePiece model, or a pruned one from `lealla_tf.tokenizers.pruning`) can start
from the teacher's token embeddings instead of random ones:

- "teacher_pca": the rows of the teacher's table for the student's pieces,
  centred and projected to the student's width d by PCA fitted on those rows;
- "teacher_bottleneck": the teacher-width rows themselves, under the encoder's
  embedding bottleneck (Ding et al. 2022), whose trainable projection to d
  starts at the same PCA components;
- "teacher_select": the embeddings and the layers selected from the teacher's
  (weight selection, Xu et al. 2024, "Initializing models with larger ones"):
  the student keeps d of the teacher's hidden coordinates (those with the
  largest mean activation, which keeps BERT's outlier dimensions:
  `lealla_tf.teachers.selection.selected_coordinates`), its first
  heads and evenly spaced dimensions of each, and the feed-forward units with
  the largest weight norms. A deeper student puts teacher layer i at student
  layer floor(i * L_student / L_teacher); the layers in between keep their
  random initialisation except for zero output projections and layer norms
  set to hand their input on (`pass_through_norm`), and learn from there. A
  shallower student takes evenly spaced teacher layers
  (`lealla_tf.teachers.selection.layer_sources`). Every segment starts as
  the teacher's first; a [CLS] pooler or output projection stays random. Needs a
  student no wider than the teacher in each of these, without bottleneck or
  recurrence, and a teacher with the same activation works best.

Rows are matched by piece text (`lealla_tf.teachers.selection.match_rows`). Tokens
the teacher lacks keep their random initialisation; the match rate is reported.
"""

import os

import numpy as np

from lealla_tf.models.checkpoint_conversion import read_saved_model_variables
from lealla_tf.teachers.conversion import read_teacher_summary
from lealla_tf.teachers.selection import (
    layer_sources,
    match_rows,
    selected_coordinates,
    student_pieces,
    teacher_pieces,
)


def teacher_vocabulary_and_table(teacher_dir: str
                                 ) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
    """(pieces in id order, token embedding table [vocabulary, D], every encoder
    variable by name) of a converted teacher."""
    pieces = teacher_pieces(teacher_dir)
    variables = read_saved_model_variables(os.path.join(teacher_dir, "encoder"))
    tables = [v for name, v in variables.items() if name.endswith("token_embedding/embeddings")]
    if len(tables) != 1:
        raise ValueError(f"{teacher_dir}/encoder: expected one token embedding table, found "
                         f"{len(tables)}")
    return pieces, np.asarray(tables[0], np.float32), variables


def pca(table: np.ndarray, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean [D], components [D, dimension]) of the rows of `table`."""
    if dimension > table.shape[1]:
        raise ValueError(f"cannot project {table.shape[1]}-d teacher embeddings up to "
                         f"{dimension} dimensions by PCA")
    mean = table.mean(axis=0)
    centred = table - mean
    _, _, vt = np.linalg.svd(centred.astype(np.float64), full_matrices=False)
    return mean.astype(np.float32), vt[:dimension].T.astype(np.float32)


def initialize_token_embeddings(encoder, tokenizer, teacher_dir: str, mode: str) -> dict:
    """Sets `encoder`'s token embeddings (with "teacher_select", its layers too) from
    the teacher's (see the module docstring).

    Returns a summary: rows matched; for the PCA modes the fraction of the
    teacher's variance the projection keeps, for "teacher_select" the kept
    hidden coordinates and each student layer's teacher layer.
    """
    pieces, table, variables = teacher_vocabulary_and_table(teacher_dir)
    rows = match_rows(student_pieces(tokenizer), pieces)
    matched = rows >= 0
    if not matched.any():
        raise ValueError(f"no token of the student's vocabulary is in {teacher_dir}'s "
                         "vocabulary; --embedding_init needs a shared vocabulary")
    if mode == "teacher_select":
        return select_teacher_weights(encoder, rows, teacher_dir, variables)
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


def _teacher_layer_count(variables: dict[str, np.ndarray]) -> int:
    layers = {name.split("/")[0] for name in variables if name.startswith("transformer_layer_")}
    return len(layers)


def pass_through_layers(student_layers: int, teacher_dir: str) -> frozenset:
    """The student layers "teacher_select" starts as pass-through layers
    (`layer_sources` gives them no teacher layer) from the converted teacher
    in `teacher_dir`. The layer count comes from the directory's teacher.json
    when it has one: reading the encoder's variables would load the whole
    teacher for one number."""
    summary = read_teacher_summary(teacher_dir) or {}
    teacher_layers = summary.get("num_layers")
    if teacher_layers is None:
        variables = read_saved_model_variables(os.path.join(teacher_dir, "encoder"))
        teacher_layers = _teacher_layer_count(variables)
    sources = layer_sources(student_layers, int(teacher_layers))
    return frozenset(j for j, source in enumerate(sources) if source is None)


def pass_through_norm(gamma: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The layer norm weights under which a layer with zero output projections
    hands its input on, as nearly as a layer norm can.

    Its input is the output of a layer norm (`gamma`, `beta`): y = gamma z + beta,
    z standardised over the hidden axis. A post-LN layer with zero output
    projections computes LN(y): with the default weights (1, 0) that is y
    re-standardised, which drops the teacher's per-coordinate scales and
    offsets (BERT's outlier dimensions among them). Over coordinates, y has mean
    about mean(beta) and variance about mean(gamma^2) + var(beta) for a
    standardised z, so weights of those constants (std, mean) make LN(y) = y
    wherever a token's own mean and spread are the typical ones.
    """
    mean = float(np.mean(beta))
    std = float(np.sqrt(np.mean(np.square(gamma)) + np.var(beta)))
    return (np.full(gamma.shape, std, np.float32), np.full(beta.shape, mean, np.float32))


def _axis_roles(key: str) -> str:
    """What each axis of a `TransformerEncoder` weight indexes (see `select`)."""
    if key.startswith("self_attention_layer/attention_output/"):
        return "nkh" if key.endswith("kernel") else "h"
    if key.startswith("self_attention_layer/"):  # query, key, value
        return "hnk" if key.endswith("kernel") else "nk"
    if key.startswith("feedforward_intermediate_dense/"):
        return "hf" if key.endswith("kernel") else "f"
    if key.startswith("feedforward_output_dense/"):
        return "fh" if key.endswith("kernel") else "h"
    return "h"  # the layer norms


def select_teacher_weights(encoder, rows: np.ndarray, teacher_dir: str,
                           variables: dict[str, np.ndarray] | None = None) -> dict:
    """"teacher_select" (see the module docstring); `rows`: `match_rows`'s output;
    `variables`: the teacher encoder's, when the caller has read them already."""
    if encoder.embedding_projection is not None or encoder.num_unique_layers:
        raise ValueError("teacher_select needs an encoder without embedding bottleneck or "
                         "parameter recurrence")
    if variables is None:
        variables = read_saved_model_variables(os.path.join(teacher_dir, "encoder"))
    query = variables["transformer_layer_0/self_attention_layer/query/kernel"]
    teacher_width, teacher_heads, teacher_head_dim = query.shape
    teacher_ff = variables["transformer_layer_0/feedforward_intermediate_dense/kernel"].shape[1]
    width, heads = encoder.hidden_dim, encoder.num_heads
    head_dim, ff = width // heads, encoder.intermediate_dim
    for what, student, teacher in (("hidden width", width, teacher_width),
                                   ("heads", heads, teacher_heads),
                                   ("head width", head_dim, teacher_head_dim),
                                   ("feed-forward width", ff, teacher_ff)):
        if student > teacher:
            raise ValueError(f"teacher_select: the student's {what} {student} exceeds the "
                             f"teacher's {teacher}")
    matched = rows >= 0
    hidden = selected_coordinates(teacher_dir, rows, width)
    head_dims = np.linspace(0, teacher_head_dim - 1, head_dim).round().astype(np.int64)
    # Q.K sums over head_dim of the teacher's dimensions; scaling the query keeps
    # the attention logits at the teacher's scale.
    query_scale = np.sqrt(teacher_head_dim / head_dim)

    def select(value, roles, ff_units=None):
        """`value` at the kept indices; `roles` names each axis: h(idden), n (heads),
        k (head dimensions), f(eed-forward units)."""
        kept = {"h": hidden, "n": np.arange(heads), "k": head_dims, "f": ff_units}
        for axis, role in enumerate(roles):
            value = np.take(value, kept[role], axis=axis)
        return value

    table = variables["token_embedding/embeddings"]
    values = np.array(encoder.token_embedding.embeddings.numpy())
    values[matched] = table[rows[matched]][:, hidden]
    encoder.token_embedding.embeddings.assign(values)
    positions = variables["position_embedding/embeddings"]
    student_positions = encoder.position_embedding.weights[0]
    if student_positions.shape[0] > positions.shape[0]:
        raise ValueError(f"teacher_select: the student's {student_positions.shape[0]} "
                         f"positions exceed the teacher's {positions.shape[0]}")
    student_positions.assign(positions[:student_positions.shape[0]][:, hidden])
    # Every segment starts as the teacher's first (single-sentence inputs).
    segments = variables["segment_embedding/embeddings"][0][hidden]
    encoder.segment_embedding.embeddings.assign(
        np.tile(segments, (encoder.segment_embedding.embeddings.shape[0], 1)))
    for weight in encoder.embeddings_layer_norm.weights:
        weight.assign(select(variables[f"embeddings_layer_norm/{weight.path.split('/')[-1]}"],
                             "h"))
    sources = layer_sources(len(encoder.transformer_layers),
                            _teacher_layer_count(variables))
    # The layer norm whose output a pass-through layer receives: the embeddings'
    # or the last placed layer's (a pass-through layer hands its input on).
    previous_norm = [w.numpy() for w in encoder.embeddings_layer_norm.weights]
    for layer, source in zip(encoder.transformer_layers, sources):
        if source is None:
            gamma, beta = pass_through_norm(*previous_norm)
            for weight in layer.weights:
                key = weight.path.split("/", 1)[1]
                if key.startswith(("self_attention_layer/attention_output/",
                                   "feedforward_output_dense/")):
                    weight.assign(np.zeros(weight.shape, np.float32))
                elif "layer_norm/" in key:
                    weight.assign(gamma if key.endswith("gamma") else beta)
            continue
        prefix = f"transformer_layer_{source}/"
        into = variables[prefix + "feedforward_intermediate_dense/kernel"][hidden]
        out = variables[prefix + "feedforward_output_dense/kernel"][:, hidden]
        importance = np.linalg.norm(into, axis=0) * np.linalg.norm(out, axis=1)
        units = np.sort(np.argsort(-importance, kind="stable")[:ff])
        for weight in layer.weights:
            key = weight.path.split("/", 1)[1]
            value = select(variables[prefix + key], _axis_roles(key), units)
            if key.startswith("self_attention_layer/query/"):
                value = value * query_scale
            weight.assign(value.astype(np.float32))
        previous_norm = [w.numpy() for w in sorted(
            (w for w in layer.weights if "/feedforward_layer_norm/" in w.path),
            key=lambda w: not w.path.endswith("gamma"))]
    return {"mode": "teacher_select", "source": teacher_dir, "rows": int(len(rows)),
            "rows_matched": int(matched.sum()), "matched_fraction": float(matched.mean()),
            "hidden_coordinates": [int(i) for i in hidden],
            "layer_sources": sources}
