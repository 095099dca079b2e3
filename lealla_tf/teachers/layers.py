"""The frozen teacher run on the student's own tokens: `TeacherLayers`.

The hd term distils its layer outputs, at the coordinates and layers weight
selection gave the student (`lealla_tf.teachers.selection`), and the in-step
teacher (`lealla_tf.teachers.sources.InStepTeacher`) takes its vectors from the
same pass, so one teacher pass a side serves both. A converted teacher that
records its architecture runs as a `LeallaEncoder` rebuilt in this process
(`teacher_network`); an older one runs its SavedModel.
"""

import os

import keras
import numpy as np
import sentencepiece
import tensorflow as tf

from lealla_tf.configs import EncoderConfig, config_from_dict
from lealla_tf.inference.formats import encoder_from_module
from lealla_tf.inference.loaders import load_embedder
from lealla_tf.models import kernels
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE, read_teacher_summary
from lealla_tf.teachers.selection import (
    distilled_layer_pairs,
    match_rows,
    selected_coordinates,
    teacher_pieces,
)


def teacher_prefix(teacher_dir: str) -> str:
    """The text a converted teacher's module puts before every sentence (its
    teacher.json's `prefix`; "" without a summary)."""
    return str((read_teacher_summary(teacher_dir) or {}).get("prefix") or "")


def prefix_pieces(teacher_dir: str, prefix: str) -> list:
    """The teacher's ids of `prefix`'s pieces, checked to tokenize apart from
    what follows (a prefix ending in a space does under SentencePiece), so that
    start + these + the sentence's pieces is what the module's tokenizer gives."""
    if not prefix:
        return []
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(teacher_dir, SENTENCEPIECE_FILE))
    ids = list(processor.encode(prefix))
    for probe in ("a", "Ab, c.", "  x"):
        if list(processor.encode(prefix + probe)) != ids + list(processor.encode(probe)):
            raise ValueError(
                f"{teacher_dir}'s prefix {prefix!r} does not tokenize apart from the sentence "
                f"after it ({probe!r}), so the in-step teacher (the hd term, "
                "--teacher_in_step) cannot put it before the student's tokens; convert the "
                "teacher with a prefix that ends in a space")
    return ids


def drop_positions(sequence, extra: int):
    """`[b, 1 + extra + s, d]` -> `[b, 1 + s, d]`: the prefix's positions left out."""
    return tf.concat([sequence[:, :1], sequence[:, 1 + extra:]], axis=1)


