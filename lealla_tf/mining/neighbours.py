"""Nearest neighbours for mining: faiss indexes over unit rows, searched in
chunks, with the neighbour lists in memory or spilled to disk.

`knn(queries, candidates, k)` is the k nearest candidates of each query by
cosine; `build_index` an index to search again. Where an inverted-list index
finds fewer than k neighbours (faiss label -1) the index is -1 and the
similarity -inf, so such a neighbour never reaches a score.

Beyond memory: `knn` and `lealla_tf.mining.margins.mine` take arrays or `Rows`,
whose parts may be raw float32 files (e.g. `lealla_tf.mining.shards.mmap_embeddings`)
memory-mapped one chunk at a time, so the input matrices are never copied whole.
With a memory budget, `plan_mining` fits the work into it: queries are searched
in chunks, the index (trained on a sample, then filled chunk by chunk) is split
into blocks whose results are merged when a side's index does not fit, and the
[n, k] neighbour lists (`NeighbourLists`) go to a work folder on disk
(`spill_folder`: `mining-<pid>-<host>-*` in the work folder; a killed run's folder
is removed by the next run that spills there). What stays in memory per sentence
(averages, best pairs, the one-to-one matching) is counted against the budget,
and a budget too small for it is a ValueError before any work.
"""

import contextlib
import math
import os
import tempfile
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from lealla_tf.mining.run_folders import host_tag, remove_dead_leftovers

GIB = 2 ** 30
# Bytes a sentence that stay in memory whatever the budget: both averages and
# whether each neighbourhood is positive, the best pair of each direction, and the
# one-to-one matching's temporaries.
MATCHING_BYTES_PER_SENTENCE = 114
MIN_WORKING_BYTES = 32 * 2 ** 20
PQ_MIN_TRAINING = 256  # 8-bit product quantisation learns 256 centroids a sub-vector
# The reasons `invalid_rows` gives, as a message says them.
INVALID_REASONS = {"non_finite": "has a NaN or infinite value", "zero": "is all zeros"}


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """float32 copy with unit rows (zero rows stay zero)."""
    return _unit(np.array(x, dtype=np.float32))



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

    def chunks(self, size: int, start: int = 0, stop: int | None = None):
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


def invalid_rows(rows: Rows, chunk: int = 65_536) -> tuple[np.ndarray, np.ndarray]:
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

def _index_options(n: int, d: int, index_type: str, nlist: int | None = None,
                   nprobe: int = 16, pq_subquantizers: int | None = None,
                   train_size: int | None = None, seed: int = 0) -> dict:
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


def _trained_index(candidates: Rows, skip: np.ndarray | None, options: dict,
                   sample_rows: int | None, seed: int, chunk: int):
    """An empty faiss inner-product index, trained on a sample of the valid candidates."""
    import faiss  # noqa: PLC0415 - heavy: loads only when an index is built or searched

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


def build_index(vectors, index_type: str = "flat", nlist: int | None = None,
                nprobe: int = 16, pq_subquantizers: int | None = None, seed: int = 0,
                chunk_size: int = 65_536, train_size: int | None = None):
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


def _fill(index, rows: Rows, skip: np.ndarray | None, start: int, stop: int,
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

class NeighbourLists:
    """Each query's k nearest candidates: [n, k] similarities (clipped to
    [-1, 1]; -inf where none) and ids (-1 where none), in memory or in two files
    that are read and written a row range at a time."""

    def __init__(self, n: int, k: int, directory: str | None = None, name: str = ""):
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

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
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

    def averages(self, chunk: int) -> tuple[np.ndarray, np.ndarray]:
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


class MiningPlan(NamedTuple):
    """How `plan_mining` fits the work into a memory budget."""

    query_rows: int  # queries searched (and candidates added) at once
    block_rows: int | None  # candidates indexed at once (None: a whole side)
    sample_rows: int | None  # cap on the index's training sample
    spill: bool  # neighbour lists on disk


def plan_mining(n_source: int, n_target: int, d: int, k: int, index_type: str = "flat",
                memory_budget_gb: float | None = None, chunk_size: int = 65_536,
                **index_options) -> MiningPlan:
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
        return MiningPlan(chunk_size, None, None, spill=False)
    if not (memory_budget_gb > 0 and math.isfinite(memory_budget_gb)):
        # inf would plan 1-row blocks: an index a row, quadratic in the rows
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
    return MiningPlan(query_rows, block_rows, sample_rows, spill=True)


def search_neighbours(queries: Rows, candidates: Rows, k: int, plan: MiningPlan,
                      result: NeighbourLists, skip_queries: np.ndarray | None = None,
                      skip_candidates: np.ndarray | None = None, index_type: str = "flat",
                      seed: int = 0, index=None, **index_options) -> None:
    """Fills `result` with the k nearest valid candidates of every query.

    The index is trained once on a sample; when a side does not fit the plan's
    block, each block of candidates is indexed in turn, every query chunk is
    searched against it, and the results are merged.
    """
    import faiss  # noqa: PLC0415 - heavy: loads only when an index is built or searched

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
def spill_folder(work_dir: str | None):
    """A fresh folder for spilled neighbour lists in `work_dir` (default: the
    temporary folder), named by this process and host and removed after use;
    the folders of killed runs found there (their process gone) go first."""
    remove_dead_leftovers(work_dir or tempfile.gettempdir(), SPILL_FOLDER)
    with tempfile.TemporaryDirectory(prefix=f"mining-{os.getpid()}-{host_tag()}-",
                                     dir=work_dir) as directory:
        yield directory


def knn(queries, candidates, k: int, index_type: str = "flat", chunk_size: int = 65_536,
        index=None, memory_budget_gb: float | None = None,
        **index_options) -> tuple[np.ndarray, np.ndarray]:
    """k nearest candidates of each query by cosine: (similarities, indices).

    Rows are normalised chunk by chunk; queries are searched `chunk_size` at a
    time (or as `memory_budget_gb` allows). Where an inverted-list index finds
    fewer than k neighbours the index is -1 and the similarity -inf.
    """
    queries, candidates = Rows.of(queries, "queries"), Rows.of(candidates, "candidates")
    k = min(k, candidates.rows if index is None else index.ntotal)
    plan = MiningPlan(chunk_size, None, None, False)
    if index is None and memory_budget_gb is not None:
        plan = plan_mining(queries.rows, candidates.rows, candidates.dim, k, index_type,
                           memory_budget_gb, chunk_size, **index_options)._replace(spill=False)
    result = NeighbourLists(queries.rows, k)
    search_neighbours(queries, candidates, k, plan, result, index_type=index_type, index=index,
                      **index_options)
    return result.read(0, queries.rows)

