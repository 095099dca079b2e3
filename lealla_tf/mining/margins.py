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
flips) or near 0 (the score explodes: 1,500 on 5 x 4 random rows). Candidates
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

Beyond memory: `mine` and `knn` take arrays or `Rows`, whose parts may be raw
float32 files (e.g. `lealla_tf.mining.shards.mmap_embeddings`) memory-mapped one chunk at a
time, so the input matrices are never copied whole. With `memory_budget_gb` the
work is planned to fit the budget: queries are searched in chunks, the index
(trained on a sample, then filled chunk by chunk) is split into blocks whose
results are merged when a side's index does not fit, and the [n, k] neighbour
lists go to a work folder on disk (`mining-<pid>-<host>-*` in `work_dir`: a
killed run's folder is removed by the next run that spills there). What stays
in memory per sentence (averages, best pairs, the one-to-one matching) is
counted against the budget, and a budget too small for it is a ValueError
before any work.
"""

import contextlib
import enum
import logging
import math
import os
import tempfile
import time
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np

GIB = 2 ** 30
log = logging.getLogger(__name__)
# Bytes a sentence that stay in memory whatever the budget: both averages and
# whether each neighbourhood is positive, the best pair of each direction, and the
# one-to-one matching's temporaries.
MATCHING_BYTES_PER_SENTENCE = 114
MIN_WORKING_BYTES = 32 * 2 ** 20
PQ_MIN_TRAINING = 256  # 8-bit product quantisation learns 256 centroids a sub-vector
INVALID_REASONS = {"non_finite": "has a NaN or infinite value", "zero": "is all zeros"}


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


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """float32 copy with unit rows (zero rows stay zero)."""
    return _unit(np.array(x, dtype=np.float32))


# Embeddings of different sentences whose mean cosine is this high carry no
# information: a collapsed model (every sentence at one point) scores >= 0.9999;
# trained students and teachers score 0.05-0.8 on Tatoeba's English side.
COLLAPSED_MEAN_COSINE = 0.99


def mean_cosine(embeddings, max_rows: int = 2000) -> float:
    """The mean cosine between the embeddings of different rows (the first
    `max_rows`): near 1 when a model maps every sentence to the same point. Rows
    of zeros (a model collapsed to the origin) count as the same point: cosine
    1 with each other, 0 with the rest."""
    x = normalize_rows(np.asarray(embeddings)[:max_rows])
    n = len(x)
    if n < 2:
        return float("nan")
    zeros = int(np.sum(~np.any(x, axis=1)))
    total = x.sum(axis=0, dtype=np.float64)
    pairs = total @ total - np.einsum("ij,ij->", x, x, dtype=np.float64) + zeros * (zeros - 1)
    return float(pairs / (n * (n - 1)))


def collapse_warning(cosine: float, what: str) -> Optional[str]:
    """A warning naming `what` when `mean_cosine` says it has collapsed, else None."""
    if not cosine >= COLLAPSED_MEAN_COSINE:
        return None
    return (f"WARNING: {what} has collapsed: different sentences have a mean cosine of "
            f"{cosine:.5f}, so its embeddings barely tell them apart. Train longer, lower "
            "the learning rate, or train with the main job's recipe on your pairs "
            "(python -m lealla_tf.recipe --data_dir=DIR)")


def _unit(x: np.ndarray) -> np.ndarray:
    """Scales the float32 rows of `x` to unit length, in place (zero rows stay zero)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    x /= np.maximum(norms, 1e-30).astype(np.float32)[:, None]
    return x


# === Rows: a matrix in arrays or memory-mapped files, read a chunk at a time ===

class Rows:
    """An `[n, d]` float32 matrix kept in parts: arrays, or `(path, rows, dim)`
    raw little-endian float32 files. A file part is memory-mapped for one chunk
    and unmapped after it, so reading never holds more than a chunk; the matrix
    is never copied whole."""

    def __init__(self, parts: Sequence, name: str = "rows"):
        self.name, self._parts, self._starts = name, [], []
        rows, dims = 0, set()
        for part in parts:
            if isinstance(part, tuple):
                path, length, dim = part
                part = (str(path), int(length), int(dim))
            else:
                part = np.asarray(part)
                if part.ndim != 2:
                    raise ValueError(f"{name} must be a 2-D [n, d] matrix, got shape "
                                     f"{part.shape}")
                length, dim = part.shape
            if length:
                self._parts.append(part)
                self._starts.append(rows)
                dims.add(dim)
            rows += length
        if len(dims) > 1:
            raise ValueError(f"the parts of {name} differ in dimension: {sorted(dims)}")
        self.rows, self.dim = rows, dims.pop() if dims else 0

    @classmethod
    def of(cls, value, name: str) -> "Rows":
        return value if isinstance(value, Rows) else cls([value], name)

    def read(self, start: int, stop: int) -> np.ndarray:
        """A float32 copy of rows [start, stop)."""
        pieces = []
        for first, part in zip(self._starts, self._parts):
            length = part[1] if isinstance(part, tuple) else len(part)
            low, high = max(start, first), min(stop, first + length)
            if low < high:
                pieces.append(_read_part(part, low - first, high - first))
        if not pieces:
            return np.zeros((0, self.dim), np.float32)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def chunks(self, size: int, start: int = 0, stop: Optional[int] = None):
        """(first row, float32 copy) of consecutive chunks of rows [start, stop)."""
        stop = self.rows if stop is None else stop
        for first in range(start, stop, size):
            yield first, self.read(first, min(stop, first + size))

    def take(self, indices: np.ndarray, chunk: int) -> np.ndarray:
        """Rows at sorted `indices`, gathered one chunk of the matrix at a time."""
        out = np.empty((len(indices), self.dim), np.float32)
        for first in range(0, self.rows, chunk):
            low, high = np.searchsorted(indices, [first, first + chunk])
            if low < high:
                window = self.read(first, min(self.rows, first + chunk))
                out[low:high] = window[indices[low:high] - first]
        return out


def _read_part(part, start: int, stop: int) -> np.ndarray:
    if not isinstance(part, tuple):
        return np.array(part[start:stop], dtype=np.float32)
    path, _, dim = part
    mapped = np.memmap(path, dtype="<f4", mode="r", offset=start * dim * 4,
                       shape=(stop - start, dim))
    try:
        return np.array(mapped, dtype=np.float32)
    finally:
        mapped._mmap.close()  # unmapped now: the chunk's pages leave this process


def invalid_rows(rows: Rows, chunk: int = 65_536) -> Tuple[np.ndarray, np.ndarray]:
    """(indices, reasons) of rows that cannot be mined: a NaN or infinite value,
    or all zeros (no direction). Reasons are "non_finite" or "zero"."""
    indices, reasons = [np.zeros(0, np.int64)], [np.zeros(0, object)]
    for start, x in rows.chunks(chunk):
        finite = np.isfinite(x).all(axis=1)
        x[~finite] = 0
        zero = finite & (np.einsum("ij,ij->i", x, x, dtype=np.float64) == 0)
        for mask, reason in ((~finite, "non_finite"), (zero, "zero")):
            indices.append(np.flatnonzero(mask).astype(np.int64) + start)
            reasons.append(np.full(len(indices[-1]), reason, dtype=object))
    indices, reasons = np.concatenate(indices), np.concatenate(reasons)
    order = np.argsort(indices, kind="stable")
    return indices[order], reasons[order]


# === Indexes ===

def _index_options(n: int, d: int, index_type: str, nlist: Optional[int] = None,
                   nprobe: int = 16, pq_subquantizers: Optional[int] = None,
                   train_size: Optional[int] = None, seed: int = 0) -> dict:
    """Checked index settings for n candidates: {type, nlist, nprobe, m, train_size}."""
    if index_type not in ("flat", "ivf", "ivfpq"):
        raise ValueError(f"index_type must be flat, ivf or ivfpq, got {index_type!r}")
    if nprobe < 1 or (nlist is not None and nlist < 1):
        raise ValueError(f"nlist and nprobe must be at least 1, got {nlist} and {nprobe}")
    if train_size is not None and train_size < 1:
        raise ValueError(f"train_size must be at least 1, got {train_size}")
    options = {"type": index_type, "nlist": None, "nprobe": nprobe, "m": None,
               "train_size": train_size}
    if index_type != "flat":
        options["nlist"] = max(1, min(nlist or min(n // 39, int(4 * np.sqrt(n))), n))
    if index_type == "ivfpq":
        m = pq_subquantizers or max(1, d // 8)
        if d % m:
            raise ValueError(f"pq_subquantizers={m} must divide the dimension {d}")
        if n < PQ_MIN_TRAINING:
            raise ValueError(f"ivfpq needs at least {PQ_MIN_TRAINING} candidates to learn its "
                             f"codes, got {n}; use the flat or ivf index")
        options["m"] = m
    return options


def _bytes_per_vector(d: int, options: dict) -> int:
    """Index memory a candidate (codes or vector, its id, list overhead)."""
    return (options["m"] if options["type"] == "ivfpq" else 4 * d) + 16


def _trained_index(candidates: Rows, skip: Optional[np.ndarray], options: dict,
                   sample_rows: Optional[int], seed: int, chunk: int):
    """An empty faiss inner-product index, trained on a sample of the valid candidates."""
    import faiss

    d = candidates.dim
    if options["type"] == "flat":
        return faiss.IndexIDMap(faiss.IndexFlatIP(d))
    nlist = options["nlist"]
    quantizer = faiss.IndexFlatIP(d)
    if options["type"] == "ivf":
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexIVFPQ(quantizer, d, nlist, options["m"], 8,
                                 faiss.METRIC_INNER_PRODUCT)
    valid = np.arange(candidates.rows) if skip is None else np.flatnonzero(~skip)
    pq_points = PQ_MIN_TRAINING if options["m"] else 1
    cap = options["train_size"] or 256 * max(nlist, pq_points)  # faiss's own cap by default
    size = min(len(valid), max(min(cap, sample_rows or cap), 39 * nlist, pq_points))
    rng = np.random.default_rng(seed)
    sample = np.sort(valid[rng.choice(len(valid), size=size, replace=False)])
    index.train(_unit(candidates.take(sample, chunk)))
    index.nprobe = min(options["nprobe"], nlist)
    return index


def build_index(vectors, index_type: str = "flat", nlist: Optional[int] = None,
                nprobe: int = 16, pq_subquantizers: Optional[int] = None, seed: int = 0,
                chunk_size: int = 65_536, train_size: Optional[int] = None):
    """A faiss inner-product index over the unit rows of `vectors` (array or Rows).

    Args:
        index_type: "flat" (exact), "ivf" (inverted lists, exact vectors) or
            "ivfpq" (inverted lists + product quantisation: ~d/8 bytes a vector).
        nlist: inverted lists (default ~4 sqrt(n)); nprobe: lists searched.
        pq_subquantizers: PQ sub-vectors (default d/8; must divide d).
        train_size: vectors the index learns from (default 256 nlist; at least
            39 nlist): a sample, read a chunk at a time.
    The index is trained on a sample and filled `chunk_size` rows at a time.
    """
    rows = Rows.of(vectors, "vectors")
    options = _index_options(rows.rows, rows.dim, index_type, nlist, nprobe, pq_subquantizers,
                             train_size)
    index = _trained_index(rows, None, options, None, seed, chunk_size)
    _fill(index, rows, None, 0, rows.rows, chunk_size)
    return index


def _fill(index, rows: Rows, skip: Optional[np.ndarray], start: int, stop: int,
          chunk: int) -> None:
    """Adds the valid rows [start, stop) of `rows`, unit length, under their row numbers."""
    for first, x in rows.chunks(chunk, start, stop):
        ids = np.arange(first, first + len(x), dtype=np.int64)
        if skip is not None:
            keep = ~skip[first:first + len(x)]
            x, ids = x[keep], ids[keep]
        if len(x):
            index.add_with_ids(_unit(x), ids)


# === Nearest neighbours, in memory or spilled to disk ===

class _Neighbours:
    """Each query's k nearest candidates: [n, k] similarities (clipped to
    [-1, 1]; -inf where none) and ids (-1 where none), in memory or in two files
    that are read and written a row range at a time."""

    def __init__(self, n: int, k: int, directory: Optional[str] = None, name: str = ""):
        self.n, self.k, self._files = n, k, None
        if directory is None:
            self._sims = np.full((n, k), -np.inf, np.float32)
            self._ids = np.full((n, k), -1, np.int64)
        else:
            self._files = []
            for suffix in ("sims", "ids"):
                descriptor = os.open(os.path.join(directory, f"{name}.{suffix}"),
                                     os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                os.ftruncate(descriptor, n * k * (4 if suffix == "sims" else 8))
                self._files.append(descriptor)

    def close(self):
        while self._files:
            os.close(self._files.pop())

    def read(self, start: int, stop: int) -> Tuple[np.ndarray, np.ndarray]:
        if self._files is None:
            return self._sims[start:stop], self._ids[start:stop]
        shape = (stop - start, self.k)
        sims = np.frombuffer(os.pread(self._files[0], 4 * shape[0] * self.k, 4 * start * self.k),
                             np.float32).reshape(shape)
        ids = np.frombuffer(os.pread(self._files[1], 8 * shape[0] * self.k, 8 * start * self.k),
                            np.int64).reshape(shape)
        return sims, ids

    def write(self, start: int, sims: np.ndarray, ids: np.ndarray) -> None:
        if self._files is None:
            self._sims[start:start + len(sims)], self._ids[start:start + len(ids)] = sims, ids
            return
        os.pwrite(self._files[0], np.ascontiguousarray(sims, np.float32).tobytes(),
                  4 * start * self.k)
        os.pwrite(self._files[1], np.ascontiguousarray(ids, np.int64).tobytes(),
                  8 * start * self.k)

    def merge(self, start: int, sims: np.ndarray, ids: np.ndarray, first: bool) -> None:
        """Keeps the k best of the stored and the new neighbours of rows from `start`."""
        sims = np.where(ids >= 0, np.clip(sims, -1, 1), -np.inf).astype(np.float32)
        ids = np.where(ids >= 0, ids, -1)
        if not first:
            old_sims, old_ids = self.read(start, start + len(sims))
            sims, ids = np.hstack([old_sims, sims]), np.hstack([old_ids, ids])
            order = np.argsort(-sims, axis=1, kind="stable")[:, :self.k]
            sims = np.take_along_axis(sims, order, 1)
            ids = np.take_along_axis(ids, order, 1)
        self.write(start, sims, ids)

    def averages(self, chunk: int) -> Tuple[np.ndarray, np.ndarray]:
        """(mean similarity of each row's found neighbours, NaN where none was
        found; whether all of them are > 0, True where none was found)."""
        out, positive = np.empty(self.n, np.float32), np.ones(self.n, bool)
        for start in range(0, self.n, chunk):
            sims, ids = self.read(start, min(self.n, start + chunk))
            found = ids >= 0
            total = np.where(found, sims, 0).sum(axis=1, dtype=np.float64)
            count = found.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[start:start + len(sims)] = np.where(count > 0, total / count, np.nan)
            positive[start:start + len(sims)] = np.where(found, sims > 0, True).all(axis=1)
        return out, positive


class _Plan(NamedTuple):
    query_rows: int  # queries searched (and candidates added) at once
    block_rows: Optional[int]  # candidates indexed at once (None: a whole side)
    sample_rows: Optional[int]  # cap on the index's training sample
    spill: bool  # neighbour lists on disk


def plan_mining(n_source: int, n_target: int, d: int, k: int, index_type: str = "flat",
                memory_budget_gb: Optional[float] = None, chunk_size: int = 65_536,
                **index_options) -> _Plan:
    """Checks mining settings and fits the work into `memory_budget_gb`.

    Raises ValueError (one line, naming the setting) for k < 1, an empty side,
    bad index settings, a budget that is not a positive finite number, or one
    too small for the per-sentence bookkeeping.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if n_source == 0 or n_target == 0:
        side = "source" if n_source == 0 else "target"
        raise ValueError(f"the {side} side has no embeddings: nothing to mine")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    largest = max(_bytes_per_vector(d, _index_options(n, d, index_type, **index_options))
                  for n in (n_source, n_target))
    if memory_budget_gb is None:
        return _Plan(chunk_size, None, None, spill=False)
    if not (memory_budget_gb > 0 and math.isfinite(memory_budget_gb)):
        # inf would plan 1-row blocks: quadratic, 140x slower at 2,000 rows
        raise ValueError(f"memory_budget_gb must be positive and finite (GiB), got "
                         f"{memory_budget_gb}")
    budget = memory_budget_gb * GIB
    working = budget - MATCHING_BYTES_PER_SENTENCE * (n_source + n_target)
    if working < MIN_WORKING_BYTES:
        need = (MATCHING_BYTES_PER_SENTENCE * (n_source + n_target) + MIN_WORKING_BYTES) / GIB
        raise ValueError(f"memory_budget_gb={memory_budget_gb:g} is too small to mine "
                         f"{n_source:,} x {n_target:,} sentences: it needs at least "
                         f"{need:.2f}; raise it or split the corpus")
    per_query = 12 * d + 64 * k + 256
    query_rows = int(max(64, min(chunk_size, 0.15 * working // per_query)))
    block_rows = int(max(1, 0.55 * working // largest))
    sample_rows = int(max(1, 0.5 * working // (8 * d)))
    return _Plan(query_rows, block_rows, sample_rows, spill=True)


def _neighbours(queries: Rows, candidates: Rows, k: int, plan: _Plan, result: _Neighbours,
                skip_queries: Optional[np.ndarray] = None,
                skip_candidates: Optional[np.ndarray] = None, index_type: str = "flat",
                seed: int = 0, index=None, **index_options) -> None:
    """Fills `result` with the k nearest valid candidates of every query.

    The index is trained once on a sample; when a side does not fit the plan's
    block, each block of candidates is indexed in turn, every query chunk is
    searched against it, and the results are merged.
    """
    import faiss

    if index is not None:
        blocks, trained = [(0, None)], None
    else:
        valid = candidates.rows - (0 if skip_candidates is None else int(skip_candidates.sum()))
        options = _index_options(valid, candidates.dim, index_type, **index_options)
        trained = _trained_index(candidates, skip_candidates, options, plan.sample_rows, seed,
                                 plan.query_rows)
        block = plan.block_rows or candidates.rows
        blocks = [(start, min(candidates.rows, start + block))
                  for start in range(0, candidates.rows, block)]
    for number, (start, stop) in enumerate(blocks):
        if trained is not None:
            index = trained if len(blocks) == 1 else faiss.clone_index(trained)
            _fill(index, candidates, skip_candidates, start, stop, plan.query_rows)
        for first, x in queries.chunks(plan.query_rows):
            skipped = None if skip_queries is None else skip_queries[first:first + len(x)]
            if skipped is not None:
                x[skipped] = 0
            sims, ids = index.search(_unit(x), k)
            if skipped is not None:
                ids[skipped] = -1
            result.merge(first, sims, ids, first=number == 0)
        if trained is not None:
            del index


SPILL_FOLDER = r"mining-(?P<pid>\d+)-(?P<host>[A-Za-z0-9_]+)-[a-z0-9_]+"


@contextlib.contextmanager
def _spill_folder(work_dir: Optional[str]):
    """A fresh folder for spilled neighbour lists in `work_dir` (default: the
    temporary folder), named by this process and host and removed after use;
    the folders of killed runs found there (their process gone) go first."""
    from lealla_tf.mining.shards import host_tag, remove_dead_leftovers

    remove_dead_leftovers(work_dir or tempfile.gettempdir(), SPILL_FOLDER)
    with tempfile.TemporaryDirectory(prefix=f"mining-{os.getpid()}-{host_tag()}-",
                                     dir=work_dir) as directory:
        yield directory


def knn(queries, candidates, k: int, index_type: str = "flat", chunk_size: int = 65_536,
        index=None, memory_budget_gb: Optional[float] = None,
        **index_options) -> Tuple[np.ndarray, np.ndarray]:
    """k nearest candidates of each query by cosine: (similarities, indices).

    Rows are normalised chunk by chunk; queries are searched `chunk_size` at a
    time (or as `memory_budget_gb` allows). Where an inverted-list index finds
    fewer than k neighbours the index is -1 and the similarity -inf.
    """
    queries, candidates = Rows.of(queries, "queries"), Rows.of(candidates, "candidates")
    k = min(k, candidates.rows if index is None else index.ntotal)
    plan = _Plan(chunk_size, None, None, False)
    if index is None and memory_budget_gb is not None:
        plan = plan_mining(queries.rows, candidates.rows, candidates.dim, k, index_type,
                           memory_budget_gb, chunk_size, **index_options)._replace(spill=False)
    result = _Neighbours(queries.rows, k)
    _neighbours(queries, candidates, k, plan, result, index_type=index_type, index=index,
                **index_options)
    return result.read(0, queries.rows)


# === Margins and matching ===

def margin_scores(cosines: np.ndarray, source_average: np.ndarray,
                  target_average: np.ndarray, margin: Margin,
                  positive: Optional[np.ndarray] = None) -> np.ndarray:
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


def _best_pairs(neighbours: _Neighbours, own: Tuple[np.ndarray, np.ndarray],
                other: Tuple[np.ndarray, np.ndarray], margin: Margin,
                chunk: int) -> Tuple[Tuple[np.ndarray, np.ndarray, np.ndarray], int]:
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
         threshold: Optional[float] = None, index_type: str = "flat",
         chunk_size: int = 65_536, memory_budget_gb: Optional[float] = None,
         work_dir: Optional[str] = None, skip_invalid: bool = False,
         neighbours_dir: Optional[str] = None, **index_options) -> Dict[str, np.ndarray]:
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
            directory = stack.enter_context(_spill_folder(work_dir))
        if neighbours_dir is not None:
            os.makedirs(neighbours_dir, exist_ok=True)
        lists = []
        for name, queries, candidates, width, skip_q, skip_c in (
                ("forward", source, target, k_forward, skips[0], skips[1]),
                ("backward", target, source, k_backward, skips[1], skips[0])):
            result = _Neighbours(queries.rows, width, directory, name)
            stack.callback(result.close)
            _neighbours(queries, candidates, width, plan, result, skip_q, skip_c, index_type,
                        **index_options)
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
