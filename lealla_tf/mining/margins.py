"""Parallel-sentence mining with faiss kNN and margin scoring (Artetxe & Schwenk 2019).

For candidate pair (x, y) with cosine c = cos(x, y), let a_x be the mean cosine
of x to its k nearest targets and a_y that of y to its k nearest sources. k is
capped by the number of (valid) candidates on each side, and a neighbour that an
inverted-list index could not fill (faiss label -1, similarity -3.4e38) is left
out of the mean, never returned. Margins:
    absolute:      c
    distance:      c - (a_x + a_y) / 2
    ratio:         c / ((a_x + a_y) / 2), the paper's ratio margin on plain
                   cosines (LASER's and stopes' score: their thresholds, about
                   1.04-1.06 for BUCC-style mining, carry over);
    ratio_shifted: (1 + c) / (1 + (a_x + a_y) / 2), the ratio of the cosines
                   shifted into [0, 1] (this package's `ratio` before; always
                   defined, in [0, 2k]; its numbers are not LASER's).
The ratio asks how many times more similar the pair is than the two sentences'
typical near neighbours: 1.0 is no better than a neighbour. It presumes
neighbourhoods of positive similarity. A neighbourhood that holds a cosine <= 0
among its k nearest (k reaching into unrelated sentences: k >= the candidates,
tiny sides, unrelated vectors) is degenerate: its mean can be <= 0 (the sign
flips) or near 0 (the score explodes into the thousands). Candidates
touching a degenerate neighbourhood are left out of ratio mining, never scored,
and `mine` reports the sentences and the candidates left out. Where both
neighbourhoods are positive the formula is exactly the paper's, and since c is
one of the k cosines of the searching sentence, the ratio lies in (0, 2k). A
sentence whose search found no neighbour at all has no average; the other
side's average stands alone.

Retrieval: fwd (each source keeps its best target), bwd (each target its best
source), intersect (pairs found both ways), max (both directions pooled, then
greedily one-to-one by decreasing score). Everything is vectorised: kNN is
faiss, scoring is numpy over the [n, k] candidate arrays, and the greedy
one-to-one matching proceeds in rounds of mutually-best pairs.

`mine` searches with `lealla_tf.mining.neighbours` (faiss, in chunks, within a
memory budget, spilling the neighbour lists to disk), so the same call mines
matrices beyond memory.
"""

import contextlib
import enum
import logging
import os
import time

import numpy as np

from lealla_tf.mining.neighbours import (
    INVALID_REASONS,
    NeighbourLists,
    Rows,
    invalid_rows,
    plan_mining,
    search_neighbours,
    spill_folder,
)

log = logging.getLogger(__name__)


class Margin(enum.Enum):
    ABSOLUTE = "absolute"
    DISTANCE = "distance"
    RATIO = "ratio"
    RATIO_SHIFTED = "ratio_shifted"


class Retrieval(enum.Enum):
    FORWARD = "fwd"
    BACKWARD = "bwd"
    INTERSECT = "intersect"
    MAX = "max"


def margin_scores(cosines: np.ndarray, source_average: np.ndarray,
                  target_average: np.ndarray, margin: Margin,
                  positive: np.ndarray | None = None) -> np.ndarray:
    """Margin of candidate cosines; averages broadcast against `cosines`.

    A NaN average (a sentence whose search found no neighbour) is left out of
    the neighbourhood mean. `ratio` is the paper's c / mean; where it is
    undefined (see the module docstring) the score is -inf, never a pair:
    where the mean is <= 0, and where `positive` (broadcast like the averages:
    whether both neighbourhoods of the candidate hold only cosines > 0; None:
    not known) is False.
    """
    margin = Margin(margin)
    if margin is Margin.ABSOLUTE:
        return cosines
    source_average, target_average = np.broadcast_arrays(source_average, target_average)
    mean = np.where(np.isnan(source_average), target_average,
                    np.where(np.isnan(target_average), source_average,
                             (source_average + target_average) / 2))
    if margin is Margin.DISTANCE:
        return cosines - mean
    if margin is Margin.RATIO_SHIFTED:
        # 1 + mean >= (1 + c) / k whenever c is a cosine of a searched row, so the
        # floor only meets 0 / 0 (every cosine -1): the score stays in [0, 2k].
        return (1 + cosines) / np.maximum(1 + mean, 1e-12)
    defined = mean > 0
    if positive is not None:
        defined = defined & positive
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(defined, cosines / np.where(defined, mean, 1), -np.inf)


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


