"""The export formats (`--format` of `lealla-export`) and the functions that write
them. The docstrings are the contracts.

Three SavedModel formats, all loadable with only `import tensorflow_text`
beforehand and no network, and a TFLite one:

`export_lealla_model` -> a drop-in for tfhub.dev/google/LEALLA/LEALLA-*/1:
    model = hub.KerasLayer(path)            # tf-keras
    model = keras.layers.TFSMLayer(path, call_endpoint="serving_default")
    model = tf.saved_model.load(path)
    model(tf.constant(["dog", "Puppies are nice."]))  # float32 [batch, d], unit rows
  - `--precision=bfloat16` computes in bfloat16 (same contract, float32 rows);
    `assets.extra/lealla_export.json` states the precision and architecture
    (`lealla_tf.inference.export_info`).
  - root `__call__(strings, training=False)` returns a plain tensor;
    signatures `serving_default` and `serve` map `inputs` (string [batch]) to
    `{"default": float32 [batch, d]}`.
  - root `variables`, `trainable_variables`, `regularization_losses`;
    `vocab_file` is an asset; dropout only with `training=True`.
  - inputs longer than `max_seq_length` (default 128) tokens are truncated;
    empty strings and invalid UTF-8 give finite embeddings.
  - also, outside the signatures, the two halves apart: `preprocess(strings)`
    -> `{input_word_ids, input_mask, input_type_ids}` int32 `[batch, longest]`
    and `embed_inputs(that dict)` -> the same embeddings, so a caller can
    tokenize a corpus once and batch it by token length
    (`lealla_tf.inference.loaders.load_embedder` does).

`export_labse_pair` -> the LaBSE/2 interface, two SavedModels:
  - `<path>/preprocessor`: strings -> `{input_word_ids, input_mask,
    input_type_ids}` int32 `[batch, seq_length]` (default 128); sub-objects
    `.tokenize` (strings -> int32 RaggedTensor `[batch, (tokens), (1)]`; word
    boundaries are not kept, each token is its own "word") and
    `.bert_pack_inputs(segments, seq_length=<default>)` (1 or 2 segments;
    seq_length may be given as a scalar int32 tensor).
  - `<path>/encoder`: that dict -> `{default, pooled_output, sequence_output,
    encoder_outputs}`; `default` is `pooled_output`, not normalised;
    `vocab_file` asset and `do_lower_case` attribute.

`export_encoder_only` -> ids in, embeddings out, no text ops (TFLite / ONNX):
    `serving_default(input_word_ids, input_mask, input_type_ids)` int32
    `[batch, seq]` -> `{"default": float32 [batch, d]}` (unit rows), computed by
    the fast forward pass in one part; `__call__(..., training=True)` applies
    dropout with its masks (`lealla_tf.models.layers.hash_dropout`), as the
    LEALLA format does.

`export_int8_tflite` -> the encoder-only model (its fast forward pass, one
part) converted to TFLite with dynamic-range int8 weights (weights stored as
int8, activations float between ops, quantized per call by the interpreter's
XNNPACK delegate for its int8 matmuls), in a
directory: `model.tflite` (inputs `input_word_ids`, `input_mask`,
`input_type_ids` int32 `[batch, seq]`, any batch and length; output float32
`[batch, d]` unit rows), the vocabulary, and `tflite_model.json` (how to
tokenize). `lealla_tf.inference.loaders.load_embedder(directory)` runs it on strings.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from lealla_tf.configs import config_to_dict
from lealla_tf.inference.collapse import collapse_warning, mean_cosine
from lealla_tf.inference.export_info import (
    JIT_ROWS_MULTIPLE,
    check_precision,
    slow_precision_warning,
    write_export_info,
)
from lealla_tf.models.checkpoint_conversion import read_saved_model_variables
from lealla_tf.models.encoder import build_encoder
from lealla_tf.models.model_dir import load_encoder, load_tokenizer
from lealla_tf.tokenizers.tensorflow_adapter import export_root

INPUT_NAMES = ("input_word_ids", "input_mask", "input_type_ids")


def _attach_variables(root, encoder, extra_trainable=()):
    """Lists the encoder's tf.Variables on the export root.

    Keras-3 variables wrap a tf.Variable (`.value`); listing those (and not the
    Keras model itself) keeps a single copy of each weight in the SavedModel.
    Dropout's seed-generator state is not among `model.weights` but a
    `training=True` trace captures it, so it must be reachable too.
    """
    seeds = [v.value for v in encoder.variables if "seed_generator" in v.path]
    weights = [v.value for v in encoder.variables if "seed_generator" not in v.path]
    root.variables = weights + list(extra_trainable)
    root.trainable_variables = [v.value for v in encoder.trainable_variables] + list(
        extra_trainable)
    root.regularization_losses = []
    root.dropout_seed_state = seeds


def _ids_spec():
    return {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES}


# A compiled encoder sees ids padded to a multiple of JIT_LENGTH_MULTIPLE and
# batches padded to a multiple of export_info's JIT_ROWS_MULTIPLE rows: XLA compiles one program
# per (batch size, padded length), and batches cut by a token budget vary in both.
# `load_embedder` cuts each batch that can hold that many rows to a whole multiple
# of them (the record's `jit_rows_multiple`), so at the default token cap only a
# call's last batch carries padding rows; lengths step by 2, which pads a short
# sentence's batch little, at more programs to compile (docs/benchmarks.md, the
# XLA export's padding).
JIT_LENGTH_MULTIPLE = 2


def pad_to_multiple(inputs, multiple: int, pad_id: int, limit: int = None):
    """Pads BERT inputs on the right to a length that is a multiple of `multiple`,
    at most `limit` (the position table's size); masked positions, so the
    embeddings do not change."""
    length = tf.shape(inputs["input_word_ids"])[1]
    target = (length + multiple - 1) // multiple * multiple
    if limit is not None:
        target = tf.maximum(tf.minimum(target, limit), length)
    return _pad_inputs(inputs, [[0, 0], [0, target - length]], pad_id)


def pad_rows_to_multiple(inputs, multiple: int, pad_id: int):
    """Adds all-padding rows to BERT inputs up to a multiple of `multiple` rows
    (their embeddings are to be dropped: `[:rows]`)."""
    rows = tf.shape(inputs["input_word_ids"])[0]
    return _pad_inputs(inputs, [[0, (rows + multiple - 1) // multiple * multiple - rows],
                                [0, 0]], pad_id)


def _pad_inputs(inputs, paddings, pad_id: int):
    """BERT inputs padded by `paddings`: ids with `pad_id`, mask and types with 0."""
    return {name: tf.pad(value, paddings,
                         constant_values=pad_id if name == "input_word_ids" else 0)
            for name, value in inputs.items()}


def export_lealla_model(encoder, tokenizer, export_path: str, jit_compile: bool = False,
                        precision: str = "float32") -> str:
    """Exports raw strings -> L2-normalised embeddings (see the module contract).

    `jit_compile`: inference (`training=False`) runs the encoder, after the
    in-graph tokenizer, as an XLA-compiled function on ids padded to a multiple
    of `JIT_LENGTH_MULTIPLE` and `JIT_ROWS_MULTIPLE` rows (same outputs;
    benchmarks/embedding_speed.py measures it as the model `student_xla`).

    `precision`: "bfloat16" computes the encoder in bfloat16 (weights kept in
    float32, the output float32 unit rows normalised in float32); a CPU with
    bfloat16 arithmetic runs it faster, at vectors within rounding of the
    float32 export's. Either way `assets.extra/lealla_export.json`
    (`lealla_tf.inference.export_info`) records the precision and the
    architecture.
    """
    check_precision(precision)
    if jit_compile and precision != "float32":
        raise ValueError("--jit_compile exports compute in float32; drop --jit_compile or "
                         "--precision=bfloat16")
    encoder = in_precision(encoder, precision)
    root = export_root()
    root.tokenizer = tokenizer
    root.vocab_file = tokenizer.vocab_file
    _attach_variables(root, encoder)
    compiled = tf.function(
        # the inference parts, as uncompiled: XLA's runtime runs the independent
        # halves side by side too (docs/benchmarks.md, the exports' speed)
        lambda inputs: encoder.forward(inputs)["sentence_embedding"], jit_compile=True)

    def embed_inputs(inputs, training=False):
        if jit_compile and not training:
            rows = tf.shape(inputs["input_word_ids"])[0]
            padded = pad_to_multiple(inputs, JIT_LENGTH_MULTIPLE, tokenizer.pad_id,
                                     encoder.encoder_config.max_sequence_length)
            return compiled(pad_rows_to_multiple(padded, JIT_ROWS_MULTIPLE,
                                                 tokenizer.pad_id))[:rows]
        outputs = encoder.forward(inputs, training=training)
        if precision == "float32":
            return outputs["sentence_embedding"]
        return tf.math.l2_normalize(tf.cast(unnormalised(encoder, outputs), tf.float32), axis=-1)

    strings = tf.TensorSpec([None], tf.string, name="inputs")
    root.preprocess = tf.function(lambda inputs: tokenizer(inputs), input_signature=[strings])
    root.embed_inputs = tf.function(lambda inputs: embed_inputs(inputs),
                                    input_signature=[_ids_spec()])

    def embed(strings, training=False):
        # Inference calls `embed_inputs`' one graph instead of tracing the network
        # again: the SavedModel stores (and every load rebuilds) each graph once.
        if training:
            return embed_inputs(tokenizer(strings), training=True)
        return root.embed_inputs(root.preprocess(strings))

    root.__call__ = tf.function(embed)
    root.__call__.get_concrete_function(strings, training=False)
    root.__call__.get_concrete_function(strings, training=True)
    serve = tf.function(lambda inputs: {"default": root.__call__(inputs)},
                        input_signature=[strings])
    root.serve = serve
    tf.saved_model.save(root, export_path,
                        signatures={"serving_default": serve, "serve": serve})
    write_export_info(export_path, precision, config_to_dict(encoder.encoder_config),
                      JIT_ROWS_MULTIPLE if jit_compile else 0)
    return export_path


def in_precision(encoder, precision: str):
    """`encoder` itself where it computes in `precision`, else a twin built in it
    holding the same weights (float32 variables either way)."""
    policy = {"float32": "float32", "bfloat16": "mixed_bfloat16"}[precision]
    if encoder.token_embedding.compute_dtype == precision:
        return encoder
    twin = build_encoder(encoder.encoder_config, dtype=policy, name=encoder.name)
    twin.set_weights(encoder.get_weights())
    return twin


def unnormalised(encoder, outputs: dict):
    """The sentence embedding before its L2 normalisation, from `encoder`'s
    `outputs`: the pooled output, through the output projection where there is one."""
    pooled = outputs["pooled_output"]
    return pooled if encoder.output_dense is None else encoder.output_dense(pooled)


def _bert_pack_inputs(tokenizer, default_seq_length):
    module = export_root()

    def pack(segments, seq_length=default_seq_length):
        return tokenizer.pack(list(segments), seq_length=seq_length)

    module.__call__ = tf.function(pack)
    for ragged_rank in (1, 2):
        spec = tf.RaggedTensorSpec([None] + [None] * ragged_rank, tf.int32, ragged_rank)
        for count in (1, 2):
            module.__call__.get_concrete_function([spec] * count)
            module.__call__.get_concrete_function(
                [spec] * count, seq_length=tf.TensorSpec([], tf.int32))
    return module


def export_labse_pair(encoder, tokenizer, export_path: str, seq_length: int = None) -> dict:
    """Exports the LaBSE/2 preprocessor + encoder pair (see the module contract).

    `seq_length` (the preprocessor's fixed output length) defaults to the
    tokenizer's `max_seq_length`, so the pair truncates as the model was trained.
    Returns {"preprocessor": path, "encoder": path}.
    """
    seq_length = seq_length or tokenizer.max_seq_length
    paths = {"preprocessor": os.path.join(export_path, "preprocessor"),
             "encoder": os.path.join(export_path, "encoder")}
    strings = tf.TensorSpec([None], tf.string, name="inputs")

    preprocessor = export_root()
    preprocessor.tokenizer = tokenizer
    preprocessor.vocab_file = tokenizer.vocab_file
    preprocess = tf.function(lambda inputs: tokenizer(inputs, seq_length=seq_length),
                             input_signature=[strings])
    preprocessor.__call__ = preprocess
    tokenize = export_root()

    def tokens_as_words(inputs):
        tokens = tokenizer.tokenize(inputs)
        pieces = tf.RaggedTensor.from_row_lengths(
            tokens.flat_values, tf.ones_like(tokens.flat_values, dtype=tf.int64))
        return tf.RaggedTensor.from_row_lengths(pieces, tokens.row_lengths())

    tokenize.__call__ = tf.function(tokens_as_words, input_signature=[strings])
    preprocessor.tokenize = tokenize
    preprocessor.bert_pack_inputs = _bert_pack_inputs(tokenizer, seq_length)
    tf.saved_model.save(preprocessor, paths["preprocessor"],
                        signatures={"serving_default": preprocess})

    module = export_root()
    module.vocab_file = tokenizer.vocab_file
    module.do_lower_case = tf.Variable(tokenizer.lower_case, trainable=False, name="do_lower_case")
    _attach_variables(module, encoder)

    def encode(inputs, training=False):
        inputs = {name: inputs[name] for name in INPUT_NAMES}
        outputs = encoder.forward(inputs, training=training)
        return {"default": outputs["pooled_output"],
                "pooled_output": outputs["pooled_output"],
                "sequence_output": outputs["sequence_output"],
                "encoder_outputs": list(outputs["encoder_outputs"])}

    module.__call__ = tf.function(encode)
    module.__call__.get_concrete_function(_ids_spec(), training=False)
    module.__call__.get_concrete_function(_ids_spec(), training=True)
    serve = tf.function(
        lambda inputs: {k: v for k, v in encode(inputs).items() if k != "encoder_outputs"},
        input_signature=[_ids_spec()])
    tf.saved_model.save(module, paths["encoder"], signatures={"serving_default": serve})
    return paths


def encoder_from_module(encoder_dir: str, config, dtype=None, name: str = "teacher_encoder"):
    """The `LeallaEncoder` of `config` holding the weights of an `encoder/` module
    that `export_labse_pair` wrote (its variables keep the encoder's weight
    paths), to run that network in-process, e.g. in another dtype or with
    `lealla_tf.models.kernels`. ValueError naming a weight the module lacks or holds in
    another shape."""
    tensors = read_saved_model_variables(encoder_dir)
    # the paths below the model's own name: the module may have been exported from
    # an encoder of another name than `name`
    inner = {}
    for path, value in tensors.items():
        inner.setdefault(path.split("/", 1)[-1], value)
    encoder = build_encoder(config, dtype=dtype, name=name)
    for weight in encoder.weights:
        value = tensors.get(weight.path)
        if value is None:
            value = inner.get(weight.path.split("/", 1)[-1])
        if value is None or tuple(np.shape(value)) != tuple(weight.shape):
            found = "missing" if value is None else f"of shape {tuple(np.shape(value))}"
            raise ValueError(f"{encoder_dir}: the weight {weight.path} {tuple(weight.shape)} "
                             f"of its encoder config is {found} there")
        weight.assign(value)
    return encoder


def export_encoder_only(encoder, export_path: str, parts: int = 1) -> str:
    """Exports int32 ids -> L2-normalised embeddings, with no text ops, computed
    by the encoder's fast forward pass (`parts`: see `LeallaEncoder.forward`; one
    by default, for converters whose runtimes run one op at a time)."""
    root = export_root()
    _attach_variables(root, encoder)

    def embed(input_word_ids, input_mask, input_type_ids, training=False):
        inputs = {"input_word_ids": input_word_ids, "input_mask": input_mask,
                  "input_type_ids": input_type_ids}
        return encoder.forward(inputs, training=training, parts=parts)["sentence_embedding"]

    specs = [tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES]
    root.__call__ = tf.function(embed)
    root.__call__.get_concrete_function(*specs, training=False)
    root.__call__.get_concrete_function(*specs, training=True)
    serve = tf.function(lambda input_word_ids, input_mask, input_type_ids: {
        "default": embed(input_word_ids, input_mask, input_type_ids)}, input_signature=specs)
    tf.saved_model.save(root, export_path, signatures={"serving_default": serve})
    return export_path


TFLITE_FILE = "model.tflite"
TFLITE_INFO = "tflite_model.json"


def export_int8_tflite(encoder, tokenizer, export_path: str) -> str:
    """Exports the encoder as a TFLite model with int8 weights (see the module contract)."""
    os.makedirs(export_path, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="encoder_only_") as saved_model:
        export_encoder_only(encoder, saved_model)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]  # dynamic-range int8 weights
        flatbuffer = converter.convert()
    with open(os.path.join(export_path, TFLITE_FILE), "wb") as f:
        f.write(flatbuffer)
    vocab_file = tokenizer.vocab_file.asset_path.numpy().decode()
    vocab_name = os.path.basename(vocab_file)
    if vocab_name in (TFLITE_FILE, TFLITE_INFO):
        raise ValueError(f"the vocabulary may not be named {vocab_name}")
    destination = os.path.join(export_path, vocab_name)
    if not (os.path.exists(destination) and os.path.samefile(vocab_file, destination)):
        shutil.copyfile(vocab_file, destination)
    info = {"format": "int8_tflite", "vocab_file": vocab_name,
            "max_seq_length": tokenizer.max_seq_length, "lower_case": tokenizer.lower_case,
            "special_tokens": list(tokenizer.special_tokens), "prefix": tokenizer.prefix,
            "unknown_per_character": tokenizer.unknown_per_character,
            "embedding_dim": int(encoder.encoder_config.embedding_size)}
    with open(os.path.join(export_path, TFLITE_INFO), "w") as f:
        json.dump(info, f, indent=2)
    return export_path


def saved_model_size(path: str) -> int:
    """Bytes on disk of a SavedModel directory (all files)."""
    total = 0
    for root, _, names in tf.io.gfile.walk(path):
        for name in names:
            total += tf.io.gfile.stat(os.path.join(root, name)).length
    return total


FORMATS = ("lealla", "labse", "encoder_only", "int8_tflite")


def export_model_dir(model_dir: str, export_path: str, export_format: str = "lealla",
                     checkpoint: str = None, seq_length: int = None, encoder=None,
                     tokenizer=None, jit_compile: bool = False,
                     precision: str = "float32") -> dict:
    """Exports a trained model directory in one of `FORMATS`.

    Everything (architecture, vocabulary, casing, max length) is read from
    `model_dir`; a caller that already holds the restored `encoder` and
    `tokenizer` passes them, and they are not built a second time.
    `jit_compile` (lealla format): the encoder runs XLA-compiled; `precision`
    (lealla format): the dtype it computes in (`export_lealla_model`). Returns a
    summary: paths, embedding size, parameters, bytes on disk, precision.
    """
    if export_format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {export_format!r}")
    check_precision(precision)
    if precision != "float32" and export_format != "lealla":
        raise ValueError(f"--precision={precision} applies to --format=lealla, not "
                         f"{export_format}")
    if os.path.exists(export_path) and not os.path.isdir(export_path):
        raise ValueError(f"--export_path={export_path} is a file; pass a new or existing "
                         "directory")
    encoder = encoder if encoder is not None else load_encoder(model_dir, checkpoint)
    summary = {"format": export_format, "model_dir": model_dir,
               "embedding_dim": encoder.encoder_config.embedding_size,
               "parameters": encoder.count_params(), "precision": precision}
    if export_format == "encoder_only":
        paths = {"model": export_encoder_only(encoder, export_path)}
    else:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir)
        summary["max_seq_length"] = tokenizer.max_seq_length
        if export_format == "lealla":
            paths = {"model": export_lealla_model(encoder, tokenizer, export_path,
                                                  jit_compile=jit_compile, precision=precision)}
            summary["slow_precision_warning"] = slow_precision_warning(
                precision, f"the export {export_path}")
        elif export_format == "int8_tflite":
            paths = {"model": export_int8_tflite(encoder, tokenizer, export_path)}
        else:
            paths = export_labse_pair(encoder, tokenizer, export_path, seq_length=seq_length)
    summary["paths"] = paths
    summary["bytes"] = {name: saved_model_size(path) for name, path in paths.items()}
    if tokenizer is not None:  # a model that maps every sentence to one point says so
        embedded = encoder(tokenizer(tf.constant(SPREAD_SENTENCES)))["sentence_embedding"]
        summary["mean_cosine"] = mean_cosine(embedded.numpy())
        summary["collapse_warning"] = collapse_warning(summary["mean_cosine"],
                                                       f"the model exported to {export_path}")
    return summary


# Unrelated sentences in several scripts: the export's spread check.
SPREAD_SENTENCES = ["The dog is nice.", "Stock markets fell sharply on Monday.",
                    "Der Zug hat zehn Minuten Verspätung.", "我喜欢喝茶。",
                    "Правительство объявило новые выборы.", "¿Dónde está la biblioteca?",
                    "The patient was given antibiotics twice a day.", "7 + 5 = 12",
                    "Le musée ferme à dix-huit heures.", "彼は毎朝走っています。"]
