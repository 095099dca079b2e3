r"""Mine parallel sentences between two languages' embedding shards.

    python beam_pipelines/mine_bitext.py --source=runs/emb_deu --target=runs/emb_eng \
        --output=runs/mined_deu_eng.tsv [--margin=ratio --retrieval=max --k=4 \
        --threshold=1.05 --index=flat|ivf|ivfpq --nlist=N --nprobe=N \
        --memory_budget_gb=4 --cache_dir=DIR]

--source / --target are `beam_pipelines/embed_corpus.py` outputs (ids, vectors and
sentences). Their shards are read memory-mapped: each gzip'd shard is converted
once, streaming, into a raw copy beside it (or under --cache_dir, needed for remote
outputs), which later runs reuse while it matches the shard (sizes and checksums;
a damaged copy is rebuilt). Mining runs `lealla_tf.mining.margins.mine` (faiss kNN,
margin scoring with k neighbours both ways, vectorised); --memory_budget_gb bounds
its memory whatever the corpus size: the index is trained on a sample and filled
chunk by chunk (in blocks when a side does not fit), queries are searched in
chunks, and neighbour lists go to disk (--cache_dir, or the system's temporary
folder; a killed run's lists are removed by the next run).

Scores (--margin): `ratio` is Artetxe & Schwenk's (2019) ratio margin, as LASER
and stopes compute it: cos(x, y) / ((mean cos of x's k nearest + mean cos of y's
k nearest) / 2), how many times more similar the pair is than the two sentences'
typical near neighbours (1.0: no better than a neighbour). Their thresholds
carry over: about 1.04-1.06 for BUCC-style mining; start at --threshold=1.05,
raise it for precision, or choose it on gold pairs (`mining.best_threshold`).
A sentence with a cosine <= 0 among its k nearest has no defined ratio (tiny
sides, k >= the candidates, unrelated sentences): its candidates are left out
and counted in the summary. `ratio_shifted` is the ratio of shifted cosines,
(1 + cos) / (1 + mean), always defined (in [0, 2k]) but on another scale: a
LASER threshold t at neighbourhood mean m is (1 + t m) / (1 + m) there.
`distance` is cos - mean, `absolute` the cosine.

Outputs, each written atomically:
  --output                     score<TAB>source<TAB>target (plus the ids with
                               --with_ids), best first;
  <output>.dead_letter.jsonl   embeddings that cannot be mined (a NaN or infinite
                               value, or all zeros): side, id and reason a line;
  <output>.summary.json        the counts.
A run holds <output>.lock while it writes: a second run into the same --output is
refused. An --output that is a folder, and a --source or --target whose
MANIFEST.json is damaged, are refused (naming it) before anything is written.
Beam carries the step, so the same command runs on any runner.

The command line prints each step as it finishes (the shards mapped, each
search, the scoring, the matching, the pairs written) and ends with a summary:
the sentences read, the pairs mined, the embeddings dead-lettered and where
each output is.
"""

import argparse
import contextlib
import json
import logging
import math
import os
import re
import sys
import time

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.pipelines.options import parse_pipeline_flags

DEAD_LETTER_SUFFIX, SUMMARY_SUFFIX = ".dead_letter.jsonl", ".summary.json"
LOCK_SUFFIX = ".lock"
MARGINS = ("absolute", "distance", "ratio", "ratio_shifted")
WRITE_BATCH = 65_536
log = logging.getLogger(__name__)
# The loggers whose INFO lines are the command line's progress.
PROGRESS_LOGGERS = (__name__, "lealla_tf.mining.margins")


def _index_options(nlist, nprobe) -> dict:
    return {name: value for name, value in (("nlist", nlist), ("nprobe", nprobe))
            if value is not None}