def _best_pairs(neighbours: NeighbourLists, own: tuple[np.ndarray, np.ndarray],
                other: tuple[np.ndarray, np.ndarray], margin: Margin,
                chunk: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], int]:
    """((score, row, partner) of each row's best-scoring found neighbour, the
    number of found neighbours left out because their ratio is undefined).
    `own` and `other` are the (averages, positive) of the two sides."""
    scores, rows, partners, undefined = [], [], [], 0
    for start in range(0, neighbours.n, chunk):
        sims, ids = neighbours.read(start, min(neighbours.n, start + chunk))
        found = ids >= 0
        partner = np.where(found, ids, 0)
        positive = own[1][start:start + len(sims), None] & other[1][partner]
        score = margin_scores(sims, own[0][start:start + len(sims), None], other[0][partner],
                              margin, positive)
        score = np.where(found, score, -np.inf)
        if margin is Margin.RATIO:
            undefined += int((found & np.isneginf(score)).sum())
        best = score.argmax(axis=1)
        row = np.arange(len(sims))
        keep = np.isfinite(score[row, best])
        scores.append(score[row, best][keep].astype(np.float32))
        rows.append(row[keep] + start)
        partners.append(ids[row, best][keep])
    pairs = tuple(np.concatenate(a) if a else np.zeros(0) for a in (scores, rows, partners))
    return pairs, undefined


