"""The Beam steps of `lealla_tf.pipelines.embed_corpus`, and the progress files they write for
the command line's display.

Steps emit (kind, value) pairs that `of_kind` splits, where Beam would use tagged outputs: the
DaskRunner's ParDo passes tagged outputs on as main outputs. Every step that writes a file
writes it atomically (`write_atomically`), so a retried task replaces its file. A worker process
loads each model once (`_embedder`), whatever the runner does with DoFn instances.
"""

import itertools
import json
import logging
import os
import threading
import time
import zlib
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from lealla_tf.inference.loaders import load_embedder
from lealla_tf.pipelines.beam_files import write_atomically, write_gzip_tfrecords
from lealla_tf.pipelines.worker_threads import dask_worker_threads, limit_threads, quick_exit
from lealla_tf.records import embedding_example, pair_example

NAMESPACE = "embed_corpus"
COUNTERS = ("lines_read", "embedded", "dead_lettered")
RUN_SUMMARY = "RUN_SUMMARY.json"
DEAD_LETTER_FILE = "dead_letter.jsonl"
# Progress of a local run: each read's lines read and each shard's sentences
# embedded so far, one small file each, in the run folder (removed before the
# run commits); the command line's progress bar reads them.
PROGRESS_FOLDER = ".progress"
READ_REPORT_LINES = 100_000  # lines read between two reports of a file
SHARD_CHUNK = 8192  # sentences a shard embeds between two reports

# One loaded model per worker process, whatever the runner does with DoFn instances
# (the DaskRunner sets a DoFn up again for every bundle). A key's own lock in `_LOADS`
# makes a load started ahead (`warm_embedder`) and a shard's wait for it one load;
# `_STATE`, never held through a load, lets a bundle's setup return meanwhile.
_MODELS: dict[tuple, Any] = {}
_LOADS: dict[tuple, threading.Lock] = {}
_STATE = threading.Lock()
_WARMING: set = set()


def _embedder(model: str, max_seq_length: int | None = None, threads: int | None = None):
    """This worker's one `load_embedder(model, max_seq_length)`, on `threads` TensorFlow
    threads (0: TensorFlow's default; None: `dask_worker_threads`' share, or the default);
    the process then exits without collecting (`quick_exit`)."""
    key = (model, max_seq_length)
    with _STATE:
        load = _LOADS.setdefault(key, threading.Lock())
    with load:  # a caller that waited finds the model loaded
        if key not in _MODELS:
            threads = dask_worker_threads() if threads is None else threads
            if threads:
                limit_threads(threads)
            _MODELS[key] = load_embedder(model, max_seq_length)
            quick_exit()
    return _MODELS[key]


def warm_embedder(model: str, max_seq_length: int | None = None,
                  threads: int | None = None) -> threading.Thread | None:
    """Starts loading this worker's model in a background thread, once a process: the shards'
    step comes after a shuffle of every line, and a load started while the lines are read and
    parsed is done by then instead of delaying each worker's first shard. A load that fails here
    is retried (and its error raised) by the shard that needs the model. Returns the thread, or
    None where the model is loaded or loading already."""
    key = (model, max_seq_length)
    with _STATE:
        if key in _MODELS or key in _WARMING:
            return None
        _WARMING.add(key)
    # The dask worker is known to this task's thread only.
    threads = dask_worker_threads() if threads is None else threads

    def load():
        try:
            _embedder(model, max_seq_length, threads)
        except Exception as error:  # the shard's own load reports it
            logging.warning("embed_corpus: loading %s ahead failed (%s); the first shard "
                            "loads it again", model, error)

    thread = threading.Thread(target=load, name="warm_embedder", daemon=True)
    thread.start()
    return thread


def _report(progress_dir: str | None, name: str, value: str) -> None:
    """Replaces `progress_dir/name` with `value` (best effort: progress never fails a run)."""
    if progress_dir is None:
        return
    path = os.path.join(progress_dir, name)
    temporary = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        os.makedirs(progress_dir, exist_ok=True)
        with open(temporary, "w") as handle:
            handle.write(value)
        os.replace(temporary, path)
    except OSError:
        pass


def read_progress(progress_dir: str) -> dict[str, int]:
    """What a run's progress files say: files_read (completely), lines_read
    (so far) and embedded (so far)."""
    state = {"files_read": 0, "lines_read": 0, "embedded": 0}
    try:
        names = os.listdir(progress_dir)
    except OSError:
        return state
    done: dict[str, list] = {}  # a file's parts done, and how many it has
    for name in names:
        if ".tmp-" in name:
            continue
        try:
            with open(os.path.join(progress_dir, name)) as handle:
                fields = handle.read().split()
            count = int(fields[0])
            parts = int(fields[2]) if fields[1:2] == ["done"] else 0
        except (OSError, ValueError, IndexError):
            continue
        if name.startswith("read-"):
            state["lines_read"] += count
            if parts:
                done.setdefault(name.rsplit("-", 1)[0], [0, parts])[0] += 1
        elif name.startswith("embedded-"):
            state["embedded"] += count
    state["files_read"] = sum(1 for parts_done, parts in done.values() if parts_done >= parts)
    return state


