"""Length-aware batching: the part of `Embedder.encode` that needs no model.

Sentences are sorted by token length (character length where the model hides its
tokenizer), cut into batches of at most `batch_size` sentences and, with
`max_tokens`, at most that many padded positions, embedded, and put back in input
order, so each batch is padded only to its own longest sentence
(`encode_in_length_order`, `length_batches`).

Where the tokenizer and the encoder can be called apart (a `TokenPath`), every
sentence is tokenized once, in large chunks (`tokenize_once`), and each batch is
cut from those arrays (`pack_rows`): one tokenizer call per chunk instead of two
per batch (one to sort, one to embed); `benchmarks/embedding_speed.py` measures both.
"""

import collections.abc
import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from lealla_tf.progress import progress_bar

# How our own pipelines batch (evaluation, the main job, Beam): at most this many
# sentences and padded tokens per call, so short sentences go in large calls,
# where the student's narrow matmuls run faster (chosen by
# benchmarks/embedding_speed.py, which also runs `--max_tokens=0 --batch_size=64`).
PIPELINE_BATCH_SIZE = 1024
PIPELINE_MAX_TOKENS = 4096
# Sentences per call, at most, when a token cap is asked for but the model hides
# its tokenizer (no token lengths to cap by): sentences of any length, so few.
PLAIN_BATCH_SIZE = 128
# Sentences per tokenizer call when `encode` tokenizes ahead of embedding.
TOKENIZE_CHUNK = 8192


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
                   max_tokens: int | None = None, rows_multiple: int = 1) -> list:
    """Cuts sentences sorted by length into `(start, stop)` batches: at most
    `batch_size` sentences each and, with `max_tokens`, at most that many padded
    positions (sentences x the batch's longest); a sentence longer than
    `max_tokens` gets a batch of its own. `rows_multiple`: a batch that holds at
    least that many sentences holds a whole multiple of it (a model compiled for
    such row counts pads the others with empty rows)."""
    _check_count("batch_size", batch_size)
    _check_count("rows_multiple", rows_multiple)
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
        if stop - start >= rows_multiple:
            stop = start + (stop - start) // rows_multiple * rows_multiple
        batches.append((start, stop))
        start = stop
    return batches


def encode_in_length_order(embed_batch: Callable, sentences: Sequence, batch_size: int = 64,
                           lengths: Sequence[int] | None = None,
                           show_progress_bar: bool = False,
                           description: str = "embedding",
                           max_tokens: int | None = None,
                           rows_multiple: int = 1) -> (np.ndarray, dict):
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
        rows_multiple: as `length_batches` takes it.

    Returns:
        (embeddings `[n, d]` float32, stats): stats has sentences, batches,
        seconds, sentences_per_second and, with token lengths, tokens,
        padded_tokens and padding_waste (the fraction of padded positions).
    """
    sentences = list(sentences)
    length_batches([], batch_size, max_tokens, rows_multiple)  # refuses bad counts
    if not sentences:
        raise ValueError("no sentences to embed")
    token_lengths = lengths is not None
    lengths = np.asarray(lengths if token_lengths else [len(s) for s in sentences])
    order = np.argsort(lengths, kind="stable")
    if max_tokens is not None and not token_lengths:
        batch_size, max_tokens = min(batch_size, PLAIN_BATCH_SIZE), None
    batches = length_batches(lengths[order], batch_size, max_tokens, rows_multiple)
    chunks, padded = [], 0
    start_time = time.time()
    for start, stop in progress_bar(batches, desc=description, unit="batch",
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
        rows_multiple: batches come in whole multiples of this many rows
            where they can (an XLA-compiled export's; `length_batches`).
    """

    tokenize: Callable
    embed_inputs: Callable
    pad_id: int = 0
    embed_raw: Callable | None = None
    rows_multiple: int = 1


def tokenize_once(tokenize: Callable, sentences: Sequence,
                  chunk: int | None = None) -> (np.ndarray, np.ndarray):
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
              starts: np.ndarray | None = None) -> dict:
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