def mine(source, target, k: int = 4, margin: str = "ratio", retrieval: str = "max",
         threshold: float | None = None, index_type: str = "flat",
         chunk_size: int = 65_536, memory_budget_gb: float | None = None,
         work_dir: str | None = None, skip_invalid: bool = False,
         neighbours_dir: str | None = None, **index_options) -> dict[str, np.ndarray]:
    """Mines translation pairs between two embedding matrices.

    Args:
        source, target: `[n, d]`, `[m, d]` embeddings (arrays or `Rows`;
            normalised inside, a chunk at a time).
        k: neighbours for the margin averages (and candidates per sentence),
            capped by each side's number of valid rows.
        margin: absolute, distance, ratio or ratio_shifted (see the module
            docstring). retrieval: fwd, bwd, intersect, max.
        threshold: keep pairs scoring at least this (None: keep all).
        index_type, chunk_size, index_options: see `knn` / `build_index`.
        memory_budget_gb: plan the work to fit this much memory (see the module
            docstring); neighbour lists then go to a temporary folder in `work_dir`.
        skip_invalid: leave rows with a NaN/infinite value or all zeros out (they
            are reported) instead of raising ValueError.
        neighbours_dir: keep the neighbour lists there (forward.sims / .ids:
            [n, k] float32 / int64 of each source's nearest targets, -inf / -1
            where none; backward.* the other way) to inspect or rescore them.

    Returns:
        {"score", "source", "target"} arrays, best first, and the rows left out:
        "invalid_source", "invalid_target" (indices) with "invalid_source_reason",
        "invalid_target_reason" ("non_finite" or "zero").
    """
    margin, retrieval = Margin(margin), Retrieval(retrieval)
    source, target = Rows.of(source, "source"), Rows.of(target, "target")
    if source.rows and target.rows and source.dim != target.dim:
        raise ValueError(f"source and target embeddings differ in dimension: {source.dim} vs "
                         f"{target.dim}")
    plan = plan_mining(source.rows, target.rows, source.dim, k, index_type, memory_budget_gb,
                       chunk_size, **index_options)
    started = time.perf_counter()

    def phase(name: str) -> None:
        log.info("mine: %s done at %.1f s", name, time.perf_counter() - started)

    skips, report = [], {}
    for name, rows in (("source", source), ("target", target)):
        indices, reasons = invalid_rows(rows, plan.query_rows)
        if len(indices) and not skip_invalid:
            raise ValueError(f"{name} row {indices[0]} {INVALID_REASONS[reasons[0]]} "
                             f"({len(indices)} such rows): every embedding must be finite and "
                             "non-zero; drop them or mine with skip_invalid=True")
        report[f"invalid_{name}"], report[f"invalid_{name}_reason"] = indices, reasons
        skip = np.zeros(rows.rows, bool) if len(indices) else None
        if skip is not None:
            skip[indices] = True
        skips.append(skip)
    phase("validation")
    k_forward = min(k, target.rows - len(report["invalid_target"]))
    k_backward = min(k, source.rows - len(report["invalid_source"]))
    if min(k_forward, k_backward) < 1:
        empty = np.zeros(0, np.int64)
        return {"score": empty.astype(np.float32), "source": empty, "target": empty,
                "degenerate_source": empty, "degenerate_target": empty,
                "degenerate_candidates": 0, **report}
    with contextlib.ExitStack() as stack:
        directory = neighbours_dir
        if directory is None and plan.spill:
            directory = stack.enter_context(spill_folder(work_dir))
        if neighbours_dir is not None:
            os.makedirs(neighbours_dir, exist_ok=True)
        lists = []
        for name, queries, candidates, width, skip_q, skip_c in (
                ("forward", source, target, k_forward, skips[0], skips[1]),
                ("backward", target, source, k_backward, skips[1], skips[0])):
            result = NeighbourLists(queries.rows, width, directory, name)
            stack.callback(result.close)
            search_neighbours(queries, candidates, width, plan, result, skip_q, skip_c,
                              index_type, **index_options)
            lists.append(result)
            phase(f"{name} search")
        source_side = lists[0].averages(plan.query_rows)
        target_side = lists[1].averages(plan.query_rows)
        fwd, undefined_fwd = _best_pairs(lists[0], source_side, target_side, margin,
                                         plan.query_rows)
        bwd, undefined_bwd = _best_pairs(lists[1], target_side, source_side, margin,
                                         plan.query_rows)
        phase("scoring")
    for name, skip, (_, positive) in (("source", skips[0], source_side),
                                      ("target", skips[1], target_side)):
        degenerate = ~positive if margin is Margin.RATIO else np.zeros(len(positive), bool)
        if skip is not None:
            degenerate &= ~skip
        report[f"degenerate_{name}"] = np.flatnonzero(degenerate).astype(np.int64)
    report["degenerate_candidates"] = undefined_fwd + undefined_bwd
    del source_side, target_side
    bwd = (bwd[0], bwd[2], bwd[1])  # (score, source, target)
    if retrieval is Retrieval.FORWARD:
        scores, sources, targets = fwd
    elif retrieval is Retrieval.BACKWARD:
        scores, sources, targets = bwd
    elif retrieval is Retrieval.INTERSECT:
        backward_choice = np.full(target.rows, -1)
        backward_choice[bwd[2]] = bwd[1]
        agree = backward_choice[fwd[2]] == fwd[1]
        scores, sources, targets = fwd[0][agree], fwd[1][agree], fwd[2][agree]
    else:
        scores, sources, targets = (np.concatenate([a, b]) for a, b in zip(fwd, bwd))
        del fwd, bwd
        if threshold is not None:  # exact: a pair below it can never block one above
            keep = scores >= threshold
            scores, sources, targets = scores[keep], sources[keep], targets[keep]
        keep = greedy_one_to_one(scores, sources, targets)
        scores, sources, targets = scores[keep], sources[keep], targets[keep]
    order = np.argsort(-scores, kind="stable")
    scores, sources, targets = scores[order], sources[order], targets[order]
    if threshold is not None:
        keep = scores >= threshold
        scores, sources, targets = scores[keep], sources[keep], targets[keep]
    phase("matching")
    return {"score": scores.astype(np.float32), "source": sources.astype(np.int64),
            "target": targets.astype(np.int64), **report}


def best_threshold(scores: np.ndarray, correct: np.ndarray, num_gold: int) -> dict[str, float]:
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
