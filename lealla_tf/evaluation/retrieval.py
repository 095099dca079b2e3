"""Embedding sentences for an evaluation, retrieval in bounded memory, and
UN-style retrieval over a large pool.

`embed_sentences` is how every evaluation here embeds: an `Embedder`'s `encode`,
or any callable of a string tensor, in batches of similar length.
`row_blocks`, `merge_column_top` and `merge_column_argmax` score a similarity
matrix a block of rows at a time, so that memory does not grow with the square
of the set (`lealla_tf.evaluation.tatoeba`).
`evaluate_un_style` is LaBSE / LEALLA's UN task: each source sentence retrieves
its translation among all the English sentences of the pool.
"""

from collections.abc import Callable, Sequence

import numpy as np

from lealla_tf.inference.batching import (
    PIPELINE_BATCH_SIZE,
    PIPELINE_MAX_TOKENS,
    encode_in_length_order,
)
from lealla_tf.inference.embedder import Embedder
from lealla_tf.mining.neighbours import knn, normalize_rows

# The metric names, spelled here and nowhere else.
UN_AVERAGE_P_AT_1 = "un/average_p_at_1"
# The float32 similarities of one block of rows (`row_blocks`): scoring holds a
# few such blocks at once, and never a whole matrix, whatever the set's size.
BLOCK_BYTES = 32 << 20


def embed_sentences(embed: Callable, sentences: Sequence, batch_size: int = PIPELINE_BATCH_SIZE,
                    progress: bool = False, description: str = "embedding",
                    max_tokens: int | None = PIPELINE_MAX_TOKENS) -> np.ndarray:
    """Embeds `sentences` in batches of similar length; rows in input order.

    Sorting by length before batching means little padding (each batch is
    padded to its longest sentence), which on CPU is most of the cost.

    Args:
        embed: an `Embedder` (its `encode` sorts by token length), or any
            callable taking a tf.string tensor `[b]` to `[b, d]` embeddings.
        sentences: str or bytes. No sentences give `[0, d]` from an
            `Embedder`; from a plain callable, whose width is unknown until it
            runs, they raise ValueError.
        batch_size: sentences per call (at most).
        max_tokens: padded tokens per call (at most; `Embedder`s only, which
            know token lengths; a plain callable, whose sentences may be long,
            gets at most `PLAIN_BATCH_SIZE` sentences per call instead).
    """
    if isinstance(embed, Embedder):
        return embed.encode(sentences, batch_size, progress, description, max_tokens)
    import tensorflow as tf  # noqa: PLC0415 - only for a plain callable; an Embedder needs none

    embeddings, _ = encode_in_length_order(lambda batch: embed(tf.constant(batch)), sentences,
                                           batch_size, show_progress_bar=progress,
                                           description=description, max_tokens=max_tokens)
    return embeddings


def retrieval_accuracy(queries: np.ndarray, pool: np.ndarray, gold: np.ndarray,
                       index_type: str = "flat", **index_options) -> float:
    """P@1: the fraction of queries whose nearest pool vector (faiss, inner
    product on unit vectors) is their gold pool index."""
    _, indices = knn(normalize_rows(queries), normalize_rows(pool), 1, index_type,
                     **index_options)
    return float(np.mean(indices[:, 0] == np.asarray(gold)))


def evaluate_un_style(embed: Callable, pairs_by_language: dict[str, list],
                      distractor_english: Sequence[str], batch_size: int = PIPELINE_BATCH_SIZE,
                      index_type: str = "flat", progress: bool = False) -> dict[str, float]:
    """UN-style P@1 (LaBSE / LEALLA's UN task): each source sentence retrieves
    its translation among ALL English sentences of the pool (every language's
    gold English plus distractors); P@1 xx -> en.

    Returns `un/<lang>/p_at_1`, `un/average_p_at_1` and `un/pool_size`.
    """
    english_pool = list(distractor_english)
    gold_positions, sources = {}, {}
    for language, pairs in sorted(pairs_by_language.items()):
        gold_positions[language] = np.arange(len(english_pool), len(english_pool) + len(pairs))
        english_pool += [e for _, e in pairs]
        sources[language] = [s for s, _ in pairs]
    pool = embed_sentences(embed, english_pool, batch_size, progress, "un pool")
    metrics = {"un/pool_size": len(english_pool)}
    for language in sorted(pairs_by_language):
        queries = embed_sentences(embed, sources[language], batch_size, progress, f"un {language}")
        metrics[f"un/{language}/p_at_1"] = retrieval_accuracy(
            queries, pool, gold_positions[language], index_type)
    metrics[UN_AVERAGE_P_AT_1] = float(np.mean(
        [metrics[f"un/{lang}/p_at_1"] for lang in pairs_by_language]))
    return metrics


# === Scoring a similarity matrix a block of rows at a time ===

def row_blocks(rows: int, columns: int, block_rows: int | None = None) -> list[slice]:
    """Slices covering `rows` rows, a block of at most `block_rows` each
    (default: as many as `BLOCK_BYTES` of float32 similarities with `columns`
    columns hold). The blocks are even, so that none is a sliver of a row or
    two: BLAS may multiply those another way, whose last bit can differ from
    the whole product's."""
    if block_rows is None:
        block_rows = max(1, BLOCK_BYTES // (4 * max(columns, 1)))
    if not (isinstance(block_rows, (int, np.integer)) and block_rows >= 1):
        raise ValueError(f"block_rows must be a positive integer, got {block_rows}")
    count = -(-rows // block_rows)
    bounds = [rows * block // count for block in range(count + 1)] if count else [0]
    return [slice(start, stop) for start, stop in zip(bounds[:-1], bounds[1:])]


def merge_column_top(top: np.ndarray | None, block: np.ndarray, k: int) -> np.ndarray:
    """Each column's `k` largest values among the rows merged so far and
    `block`'s: a `[<= k, columns]` array, largest first and NaN last, as
    `-np.sort(-matrix, axis=0)[:k]` orders the whole matrix's (`top`: None
    before the first block)."""
    negated = -block if top is None else np.concatenate([-top, -block])
    if len(negated) > k:
        negated = np.partition(negated, k - 1, axis=0)[:k]
    return -np.sort(negated, axis=0)


def merge_column_argmax(best: tuple[np.ndarray, np.ndarray] | None, block: np.ndarray,
                        offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, rows) of each column's maximum among the rows merged so far and
    `block`'s (its rows numbered from `offset`), exactly as np.argmax(axis=0)
    of the whole matrix picks it: the first of equal maxima, and the first NaN
    over any number (`best`: None before the first block)."""
    rows = np.argmax(block, axis=0)
    values = block[rows, np.arange(block.shape[1])]
    if best is None:
        return values, rows + offset
    kept, kept_rows = best
    later = ~np.isnan(kept) & (np.isnan(values) | (values > kept))
    return np.where(later, values, kept), np.where(later, rows + offset, kept_rows)