# The kinds of the (kind, value) pairs the steps emit.
VALID, DEAD, COUNT = "valid", "dead", "count"
# An event of the run summary: (stage, start, end), wall-clock seconds of one
# task's stretch of work: "read" (a read's lines parsed, with the steps
# a runner fuses into the read; the worker's model loads meanwhile, started by
# the read's setup), and a shard's "model" (waiting for its worker's model to
# finish loading), "embed" and "write".
TIMING = "timing"
TIMED_STAGES = ("read", "model", "embed", "write")


def of_kind(kind):
    """A FlatMap function that passes on the values of the (kind, value) pairs
    of `kind` (Beam's tagged outputs, as every runner carries them)."""

    def select(element):
        if element[0] == kind:
            yield element[1]

    return select


class ReadLines(beam.DoFn):
    """(file path, part, parts) -> each line of that part of the file parsed where it is read
    (`parse_line`): (VALID, ((shard key), record)) ready for the shards' GroupByKey, or (DEAD, a
    JSON line); then (COUNT, ("lines_read", lines)), (COUNT, ("dead_lettered", n)) and the
    read's (COUNT, (TIMING, ...)). Part p of `parts` is every line whose 0-based index is p
    modulo `parts` (each part reads the whole file): the DaskRunner keeps one task per read and
    needs more reads than files to share them out (`dask_partitions.dask_reads`).

    One step reads, parses and keys each line: every further step a line passes through costs
    each runner a call per line, and the shards' GroupByKey spreads the work over the workers.
    Its setup starts loading the worker's model (`warm_embedder`; `warm`: (model,
    max_seq_length, threads), or None).

    A record's key is (prefix, shard): ("embeddings", shard of its id), or for pairs (the file's
    name, shard of "file:line"), extended by `spread` where given
    (`dask_partitions.spread_keys`); its value is (id, text, "file:line") for sentences,
    ("<line, 12 digits>", pair dict) for pairs. The file's name in ids is `file_name`'s, so two
    files called deu.txt in different folders give different ids.
    """

    def __init__(self, root: str = "", progress_dir: str | None = None,
                 warm: tuple | None = None, input_format: str = "lines", num_shards: int = 1,
                 spread: dict | None = None):
        self._root = root
        self._progress_dir = progress_dir
        self._warm = warm
        self._format = input_format
        self._num_shards = num_shards
        self._spread = spread or {}

    def setup(self):
        if self._warm is not None:
            warm_embedder(*self._warm)

    def process(self, element):
        path, part, parts = element
        start = time.time()
        lines_read = beam.metrics.Metrics.counter(NAMESPACE, "lines_read")
        dead_lettered = beam.metrics.Metrics.counter(NAMESPACE, "dead_lettered")
        name = file_name(path, self._root)
        report = f"read-{zlib.crc32(path.encode('utf-8')):08x}-{part}"
        own = dead = 0
        with FileSystems.open(path) as handle:
            # Beam's CompressedFile has readline() but is not iterable.
            for number, line in enumerate(iter(handle.readline, b""), start=1):
                if (number - 1) % parts != part:
                    continue
                own += 1
                lines_read.inc()
                if own % READ_REPORT_LINES == 0:
                    _report(self._progress_dir, report, str(own))
                kind, record = parse_line(self._format, name, number,
                                          line.rstrip(b"\n").rstrip(b"\r"))
                if kind == DEAD:
                    dead += 1
                    dead_lettered.inc()
                    yield DEAD, record
                else:
                    yield VALID, self._keyed(record)
        _report(self._progress_dir, report, f"{own} done {parts}")
        yield COUNT, ("lines_read", own)
        yield COUNT, ("dead_lettered", dead)
        yield COUNT, (TIMING, ("read", start, time.time()))

    def _keyed(self, record):
        if self._format == "pairs":
            key = (pair_destination(record["file"]),
                   shard_of(f"{record['file']}:{record['line']}", self._num_shards))
            return self._spread.get(key, key), (f"{record['line']:012d}", record)
        key = ("embeddings", shard_of(record[0], self._num_shards))
        return self._spread.get(key, key), record