def mine_to_files(source_dir: str, target_dir: str, output: str, margin: str = "ratio",
                  retrieval: str = "max", k: int = 4, threshold=None, index: str = "flat",
                  with_ids: bool = False, memory_budget_gb=None, cache_dir=None, nlist=None,
                  nprobe=None) -> dict:
    """Mines two embed_corpus outputs into `output` (and its dead-letter and
    summary files); returns the summary. Rows that cannot be mined are
    dead-lettered with their reason, not mined and not fatal."""
    from lealla_tf.mining.margins import Rows, mine
    from lealla_tf.mining.shards import mmap_embeddings, write_atomically

    sides = {"source": mmap_embeddings(source_dir, cache_dir),
             "target": mmap_embeddings(target_dir, cache_dir)}
    log.info("mining %s source x %s target sentences",
             f"{sides['source'].rows:,}", f"{sides['target'].rows:,}")
    mined = mine(Rows(sides["source"].parts, "--source"), Rows(sides["target"].parts, "--target"),
                 k=k, margin=margin, retrieval=retrieval, threshold=threshold, index_type=index,
                 memory_budget_gb=memory_budget_gb, work_dir=cache_dir, skip_invalid=True,
                 **_index_options(nlist, nprobe))

    def write_pairs(handle):
        for start in range(0, len(mined["score"]), WRITE_BATCH):
            rows = slice(start, start + WRITE_BATCH)
            columns = [[f"{score:.6f}" for score in mined["score"][rows].tolist()],
                       sides["source"].texts(mined["source"][rows]),
                       sides["target"].texts(mined["target"][rows])]
            if with_ids:
                columns += [sides["source"].ids(mined["source"][rows]),
                            sides["target"].ids(mined["target"][rows])]
            handle.write("".join("\t".join(fields) + "\n" for fields in zip(*columns)).encode(
                "utf-8"))

    dead = []
    for side, directory in (("source", source_dir), ("target", target_dir)):
        indices = mined[f"invalid_{side}"]
        for identifier, reason in zip(sides[side].ids(indices), mined[f"invalid_{side}_reason"]):
            dead.append(json.dumps({"side": side, "directory": directory, "id": identifier,
                                    "reason": reason}, ensure_ascii=False))
    log.info("writing %s pairs to %s", f"{len(mined['score']):,}", output)
    write_atomically(output, write_pairs)
    write_atomically(output + DEAD_LETTER_SUFFIX,
                     lambda handle: handle.write("".join(f"{line}\n" for line in dead).encode(
                         "utf-8")))
    summary = {"pairs": int(len(mined["score"])), "dead_lettered": len(dead),
               "source_rows": sides["source"].rows, "target_rows": sides["target"].rows}
    if mined["degenerate_source"].size or mined["degenerate_target"].size:
        summary["undefined_ratio"] = {  # see the module docstring
            "source_sentences": int(mined["degenerate_source"].size),
            "target_sentences": int(mined["degenerate_target"].size),
            "candidates": int(mined["degenerate_candidates"])}
    write_atomically(output + SUMMARY_SUFFIX,
                     lambda handle: handle.write(json.dumps(summary, indent=2).encode("utf-8")))
    return summary


def check_inputs(source: str, target: str, k: int, index: str, memory_budget_gb, cache_dir,
                 nlist, nprobe, threshold=None) -> None:
    """Every mistake a user can make, found before the pipeline starts: a
    one-line ValueError / FileNotFoundError naming the flag. Converts the
    shards to their memory-mapped copies (reused by the mining step)."""
    from lealla_tf.mining.margins import plan_mining
    from lealla_tf.mining.shards import mmap_embeddings

    if k < 1:
        raise ValueError(f"--k must be at least 1, got {k}")
    if threshold is not None and not math.isfinite(threshold):
        raise ValueError(f"--threshold must be a finite number, got {threshold}")
    if memory_budget_gb is not None and not (math.isfinite(memory_budget_gb)
                                             and memory_budget_gb > 0):
        raise ValueError(f"--memory_budget_gb must be a positive number of GiB, got "
                         f"{memory_budget_gb}")
    sides = {}
    for flag, directory in (("--source", source), ("--target", target)):
        started = time.time()
        sides[flag] = mmap_embeddings(directory, cache_dir)
        log.info("%s=%s: %s sentences, memory-mapped in %.1f s", flag, directory,
                 f"{sides[flag].rows:,}", time.time() - started)
        if sides[flag].rows == 0:
            raise ValueError(f"{flag}={directory} has no embeddings to mine: its embed_corpus run "
                             "embedded no line (see its dead_letter.jsonl)")
        if sides[flag].dim is None:
            raise ValueError(f"{flag}={directory} mixes embeddings of different dimensions")
    if sides["--source"].dim != sides["--target"].dim:
        raise ValueError(f"--source and --target embeddings differ in dimension "
                         f"({sides['--source'].dim} vs {sides['--target'].dim}): embed both "
                         "with the same model")
    # Index settings and the memory budget (its messages name nlist, nprobe, memory_budget_gb).
    plan_mining(sides["--source"].rows, sides["--target"].rows, sides["--source"].dim, k, index,
                memory_budget_gb, **_index_options(nlist, nprobe))


