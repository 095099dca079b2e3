r"""`lealla-mine-bitext`: mine parallel sentences between two languages' embedding shards.

    lealla-mine-bitext --source=runs/emb_deu --target=runs/emb_eng \
        --output=runs/mined_deu_eng.tsv [--margin=ratio --retrieval=max --k=4 \
        --threshold=1.05 --index=flat|ivf|ivfpq --nlist=N --nprobe=N \
        --memory_budget_gb=4 --cache_dir=DIR]

--source / --target are `lealla-embed-corpus` outputs (ids, vectors and
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
raise it for precision, or choose it on gold pairs (`mining.margins.best_threshold`).
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
  <output>.with_tabs.jsonl     mined pairs a TSV row cannot hold (a tab or line
                               break in a sentence or id, CR and U+2028 among
                               them): rank, score, sentences and ids a line;
  <output>.summary.json        the counts.
A run holds <output>.lock while it writes (the emptied file stays): a second
run into the same --output is refused. An --output that is a folder, and a
--source or --target whose MANIFEST.json is damaged, are refused (naming it)
before anything is written. Beam carries the step, so the same command runs on
any runner.

The command line prints each step as it finishes (the shards mapped, each
search, the scoring, the matching, the pairs written) and ends with a summary:
the sentences read, the pairs mined, the embeddings dead-lettered and where
each output is. It runs `lealla_tf.pipelines.mine_bitext.mine_bitext`. Also `python -m
lealla_tf.cli.mine_bitext` and `python beam_pipelines/mine_bitext.py`.
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import argparse
import json
import logging
import sys
import time

from apache_beam.io.filesystems import FileSystems

# The pipeline loads TensorFlow (the shards are TFRecords): it is imported where
# it runs, so that --help and a bad flag answer before (tests/cli/test_scripts.py).
from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.folder_lock import FolderInUseError
from lealla_tf.mining.margins import Margin
from lealla_tf.pipelines.options import parse_pipeline_flags
from lealla_tf.progress import logged_progress, worker_output_filtered

MARGINS = tuple(margin.value for margin in Margin)
# The loggers whose INFO lines are the command line's progress.
PROGRESS_LOGGERS = ("lealla_tf.pipelines.mine_bitext", "lealla_tf.mining.margins")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="lealla-mine-bitext", description=__doc__,
                            epilog="reading the mined pairs in Python:\n" + "".join(
                                f"  {line}\n" for line in reading_example(
                                    "runs/mined_deu_eng.tsv").splitlines()),
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


def run(argv=None, test_pipeline=None) -> int:
    """Parses flags (Beam's own pass through) and calls `mine_bitext`."""
    known, pipeline_args = parse_pipeline_flags(build_parser(), argv)
    from lealla_tf.pipelines.mine_bitext import mine_bitext

    return mine_bitext(known.source, known.target, known.output, known.margin, known.retrieval,
                       known.k, known.threshold, known.index, known.with_ids, pipeline_args,
                       test_pipeline, known.memory_budget_gb, known.cache_dir, known.nlist,
                       known.nprobe)


def reading_example(output: str) -> str:
    """A Python line that reads a mined TSV, the file closed once read. No
    sentence or id in it holds a tab or any line break (those pairs are in the
    with-tabs file), so any reader, `open()`'s universal newlines and
    `str.splitlines` included, reads one row a pair."""
    return (f"with open({output!r}, encoding='utf-8') as f: rows = "
            "[line.rstrip('\\n').split('\\t') for line in f]  # [score, source, target]")


def format_summary(summary: dict, output: str, with_ids: bool = False,
                   seconds=None) -> str:
    """The command line's closing summary: sentences read, pairs mined,
    embeddings dead-lettered, where each output is and how to read it."""
    from lealla_tf.pipelines.mine_bitext import DEAD_LETTER_SUFFIX, SUMMARY_SUFFIX, WITH_TABS_SUFFIX

    took = f" in {seconds:.1f} s" if seconds is not None else ""
    lines = [f"mine_bitext: {summary['pairs']:,} pairs mined from {summary['source_rows']:,} "
             f"source x {summary['target_rows']:,} target sentences{took}",
             f"  dead-lettered  {summary['dead_lettered']:,} embeddings (NaN, infinite or "
             f"zero) -> {output + DEAD_LETTER_SUFFIX}"]
    if summary.get("pairs_with_tabs"):
        lines.append(f"  with tabs      {summary['pairs_with_tabs']:,} of the pairs (a tab or line "
                     f"break in a sentence or id) -> {output + WITH_TABS_SUFFIX}")
    undefined = summary.get("undefined_ratio")
    if undefined:
        lines.append(f"  no ratio       {undefined['source_sentences']:,} source and "
                     f"{undefined['target_sentences']:,} target sentences (a cosine <= 0 among "
                     f"their k nearest): {undefined['candidates']:,} candidates left out")
    columns = "score, source, target" + (", source id, target id" if with_ids else "")
    lines += [f"  output         {output} (TSV: {columns}; best first)",
              f"  counts         {output + SUMMARY_SUFFIX}",
              "read it in Python:"] + [f"  {line}" for line in reading_example(output).splitlines()]
    return "\n".join(lines)


def main(argv=None) -> int:
    """The command line: its steps on stderr as they finish, the summary on stdout."""
    logging.getLogger().setLevel(logging.WARNING)
    known = parse_pipeline_flags(build_parser(), argv)[0]
    started = time.time()
    try:
        with worker_output_filtered(), logged_progress(*PROGRESS_LOGGERS,
                                                       prefix="mine_bitext: "):
            run(argv)
    except (FileNotFoundError, ValueError, FolderInUseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from lealla_tf.pipelines.mine_bitext import SUMMARY_SUFFIX

    with FileSystems.open(known.output + SUMMARY_SUFFIX) as handle:
        summary = json.loads(handle.read().decode("utf-8"))
    print(format_summary(summary, known.output, known.with_ids, time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
