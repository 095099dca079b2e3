"""Embed a corpus with any exported model, at scale, with Apache Beam: the library
call `embed_corpus(inputs, model, output)` (its command line is
`lealla_tf.cli.embed_corpus`).

Inputs are one sentence per line (`input_format="lines"`; id = file:line, the
file named relative to the inputs' common folder), TSV with an id column
(`"tsv"`: id<TAB>sentence; ids must be unique), or parallel pairs (`pairs`:
xx<TAB>en; both sides are embedded, as a multilingual teacher's targets
x^t = T(x), y^t = T(y), or only the English side with `english_only`). Plain or
compressed files, any Beam filesystem.

The model is loaded once per worker process, starting while the lines are read
(`corpus_steps.warm_embedder`); sentences are grouped into shards
by a stable hash of their id, and each shard is embedded in batches of similar
token length and written by one task (the steps: `lealla_tf.pipelines.corpus_steps`).
Lines that are not valid UTF-8, empty, or malformed go to a dead-letter file
with the reason; counts prove nothing is lost: lines read = embedded +
dead-lettered. MANIFEST.json's `timeline` says where the run's time went (its
stages' first start, last end and busy seconds after the pipeline started:
`corpus_steps.timeline`). The shards land in a fresh run folder and MANIFEST.json is
replaced only when the run is complete (`lealla_tf.mining.run_folders`), under
the output's lock (`lealla_tf.folder_lock`): rerunning into the same output is
safe, and a second run into an output that a live run holds is refused.

Without a --runner in `pipeline_args` it runs on Beam's FnApiRunner (the local
runner, without the Prism download DirectRunner would attempt); any portable
runner (Dataflow, Flink, Spark) and the DaskRunner run it unchanged (on the
DaskRunner the files are read in parts and the shards spread over its
partitions, `lealla_tf.pipelines.dask_partitions`; on a cluster it connects
to, each partition goes to one worker in turn,
`lealla_tf.pipelines.options.PartitionWorkers`, and every worker starts
loading the model before the run, `dask_partitions.warm_workers`).
"""

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from lealla_tf.folder_lock import one_writer
from lealla_tf.inference.batching import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS
from lealla_tf.inference.loaders import model_kind
from lealla_tf.mining.run_folders import commit_run, file_in_the_way, run_directory
from lealla_tf.pipelines.corpus_steps import (
    COUNT,
    COUNTERS,
    DEAD,
    PROGRESS_FOLDER,
    RUN_SUMMARY,
    TIMED_STAGES,
    VALID,
    EmbedShard,
    ReadLines,
    WriteDeadLetters,
    WriteRunSummary,
    describe_duplicates,
    of_kind,
    read_progress,
    timeline,
)
from lealla_tf.pipelines.dask_partitions import dask_reads, shard_keys, spread_keys, warm_workers
from lealla_tf.pipelines.options import on_dask_runner, pipeline_options, run_pipeline
from lealla_tf.pipelines.worker_threads import threads_per_worker
from lealla_tf.progress import PipelineProgress