def check_output(output: str) -> None:
    """A one-line ValueError naming --output when a local `output` cannot be
    written as a file: it (or one of the files written beside it) is a folder,
    or it lies below a file."""
    from lealla_tf.mining.shards import file_in_the_way

    if "://" in output:
        return
    if os.path.isdir(output):
        raise ValueError(f"--output={output} is a folder: mine_bitext writes a TSV file (with "
                         f"{SUMMARY_SUFFIX} and {DEAD_LETTER_SUFFIX} beside it); pass a file's "
                         f"path, e.g. --output={os.path.join(output, 'mined.tsv')}")
    for companion in (DEAD_LETTER_SUFFIX, SUMMARY_SUFFIX, LOCK_SUFFIX):
        if os.path.isdir(output + companion):
            raise ValueError(f"--output={output}: {output + companion}, which a run writes "
                             "beside it, is a folder; pass another --output")
    blocking = file_in_the_way(output)
    if blocking is not None:
        raise ValueError(f"--output={output} cannot be written: {blocking} is a file, "
                         "not a folder")


class MineDirectories(beam.DoFn):
    """(source dir, target dir) -> the summary of `mine_to_files`."""

    def __init__(self, output: str, options: dict):
        self._output, self._options = output, options

    def process(self, directories):
        yield mine_to_files(*directories, self._output, **self._options)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="beam_pipelines/mine_bitext.py", description=__doc__,
                            epilog="reading the mined pairs in Python:\n  "
                                   + reading_example("runs/mined_deu_eng.tsv"),
                            formatter_class=HelpFormatter)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--output", required=True, help="TSV file to write")
    parser.add_argument("--margin", default="ratio", choices=MARGINS,
                        help="ratio: Artetxe & Schwenk's ratio margin, LASER's score "
                             "(default; see above)")
    parser.add_argument("--retrieval", default="max", choices=("fwd", "bwd", "intersect", "max"))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=None,
                        help="keep pairs scoring at least this (default: all). With "
                             "--margin=ratio, how many times more similar a pair must be "
                             "than its sentences' k nearest neighbours on average: about "
                             "1.04-1.06 as in LASER's BUCC mining; 1.05 is a good start")
    parser.add_argument("--index", default="flat", choices=("flat", "ivf", "ivfpq"))
    parser.add_argument("--nlist", type=int, default=None,
                        help="ivf/ivfpq: inverted lists (default ~4 sqrt(n))")
    parser.add_argument("--nprobe", type=int, default=None,
                        help="ivf/ivfpq: lists searched a query (default 16)")
    parser.add_argument("--memory_budget_gb", type=float, default=None,
                        help="bound the mining's memory (default: hold what the inputs need)")
    parser.add_argument("--cache_dir", default=None,
                        help="local folder for the memory-mapped shard copies and spilled "
                             "neighbour lists (default: beside the shards / the temp folder)")
    parser.add_argument("--with_ids", action="store_true")
    return parser


def mine_bitext(source: str, target: str, output: str, margin: str = "ratio",
                retrieval: str = "max", k: int = 4, threshold=None, index: str = "flat",
                with_ids: bool = False, pipeline_args=(), test_pipeline=None,
                memory_budget_gb=None, cache_dir=None, nlist=None, nprobe=None) -> int:
    """Mines `source` against `target` (embed_corpus outputs) into the TSV `output`;
    returns the number of pairs written."""
    from lealla_tf.pipelines.options import pipeline_options, run_pipeline

    check_output(output)  # before anything is written, the shards' copies included
    check_inputs(source, target, k, index, memory_budget_gb, cache_dir, nlist, nprobe, threshold)
    options = pipeline_options(pipeline_args, default_runner=test_pipeline is None)
    with output_file_lock(output):
        pipeline = test_pipeline or beam.Pipeline(options=options)
        (pipeline
         | "Directories" >> beam.Create([(source, target)])
         | "Mine" >> beam.ParDo(MineDirectories(output, dict(
             margin=margin, retrieval=retrieval, k=k, threshold=threshold, index=index,
             with_ids=with_ids, memory_budget_gb=memory_budget_gb, cache_dir=cache_dir,
             nlist=nlist, nprobe=nprobe))))
        run_pipeline(pipeline)
        with FileSystems.open(output + SUMMARY_SUFFIX) as handle:
            summary = json.loads(handle.read().decode("utf-8"))
    undefined = summary.get("undefined_ratio")
    if undefined:
        logging.warning(
            "--margin=ratio: %d source and %d target sentences have a cosine <= 0 among their "
            "--k=%d nearest neighbours, so no ratio is defined for them; their %d candidates "
            "were left out (see %s)", undefined["source_sentences"],
            undefined["target_sentences"], k, undefined["candidates"], output + SUMMARY_SUFFIX)
    return int(summary["pairs"])