class TeacherLayers:
    """The frozen teacher's layer outputs on the student's own tokens, for
    hidden-state distillation (the `hd` term).

    The student's token ids map to the teacher's by piece (the student's pruned
    teacher vocabulary); the teacher keeps the coordinates and layers that
    `--embedding_init=teacher_select` gives the student
    (`lealla_tf.teachers.selection.selected_coordinates`, `distilled_layer_pairs`),
    so the same teacher directory and vocabulary give the same targets on a
    resumed run. A plain object, not a `tf.Module`: the teacher's weights stay
    out of the student's checkpoints.

    A teacher whose teacher.json records its architecture (every conversion since
    it does) runs as a `LeallaEncoder` rebuilt in this process
    (`teacher_network`): in the training's compute dtype, so bfloat16 under
    `--mixed_precision` (faster than the SavedModel in float32: docs/design.md,
    "The in-step teacher"), with `lealla_tf.models.kernels`' fused layers;
    otherwise its SavedModel runs.

    Args:
        teacher_dir: a converted teacher (export/convert_teacher.py) with a
            SentencePiece vocabulary.
        student_pieces: the student's vocabulary, in id order.
        hidden_dim, num_layers: the student's width and depth.
        max_seq_length: the longest sequence the student trains on; the teacher
            must have positions for it (and for the prefix).
        prefix: text to put before every sentence as the teacher module does
            (e5's "query: ", `teacher_prefix(teacher_dir)`): its pieces go in
            after the student's start token, where the module's tokenizer puts
            them, and their positions are left out of the hd targets. Default:
            none. On the student's pruned-vocabulary pieces the prefix makes the
            teacher's own retrieval worse, not better (docs/design.md, "The
            in-step teacher").
    """

    def __init__(self, teacher_dir: str, student_pieces, hidden_dim: int, num_layers: int,
                 max_seq_length: int, prefix: str = ""):
        pieces = teacher_pieces(teacher_dir)
        rows = match_rows(list(student_pieces), pieces)
        if not (rows >= 0).any():
            raise ValueError(f"hidden-state distillation: no token of the student's vocabulary "
                             f"is in {teacher_dir}'s; it needs the teacher's (pruned) vocabulary")
        if "<unk>" not in pieces:
            raise ValueError(f"hidden-state distillation: {teacher_dir}'s vocabulary has no "
                             "<unk> piece for the student's pieces it lacks")
        unknown = pieces.index("<unk>")
        self.network = teacher_network(teacher_dir)
        if self.network is not None:
            self.encoder = self._run_network
            self.fused_kernels = kernels.usable()
            positions = self.network.max_sequence_length
        else:
            self.encoder = tf.saved_model.load(os.path.join(teacher_dir, "encoder"))
            tables = [v for v in getattr(self.encoder, "variables", ())
                      if v.name.split(":")[0].endswith("position_embedding/embeddings")]
            if len(tables) != 1:
                raise ValueError(f"hidden-state distillation: {teacher_dir}/encoder has "
                                 f"{len(tables)} position tables, expected one")
            positions = int(tables[0].shape[0])
        self.prefix = str(prefix or "")
        self.prefix_ids = tf.constant(prefix_pieces(teacher_dir, self.prefix), tf.int32)
        extra = int(self.prefix_ids.shape[0])
        if max_seq_length + extra > positions:
            plus = f" plus the {extra} pieces of the prefix {self.prefix!r}" if extra else ""
            raise ValueError(f"hidden-state distillation: --max_seq_length={max_seq_length}"
                             f"{plus} exceeds the {positions} positions of {teacher_dir}'s "
                             "teacher")
        probed = self.encoder({"input_word_ids": tf.constant([[0, 2]], tf.int32),
                               "input_mask": tf.ones([1, 2], tf.int32),
                               "input_type_ids": tf.zeros([1, 2], tf.int32)})
        probe = probed["encoder_outputs"]
        teacher_width = int(probe[0].shape[-1])
        self.vector_width = int(probed["default"].shape[-1])  # InStepTeacher's vectors
        if hidden_dim > teacher_width:
            raise ValueError(f"hidden-state distillation: the student's width {hidden_dim} "
                             f"exceeds the teacher's {teacher_width}")
        self.ids = tf.constant(np.where(rows >= 0, rows, unknown).astype(np.int32))
        self.coordinates = tf.constant(
            selected_coordinates(teacher_dir, rows, hidden_dim, self.encoder).astype(np.int32))
        self.pairs = distilled_layer_pairs(num_layers, len(probe))
        self.matched_fraction = float((rows >= 0).mean())
        self._graph, self._memory = None, []

    def _run_network(self, inputs) -> dict:
        """The teacher module's outputs (float32), computed by the rebuilt network
        in the training's compute dtype, with the fused kernels where usable; one
        part (a step runs both sides side by side already)."""
        outputs = self.network.forward(inputs, parts=1, fused_kernels=self.fused_kernels)

        def float32(x):
            return tf.cast(x, tf.float32)

        return {"default": float32(outputs["pooled_output"]),
                "pooled_output": float32(outputs["pooled_output"]),
                "sequence_output": float32(outputs["sequence_output"]),
                "encoder_outputs": [float32(o) for o in outputs["encoder_outputs"]]}

    # Eager runs keep this many passes (a step's two sides); a traced step keeps
    # every pass of its graph (each replica's), dropped when another graph traces.
    MEMORY = 2

    def outputs(self, inputs) -> dict:
        """The teacher encoder's outputs on the student's tokens `inputs`
        (`encoder_outputs`, `default`, ...), all coordinates; one pass per token
        tensor, however many terms ask (the hd term and
        `lealla_tf.teachers.sources.InStepTeacher` in one step)."""
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        if graph is not self._graph:
            self._graph, self._memory = graph, []
        key = inputs["input_word_ids"].ref()
        for known, outputs in self._memory:
            if known == key:
                return outputs
        ids = tf.gather(self.ids, tf.cast(inputs["input_word_ids"], tf.int32))
        mask = tf.cast(inputs["input_mask"], tf.int32)
        extra = int(self.prefix_ids.shape[0])
        if extra:  # [start] prefix pieces [the sentence's pieces] ...
            rows = tf.shape(ids)[0]
            ids = tf.concat([ids[:, :1], tf.tile(self.prefix_ids[None], [rows, 1]), ids[:, 1:]],
                            axis=1)
            mask = tf.concat([mask[:, :1], tf.tile(mask[:, :1], [1, extra]), mask[:, 1:]],
                             axis=1)
        outputs = tf.nest.map_structure(tf.stop_gradient, self.encoder(
            {"input_word_ids": ids, "input_mask": mask, "input_type_ids": tf.zeros_like(ids)}))
        if extra:  # per-token outputs back on the student's positions
            outputs = {name: ([drop_positions(o, extra) for o in value]
                              if name == "encoder_outputs"
                              else drop_positions(value, extra) if value.shape.rank == 3
                              else value)
                       for name, value in outputs.items()}
        self._memory.append((key, outputs))
        if graph is None:
            self._memory = self._memory[-self.MEMORY:]
        return outputs

    def __call__(self, inputs) -> list:
        """The teacher's outputs `[b, s, d]` at the kept coordinates, one per pair."""
        outputs = self.outputs(inputs)["encoder_outputs"]
        return [tf.gather(outputs[t], self.coordinates, axis=-1) for _, t in self.pairs]

    def student_states(self, encoder_outputs) -> list:
        """The student's layer outputs that correspond, one per pair."""
        return [encoder_outputs[s] for s, _ in self.pairs]