def parse_line(input_format: str, path: str, number: int, raw: bytes):
    """Decodes and validates line `number` of `path`: (VALID, record), or (DEAD,
    a JSON line with the reason) for the dead letters. A sentence's record is
    (id, text, "file:line"), a pair's a dict ("pairs")."""
    reason = None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text, reason = None, "invalid_utf8"
    if reason is None:
        if input_format == "lines":
            if not text.strip():
                reason = "empty"
            else:
                return VALID, (f"{path}:{number}", text, f"{path}:{number}")
        else:
            left, tab, right = text.partition("\t")
            if not tab:
                reason = "no_tab"
            elif not left.strip() or not right.strip():
                reason = "empty_field"
            elif input_format == "tsv":
                return VALID, (left, right, f"{path}:{number}")
            else:
                return VALID, {"file": path, "line": number, "source": left, "target": right}
    return DEAD, json.dumps({"file": path, "line": number, "reason": reason,
                             "raw": raw.decode("utf-8", "backslashreplace")},
                            ensure_ascii=False)


def file_name(path: str, root: str) -> str:
    """A file's name in ids and shard keys: relative to `root`, else its base name."""
    return os.path.relpath(path, root) if root else os.path.basename(path)


def pair_destination(path: str) -> str:
    """Shard prefix for pairs read from `path`: the file's name without extensions."""
    name = os.path.basename(path)
    for suffix in (".gz", ".bz2", ".tsv", ".txt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def shard_of(identifier: str, num_shards: int) -> int:
    """A stable shard of an id (the same on every worker and every retry)."""
    return zlib.crc32(identifier.encode("utf-8")) % num_shards


DUPLICATE_EXAMPLES = 5  # duplicated ids the run summary (and the error) names
DUPLICATE_PLACES = 3  # places ("file:line") named for each


def shard_duplicates(items):
    """("duplicate_ids", 1) and ("duplicate_example", (id, count, its first
    `DUPLICATE_PLACES` "file:line" places)) for each id that occurs more than
    once among a shard's (id, text, place) `items`, sorted by id: ids are
    sharded by id, so all of an id's occurrences meet in one shard."""
    counter = beam.metrics.Metrics.counter(NAMESPACE, "duplicate_ids")
    for identifier, group in itertools.groupby(items, key=lambda item: item[0]):
        places = [item[2] for item in group]
        if len(places) > 1:
            counter.inc()
            yield "duplicate_ids", 1
            yield "duplicate_example", (identifier, len(places),
                                        sorted(places)[:DUPLICATE_PLACES])


def describe_duplicates(examples) -> str:
    """"'a' (2x: ids.tsv:1, ids.tsv:3), ..." for the run summary's duplicate examples."""
    return ", ".join(
        f"{identifier!r} ({count}x: {', '.join(places)}{', ...' if count > len(places) else ''})"
        for identifier, count, places in examples)


class EmbedShard(beam.DoFn):
    """(shard, sentences or pairs) -> one TFRecord shard file, embedded in
    length-sorted batches by the worker's one loaded model; a sentence shard's
    ids that occur more than once are reported (`shard_duplicates`).

    Batching happens here, on the whole shard, instead of in RunInference and
    BatchElements: those emit their last batch from finish_bundle, whose
    outputs the DaskRunner drops. The shard is sorted by length and embedded
    `SHARD_CHUNK` sentences a call (so each call's batches are as even as the
    whole shard's), its progress reported after each. Yields ("file", name),
    ("embedded", n), the shard's duplicate-id events and its `TIMING` events.
    """

    def __init__(self, model: str, run_dir: str, num_shards: int, pairs: bool,
                 english_only: bool, batch_size: int, max_seq_length: int | None = None,
                 max_tokens: int | None = None, threads: int | None = None,
                 progress_dir: str | None = None):
        self._model, self._run_dir, self._num_shards = model, run_dir, num_shards
        self._pairs, self._english_only, self._batch_size = pairs, english_only, batch_size
        self._max_seq_length, self._max_tokens = max_seq_length, max_tokens
        self._threads, self._progress_dir = threads, progress_dir

    def _encode(self, embedder, sides: dict[str, list], report: str) -> dict[str, np.ndarray]:
        """{side: sentences} -> {side: [n, d] rows}, in chunks of similar length
        (sorted by the first side's characters)."""
        first = next(iter(sides.values()))
        order = np.argsort([len(text) for text in first], kind="stable")
        vectors = {}
        for start in range(0, len(order), SHARD_CHUNK):
            rows = order[start:start + SHARD_CHUNK]
            for side, texts in sides.items():
                part = embedder.encode([texts[i] for i in rows], self._batch_size,
                                       max_tokens=self._max_tokens)
                if side not in vectors:
                    vectors[side] = np.empty((len(first), part.shape[1]), np.float32)
                vectors[side][rows] = part
            _report(self._progress_dir, report, str(start + len(rows)))
        return vectors

    def process(self, element):
        key, items = element
        prefix, shard = key[:2]  # a key may carry `spread_keys`' salt
        # A retry writes the same file: pairs by line, then file (two files of one
        # name in different folders share a prefix), sentences by id, then place.
        items = sorted(items, key=(lambda item: (item[0], item[1]["file"])) if self._pairs
                       else (lambda item: (item[0], item[2])))
        start = time.time()
        embedder = _embedder(self._model, self._max_seq_length, self._threads)
        loaded = time.time()
        name = f"{prefix}-{shard:05d}-of-{self._num_shards:05d}.tfrecord.gz"
        report = f"embedded-{name}"
        if self._pairs:
            sides = {"target": [p["target"] for _, p in items]}
            if not self._english_only:
                sides["source"] = [p["source"] for _, p in items]
            vectors = self._encode(embedder, sides, report)
            target, source = vectors["target"], vectors.get("source")
            records = [pair_example(p["source"], p["target"],
                                    None if source is None else source[i], target[i])
                       for i, (_, p) in enumerate(items)]
        else:
            yield from shard_duplicates(items)
            vectors = self._encode(embedder, {"text": [item[1] for item in items]},
                                   report)["text"]
            records = [embedding_example(key, vectors[i], text=text)
                       for i, (key, text, _) in enumerate(items)]
        embedded = time.time()
        write_atomically(FileSystems.join(self._run_dir, name),
                         lambda handle: write_gzip_tfrecords(handle, records))
        beam.metrics.Metrics.counter(NAMESPACE, "embedded").inc(len(records))
        yield "file", name
        yield "embedded", len(records)
        for stage, since, until in (("model", start, loaded), ("embed", loaded, embedded),
                                    ("write", embedded, time.time())):
            yield TIMING, (stage, since, until)


class WriteDeadLetters(beam.DoFn):
    """All dead-letter lines -> dead_letter.jsonl (sorted, written atomically)."""

    def __init__(self, run_dir: str):
        self._run_dir = run_dir

    def process(self, element):
        _, lines = element
        lines = sorted(lines)
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        write_atomically(FileSystems.join(self._run_dir, DEAD_LETTER_FILE),
                         lambda handle: handle.write(data))
        yield "file", DEAD_LETTER_FILE


class WriteRunSummary(beam.DoFn):
    """Writes what the run did (counts and files) into the run folder.

    The counts travel as data, not as Beam metrics, so every runner reports
    them (the DaskRunner has no metrics); and every branch of the pipeline
    ends here, so a runner that computes only the last transform's inputs
    (the DaskRunner does) still runs all of it.
    """

    def __init__(self, run_dir: str):
        self._run_dir = run_dir

    def process(self, element):
        _, items = element
        counts = {name: 0 for name in COUNTERS + ("duplicate_ids",)}
        files, duplicates, timings = [], [], []
        for kind, value in items:
            if kind == "file":
                files.append(value)
            elif kind == "duplicate_example":
                duplicates.append([value[0], int(value[1]), list(value[2])])
            elif kind == TIMING:
                timings.append(value)
            else:
                counts[kind] += value
        summary = {"counts": counts, "files": sorted(set(files)),
                   "duplicate_examples": sorted(duplicates)[:DUPLICATE_EXAMPLES],
                   "timings": stage_spans(timings)}
        data = json.dumps(summary, indent=2).encode("utf-8")
        write_atomically(FileSystems.join(self._run_dir, RUN_SUMMARY),
                         lambda handle: handle.write(data))
        yield summary


def stage_spans(timings) -> dict:
    """(stage, start, end) events -> {stage: {"start", "end", "busy"}}: the first
    start and the last end of the stage's tasks (wall-clock seconds) and the sum
    of their durations (more than end - start where tasks overlapped)."""
    spans = {}
    for stage, start, end in timings:
        span = spans.setdefault(stage, {"start": start, "end": end, "busy": 0.0})
        span["start"], span["end"] = min(span["start"], start), max(span["end"], end)
        span["busy"] += end - start
    return {stage: spans[stage] for stage in TIMED_STAGES if stage in spans}


def timeline(spans: dict, since: float) -> dict:
    """`stage_spans` as seconds after `since` (the pipeline's start), rounded to
    the millisecond: where a run's time went."""
    return {stage: {"from": round(span["start"] - since, 3), "to": round(span["end"] - since, 3),
                    "busy": round(span["busy"], 3)}
            for stage, span in spans.items()}
