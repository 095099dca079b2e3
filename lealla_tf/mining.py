"""Parallel-sentence mining with faiss kNN and margin scoring (Artetxe & Schwenk 2019).

For candidate pair (x, y) with cosine c = cos(x, y), let a_x be the mean cosine
of x to its k nearest neighbours among the targets and a_y that of y among the
sources (k = 4 both ways). Margins:
    absolute: c
    distance: c - (a_x + a_y) / 2
    ratio:    c / ((a_x + a_y) / 2)
Retrieval: fwd (each source keeps its best target), bwd (each target its best
source), intersect (pairs found both ways), max (both directions pooled, then
greedily one-to-one by decreasing score). Everything is vectorised: kNN is
faiss, scoring is numpy over the [n, k] candidate arrays, and the greedy
one-to-one matching proceeds in rounds of mutually-best pairs.
"""

import enum
from typing import Dict, Optional, Tuple

import numpy as np


class Margin(enum.Enum):
    ABSOLUTE = "absolute"
    DISTANCE = "distance"
    RATIO = "ratio"


class Retrieval(enum.Enum):
    FORWARD = "fwd"
    BACKWARD = "bwd"
    INTERSECT = "intersect"
    MAX = "max"


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """float32 copy with unit rows (zero rows stay zero)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def build_index(vectors: np.ndarray, index_type: str = "flat", nlist: Optional[int] = None,
                nprobe: int = 16, pq_subquantizers: Optional[int] = None, seed: int = 0):
    """A faiss inner-product index over unit `vectors`.

    Args:
        index_type: "flat" (exact), "ivf" (inverted lists, exact vectors) or
            "ivfpq" (inverted lists + product quantisation: ~d/8 bytes a vector).
        nlist: inverted lists (default ~4 sqrt(n)); nprobe: lists searched.
        pq_subquantizers: PQ sub-vectors (default d/8; must divide d).
    """
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(d)
    elif index_type in ("ivf", "ivfpq"):
        nlist = nlist or max(1, min(n // 39, int(4 * np.sqrt(n))))
        quantizer = faiss.IndexFlatIP(d)
        if index_type == "ivf":
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        else:
            m = pq_subquantizers or max(1, d // 8)
            if d % m:
                raise ValueError(f"pq_subquantizers={m} must divide the dimension {d}")
            index = faiss.IndexIVFPQ(quantizer, d, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        sample = vectors[rng.choice(n, size=min(n, 256 * nlist), replace=False)]
        index.train(sample)
        index.nprobe = min(nprobe, nlist)
    else:
        raise ValueError(f"index_type must be flat, ivf or ivfpq, got {index_type!r}")
    index.add(vectors)
    return index


def knn(queries: np.ndarray, candidates: np.ndarray, k: int, index_type: str = "flat",
        chunk_size: int = 65_536, index=None, **index_options) -> Tuple[np.ndarray, np.ndarray]:
    """k nearest candidates of each query by inner product: (similarities, indices).

    Queries are searched in chunks, so memory beyond the index stays bounded
    at chunk_size x k results.
    """
    k = min(k, len(candidates))
    index = index if index is not None else build_index(candidates, index_type, **index_options)
    similarities = np.empty((len(queries), k), np.float32)
    indices = np.empty((len(queries), k), np.int64)
    for start in range(0, len(queries), chunk_size):
        chunk = np.ascontiguousarray(queries[start:start + chunk_size], dtype=np.float32)
        similarities[start:start + len(chunk)], indices[start:start + len(chunk)] = index.search(
            chunk, k)
    return similarities, indices


def margin_scores(cosines: np.ndarray, source_average: np.ndarray,
                  target_average: np.ndarray, margin: Margin) -> np.ndarray:
    """Margin of candidate cosines; averages broadcast against `cosines`."""
    margin = Margin(margin)
    if margin is Margin.ABSOLUTE:
        return cosines
    mean = (source_average + target_average) / 2
    if margin is Margin.DISTANCE:
        return cosines - mean
    return cosines / np.maximum(mean, 1e-12)


def greedy_one_to_one(scores: np.ndarray, sources: np.ndarray,
                      targets: np.ndarray) -> np.ndarray:
    """Indices of candidate pairs kept by greedy one-to-one matching.

    Equivalent to visiting pairs by decreasing score and keeping a pair when
    neither side is taken (LASER's "max" mode), computed in rounds: every pair
    that is the best remaining pair of both its source and its target is kept,
    then pairs touching a kept sentence are dropped. Ties go to the earlier pair.
    """
    order = np.lexsort((np.arange(len(scores)), -scores))  # best first, stable
    alive = order
    kept = []
    while len(alive):
        src, tgt = sources[alive], targets[alive]
        _, first_source = np.unique(src, return_index=True)
        _, first_target = np.unique(tgt, return_index=True)
        best = np.zeros(len(alive), bool)
        best_source = np.zeros(len(alive), bool)
        best_source[first_source] = True
        best[first_target] = True
        best &= best_source
        chosen = alive[best]
        kept.append(chosen)
        taken_sources = np.isin(src, sources[chosen])
        taken_targets = np.isin(tgt, targets[chosen])
        alive = alive[~(taken_sources | taken_targets)]
    kept = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    return kept[np.argsort(-scores[kept], kind="stable")]


def mine(source: np.ndarray, target: np.ndarray, k: int = 4, margin: str = "ratio",
         retrieval: str = "max", threshold: Optional[float] = None, index_type: str = "flat",
         chunk_size: int = 65_536, **index_options) -> Dict[str, np.ndarray]:
    """Mines translation pairs between two embedding matrices.

    Args:
        source, target: `[n, d]`, `[m, d]` embeddings (normalised inside).
        k: neighbours for the margin averages (and candidates per sentence).
        margin: absolute, distance or ratio. retrieval: fwd, bwd, intersect, max.
        threshold: keep pairs scoring at least this (None: keep all).
        index_type, chunk_size, index_options: see `knn` / `build_index`.

    Returns:
        {"score", "source", "target"} arrays, best first.
    """
    margin, retrieval = Margin(margin), Retrieval(retrieval)
    source, target = normalize_rows(source), normalize_rows(target)
    forward_cos, forward_idx = knn(source, target, k, index_type, chunk_size, **index_options)
    backward_cos, backward_idx = knn(target, source, k, index_type, chunk_size, **index_options)
    source_average = forward_cos.mean(axis=1)
    target_average = backward_cos.mean(axis=1)
    forward_scores = margin_scores(forward_cos, source_average[:, None],
                                   target_average[forward_idx], margin)
    backward_scores = margin_scores(backward_cos, source_average[backward_idx],
                                    target_average[:, None], margin)
    rows_f = np.arange(len(source))
    best_f = forward_scores.argmax(axis=1)
    fwd = (forward_scores[rows_f, best_f], rows_f, forward_idx[rows_f, best_f])
    rows_b = np.arange(len(target))
    best_b = backward_scores.argmax(axis=1)
    bwd = (backward_scores[rows_b, best_b], backward_idx[rows_b, best_b], rows_b)
    if retrieval is Retrieval.FORWARD:
        scores, sources, targets = fwd
    elif retrieval is Retrieval.BACKWARD:
        scores, sources, targets = bwd
    elif retrieval is Retrieval.INTERSECT:
        backward_choice = np.full(len(target), -1)
        backward_choice[bwd[2]] = bwd[1]
        agree = backward_choice[fwd[2]] == fwd[1]
        scores, sources, targets = fwd[0][agree], fwd[1][agree], fwd[2][agree]
    else:
        scores = np.concatenate([fwd[0], bwd[0]])
        sources = np.concatenate([fwd[1], bwd[1]])
        targets = np.concatenate([fwd[2], bwd[2]])
        keep = greedy_one_to_one(scores, sources, targets)
        scores, sources, targets = scores[keep], sources[keep], targets[keep]
    order = np.argsort(-scores, kind="stable")
    scores, sources, targets = scores[order], sources[order], targets[order]
    if threshold is not None:
        keep = scores >= threshold
        scores, sources, targets = scores[keep], sources[keep], targets[keep]
    return {"score": scores.astype(np.float32), "source": sources.astype(np.int64),
            "target": targets.astype(np.int64)}


def best_threshold(scores: np.ndarray, correct: np.ndarray, num_gold: int) -> Dict[str, float]:
    """The score threshold with the best F1 against gold (BUCC training split).

    Args:
        scores: mined candidate scores (any order).
        correct: whether each candidate is a gold pair.
        num_gold: number of gold pairs (recall's denominator).
    """
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(correct[order])
    kept = np.arange(1, len(order) + 1)
    precision = hits / kept
    recall = hits / max(num_gold, 1)
    f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall + 1e-12), 0)
    if not len(f1):
        return {"threshold": float("inf"), "precision": 0.0, "recall": 0.0, "f1": 0.0}
    best = int(np.argmax(f1))
    return {"threshold": float(scores[order][best]), "precision": float(precision[best]),
            "recall": float(recall[best]), "f1": float(f1[best])}