@contextlib.contextmanager
def output_file_lock(output: str):
    """Holds `<output>.lock` (embed_corpus's lock, `lealla_tf.mining.shards.output_lock`) while
    a run writes `output` and its companion files: a second run into the same
    --output is refused (OutputLockedError). Holding it, the temporary files that
    killed runs left beside `output` are removed. Remote outputs are not locked."""
    from lealla_tf.mining.shards import output_lock, remove_dead_leftovers

    folder, name = os.path.split(output)
    folder = folder or "."
    if "://" not in output:
        os.makedirs(folder, exist_ok=True)
    with output_lock(folder, name + LOCK_SUFFIX, subject=f"--output={output}"):
        if "://" not in output:  # write_atomically's "<file>.tmp-<pid>-<8 hex>"
            remove_dead_leftovers(folder, re.escape(name) + "(?:" + "|".join(
                re.escape(suffix) for suffix in (DEAD_LETTER_SUFFIX, SUMMARY_SUFFIX))
                + r")?\.tmp-(?P<pid>\d+)-[0-9a-f]{8}")
        yield


def run(argv=None, test_pipeline=None) -> int:
    """Parses flags (Beam's own pass through) and calls `mine_bitext`."""
    known, pipeline_args = parse_pipeline_flags(build_parser(), argv)
    return mine_bitext(known.source, known.target, known.output, known.margin, known.retrieval,
                       known.k, known.threshold, known.index, known.with_ids, pipeline_args,
                       test_pipeline, known.memory_budget_gb, known.cache_dir, known.nlist,
                       known.nprobe)


def reading_example(output: str) -> str:
    """A Python line that reads a mined TSV."""
    return (f"rows = [line.rstrip('\\n').split('\\t') for line in open({output!r}, "
            "encoding='utf-8')]  # [score, source, target]")


def format_summary(summary: dict, output: str, with_ids: bool = False,
                   seconds=None) -> str:
    """The command line's closing summary: sentences read, pairs mined,
    embeddings dead-lettered, where each output is and how to read it."""
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    lines = [f"mine_bitext: {summary['pairs']:,} pairs mined from {summary['source_rows']:,} "
             f"source x {summary['target_rows']:,} target sentences{took}",
             f"  dead-lettered  {summary['dead_lettered']:,} embeddings (NaN, infinite or "
             f"zero) -> {output + DEAD_LETTER_SUFFIX}"]
    undefined = summary.get("undefined_ratio")
    if undefined:
        lines.append(f"  no ratio       {undefined['source_sentences']:,} source and "
                     f"{undefined['target_sentences']:,} target sentences (a cosine <= 0 among "
                     f"their k nearest): {undefined['candidates']:,} candidates left out")
    columns = "score, source, target" + (", source id, target id" if with_ids else "")
    lines += [f"  output         {output} (TSV: {columns}; best first)",
              f"  counts         {output + SUMMARY_SUFFIX}",
              "read it in Python:", f"  {reading_example(output)}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    """The command line: its steps on stderr as they finish, the summary on stdout."""
    from lealla_tf.mining.shards import OutputLockedError
    from lealla_tf.progress import logged_progress, worker_output_filtered

    logging.getLogger().setLevel(logging.WARNING)
    known = parse_pipeline_flags(build_parser(), argv)[0]
    started = time.time()
    try:
        with worker_output_filtered(), logged_progress(*PROGRESS_LOGGERS,
                                                       prefix="mine_bitext: "):
            run(argv)
    except (FileNotFoundError, ValueError, OutputLockedError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with FileSystems.open(known.output + SUMMARY_SUFFIX) as handle:
        summary = json.loads(handle.read().decode("utf-8"))
    print(format_summary(summary, known.output, known.with_ids, time.time() - started))
    return 0