def teacher_network(teacher_dir: str):
    """The converted teacher's network as a `LeallaEncoder` in the current compute
    dtype (bfloat16 under `--mixed_precision`), from the architecture its
    teacher.json records; None for a teacher converted before it recorded one
    (its SavedModel serves then, in float32 and without the fused kernels)."""
    architecture = (read_teacher_summary(teacher_dir) or {}).get("encoder_config")
    if not architecture:
        return None
    network = encoder_from_module(os.path.join(teacher_dir, "encoder"),
                                  config_from_dict(EncoderConfig, architecture),
                                  dtype=keras.mixed_precision.dtype_policy().name)
    network.trainable = False  # frozen: no gradient tape watches its weights
    return network


def teacher_embedder(teacher_dir: str, bfloat16: bool):
    """The converted teacher as an `Embedder` (its own tokenizer, "query: "
    prefix and truncation): with `bfloat16`, its network rebuilt in bfloat16
    with the fused kernels (`teacher_network`'s pass, the in-step teacher's),
    which a CPU that multiplies bfloat16 natively runs much faster than the
    float32 module, at vectors within rounding of the module's
    (benchmarks/teacher_fidelity.py); otherwise, or for a teacher converted
    before it recorded its architecture, the module itself."""
    architecture = (read_teacher_summary(teacher_dir) or {}).get("encoder_config")
    if not (bfloat16 and architecture):
        return load_embedder(teacher_dir)
    network = encoder_from_module(os.path.join(teacher_dir, "encoder"),
                                  config_from_dict(EncoderConfig, architecture),
                                  dtype="mixed_bfloat16")
    network.trainable = False
    fused = kernels.usable()

    def default(inputs):
        pooled = network.forward(inputs, parts=1, fused_kernels=fused)["pooled_output"]
        return tf.cast(pooled, tf.float32)

    return load_embedder(teacher_dir, encoder=default,
                         encoder_description="its network rebuilt in bfloat16")