def build_pipeline(pipeline, files: Sequence[str], model: str, run_dir: str,
                   input_format: str = "lines", pairs: bool = False, english_only: bool = False,
                   num_shards: int = 4, model_batch_size: int = PIPELINE_BATCH_SIZE,
                   max_seq_length: int | None = None,
                   model_max_tokens: int | None = PIPELINE_MAX_TOKENS,
                   threads: int | None = None, progress_dir: str | None = None):
    """Adds the embedding steps to `pipeline`; returns the run summary's PCollection.

    Lines are read, parsed (dead letters aside) and keyed to one of `num_shards`
    shards by a stable hash of their id (pairs: per input file) in one step;
    each shard is gathered, embedded, checked for duplicated ids and written by
    one task. Every branch (shards, dead letters, counts) flows into one final
    step that writes RUN_SUMMARY.json into `run_dir`. Only ParDo, GroupByKey,
    Flatten and Create are used, so the DaskRunner runs it as every other
    runner does (its partitions: `dask_partitions.dask_reads`).
    `progress_dir`: where the steps report their progress (see `read_progress`).
    """
    root = os.path.commonpath([os.path.dirname(f) for f in files]) if "://" not in files[0] else ""
    warm = (model, max_seq_length, threads)  # the model loads while lines are read
    reads, partitions = dask_reads(pipeline.options, files, num_shards)
    spread = (None if partitions is None
              else spread_keys(shard_keys(files, root, pairs, num_shards), partitions))
    read = (pipeline
            | "ListFiles" >> beam.Create(reads)
            | "ReadLines" >> beam.ParDo(ReadLines(root, progress_dir, warm,
                                                  "pairs" if pairs else input_format,
                                                  num_shards, spread)))
    events = [read | "Counts" >> beam.FlatMap(of_kind(COUNT)),
              (read
               | "DeadLetters" >> beam.FlatMap(of_kind(DEAD))
               | "DeadKey" >> beam.Map(lambda line: (None, line))
               | "GatherDead" >> beam.GroupByKey()
               | "WriteDeadLetters" >> beam.ParDo(WriteDeadLetters(run_dir))),
              (read
               | "Valid" >> beam.FlatMap(of_kind(VALID))
               | "GatherShards" >> beam.GroupByKey()
               | "EmbedShards" >> beam.ParDo(EmbedShard(
                   model, run_dir, num_shards, pairs, english_only, model_batch_size,
                   max_seq_length, model_max_tokens, threads, progress_dir)))]
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
                 test_pipeline=None, max_seq_length: int | None = None,
                 model_max_tokens: int | None = PIPELINE_MAX_TOKENS,
                 threads_per_worker_asked: int | None = None,
                 progress: bool = False) -> dict:
    """Embeds the files matching `inputs` into `output`; returns the committed manifest.

    `pipeline_args` are Beam's own flags (--runner=..., --direct_num_workers=...).
    `max_seq_length` truncates what the model embeds (see `load_embedder`).
    `threads_per_worker_asked`: TensorFlow threads of each worker's model (see
    `threads_per_worker`; None: shared out among a host's worker processes).
    `progress`: show the run's progress on stderr (`PipelineProgress`, fed
    by the steps' progress files; local outputs only).
    Raises FileNotFoundError / ValueError for bad arguments (an `output` that
    is a file, or below one, among them: before anything is written),
    RuntimeError when lines went missing or ids collide (naming a few duplicated ids and the
    "file:line" of each) or when another run holds a local `output` (the
    previous output is then untouched; remote outputs are not locked).
    """
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
    with one_writer(output, f"--output={output}"), run_directory(output) as run_dir:
        progress_dir = (os.path.join(run_dir, PROGRESS_FOLDER)
                        if progress and "://" not in run_dir else None)
        pipeline = test_pipeline or beam.Pipeline(options=options)
        workers = (warm_workers(pipeline.options, model, max_seq_length, threads)
                   if on_dask_runner(pipeline.options) else None)
        build_pipeline(pipeline, files, model, run_dir, input_format, pairs, english_only,
                       num_shards, model_batch_size, max_seq_length, model_max_tokens,
                       threads, progress_dir)
        poll = None if progress_dir is None else lambda: _progress_of(progress_dir)
        with PipelineProgress(poll, len(files), "pair" if pairs else "sentence") as shown:
            started = time.time()
            run_pipeline(pipeline, workers)
            seconds = time.time() - started
            summary_path = os.path.join(run_dir, RUN_SUMMARY)
            if not os.path.exists(summary_path):
                raise RuntimeError(f"the pipeline finished without writing {summary_path}")
            with open(summary_path) as f:
                summary = json.load(f)
            counts = {name: int(summary["counts"][name]) for name in COUNTERS}
            shown.finish(counts["lines_read"], counts["embedded"], counts["dead_lettered"])
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
                              inputs=files, pairs=pairs, english_only=english_only,
                              timeline={"seconds": round(seconds, 3), "stages": timeline(
                                  summary.get("timings", {}), started)})
    logging.info("embed_corpus: %s", counts)
    return manifest


def check_output(output: str) -> None:
    """A one-line ValueError naming --output when a local `output` cannot be
    the folder of a run: it is a file, or lies below one."""
    if "://" in output:
        return
    if os.path.lexists(output) and not os.path.isdir(output):
        raise ValueError(f"--output={output} is a file, not a folder: embed_corpus writes a "
                         "folder of shards and a MANIFEST.json; pass a folder's path")
    blocking = file_in_the_way(output)
    if blocking is not None:
        raise ValueError(f"--output={output} cannot be made: {blocking} is a file, not a folder")


def _progress_of(progress_dir: str):
    """(files read, lines read, sentences embedded) so far, for `PipelineProgress`."""
    state = read_progress(progress_dir)
    return state["files_read"], state["lines_read"], state["embedded"]


def describe_timeline(timeline: dict) -> str:
    """One line of where a run's time went, from its manifest's `timeline`:
    each stage's span after the pipeline started and its tasks' busy seconds."""
    stages = timeline["stages"]  # in the stages' order: a manifest's keys are sorted
    return f"{timeline['seconds']:.1f} s: " + "; ".join(
        f"{stage} {stages[stage]['from']:.1f}-{stages[stage]['to']:.1f} s "
        f"(busy {stages[stage]['busy']:.1f} s)" for stage in TIMED_STAGES if stage in stages)
