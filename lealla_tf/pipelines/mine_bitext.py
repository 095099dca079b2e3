"""Mine parallel sentences between two languages' embedding shards, with Apache
Beam: the library call `mine_bitext(source, target, output)` (its command line
is `lealla_tf.cli.mine_bitext`).

`source` / `target` are `embed_corpus` outputs (ids, vectors and sentences).
Their shards are read memory-mapped (`lealla_tf.mining.shards.mmap_embeddings`:
each gzip'd shard is converted once, streaming, into a raw copy beside it or
under `cache_dir`, which later runs reuse while it matches the shard), and
mined by `lealla_tf.mining.margins.mine` (faiss kNN, margin scoring with k
neighbours both ways); `memory_budget_gb` bounds its memory whatever the
corpus size, the neighbour lists then going to disk (`cache_dir`, or the
system's temporary folder).

Outputs, each written atomically:
  output                       score<TAB>source<TAB>target (plus the ids with
                               `with_ids`), best first;
  <output>.dead_letter.jsonl   embeddings that cannot be mined (a NaN or infinite
                               value, or all zeros): side, id and reason a line;
  <output>.with_tabs.jsonl     mined pairs a TSV row cannot hold (a tab or line
                               break in a sentence or id: any character
                               `str.splitlines` or universal newlines end a line
                               at, CR and U+2028 among them): rank, score,
                               sentences and ids a line, so that none is lost
                               and the TSV is one row a pair for any reader;
  <output>.summary.json        the counts.
A run holds the lock `<output>.lock` (`lealla_tf.folder_lock`) while it writes:
a second run into the same output is refused. An output that is a folder, and a
source or target whose MANIFEST.json is damaged, are refused (naming it) before
anything is written. Beam carries the step, so the same call runs on any runner.
"""

import contextlib
import json
import logging
import math
import os
import re
import time

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from lealla_tf.folder_lock import one_writer
from lealla_tf.mining.margins import mine
from lealla_tf.mining.neighbours import Rows, plan_mining
from lealla_tf.mining.run_folders import file_in_the_way, remove_dead_leftovers
from lealla_tf.mining.shards import mmap_embeddings
from lealla_tf.pipelines.beam_files import write_atomically
from lealla_tf.pipelines.options import pipeline_options, run_pipeline

DEAD_LETTER_SUFFIX, SUMMARY_SUFFIX = ".dead_letter.jsonl", ".summary.json"
WITH_TABS_SUFFIX = ".with_tabs.jsonl"
# What a TSV field cannot hold: the tab, and every line break of str.splitlines
# (which universal newlines' CR and CR LF are among); a reader would split the
# row at any of them.
NOT_IN_A_ROW = re.compile("[\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# The line breaks json.dumps(ensure_ascii=False) leaves raw in a string, escaped,
# so that the JSON-lines files too are one record a line for any reader.
RAW_IN_JSON = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
WRITTEN_BESIDE = (DEAD_LETTER_SUFFIX, WITH_TABS_SUFFIX, SUMMARY_SUFFIX)  # each atomically
LOCK_SUFFIX = ".lock"
WRITE_BATCH = 65_536
log = logging.getLogger(__name__)


def _index_options(nlist, nprobe) -> dict:
    return {name: value for name, value in (("nlist", nlist), ("nprobe", nprobe))
            if value is not None}


def mine_to_files(source_dir: str, target_dir: str, output: str, margin: str = "ratio",
                  retrieval: str = "max", k: int = 4, threshold=None, index: str = "flat",
                  with_ids: bool = False, memory_budget_gb=None, cache_dir=None, nlist=None,
                  nprobe=None) -> dict:
    """Mines two embed_corpus outputs into `output` (and its dead-letter,
    with-tabs and summary files); returns the summary. Rows that cannot be
    mined are dead-lettered with their reason, not mined and not fatal; a mined
    pair with a tab or line break (`NOT_IN_A_ROW`) in a sentence or id goes
    whole to the with-tabs file, not split across the TSV's columns or rows."""
    sides = {"source": mmap_embeddings(source_dir, cache_dir),
             "target": mmap_embeddings(target_dir, cache_dir)}
    log.info("mining %s source x %s target sentences",
             f"{sides['source'].rows:,}", f"{sides['target'].rows:,}")
    mined = mine(Rows(sides["source"].parts, "--source"), Rows(sides["target"].parts, "--target"),
                 k=k, margin=margin, retrieval=retrieval, threshold=threshold, index_type=index,
                 memory_budget_gb=memory_budget_gb, work_dir=cache_dir, skip_invalid=True,
                 **_index_options(nlist, nprobe))

    with_tabs = []

    def write_pairs(handle):
        for start in range(0, len(mined["score"]), WRITE_BATCH):
            rows = slice(start, start + WRITE_BATCH)
            columns = [[f"{score:.6f}" for score in mined["score"][rows].tolist()],
                       sides["source"].texts(mined["source"][rows]),
                       sides["target"].texts(mined["target"][rows])]
            if with_ids:
                columns += [sides["source"].ids(mined["source"][rows]),
                            sides["target"].ids(mined["target"][rows])]
            lines = []
            for rank, fields in enumerate(zip(*columns), start):
                if any(NOT_IN_A_ROW.search(field) for field in fields[1:]):
                    with_tabs.append(pair_record(rank, *fields[1:3]))
                else:
                    lines.append("\t".join(fields) + "\n")
            handle.write("".join(lines).encode("utf-8"))

    def pair_record(rank: int, source_text: str, target_text: str) -> str:
        """One pair a TSV row cannot hold, whole, as a JSON line (with its ids,
        whether or not the TSV has them)."""
        return json_line({"rank": rank, "score": float(mined["score"][rank]),
                          "source": source_text, "target": target_text,
                          "source_id": sides["source"].ids(mined["source"][rank:rank + 1])[0],
                          "target_id": sides["target"].ids(mined["target"][rank:rank + 1])[0]})

    dead = []
    for side, directory in (("source", source_dir), ("target", target_dir)):
        indices = mined[f"invalid_{side}"]
        for identifier, reason in zip(sides[side].ids(indices), mined[f"invalid_{side}_reason"]):
            dead.append(json_line({"side": side, "directory": directory, "id": identifier,
                                   "reason": reason}))
    log.info("writing %s pairs to %s", f"{len(mined['score']):,}", output)
    write_atomically(output, write_pairs)
    for suffix, lines in ((DEAD_LETTER_SUFFIX, dead), (WITH_TABS_SUFFIX, with_tabs)):
        write_atomically(output + suffix, lambda handle, lines=lines: handle.write(
            "".join(f"{line}\n" for line in lines).encode("utf-8")))
    summary = {"pairs": int(len(mined["score"])), "dead_lettered": len(dead),
               "pairs_with_tabs": len(with_tabs),
               "source_rows": sides["source"].rows, "target_rows": sides["target"].rows}
    if mined["degenerate_source"].size or mined["degenerate_target"].size:
        summary["undefined_ratio"] = {  # see the module docstring
            "source_sentences": int(mined["degenerate_source"].size),
            "target_sentences": int(mined["degenerate_target"].size),
            "candidates": int(mined["degenerate_candidates"])}
    write_atomically(output + SUMMARY_SUFFIX,
                     lambda handle: handle.write(json.dumps(summary, indent=2).encode("utf-8")))
    return summary


def json_line(record: dict) -> str:
    """`record` as one JSON line that no reader splits (`RAW_IN_JSON`)."""
    return json.dumps(record, ensure_ascii=False).translate(RAW_IN_JSON)


def check_inputs(source: str, target: str, k: int, index: str, memory_budget_gb, cache_dir,
                 nlist, nprobe, threshold=None) -> None:
    """Every mistake a user can make, found before the pipeline starts: a
    one-line ValueError / FileNotFoundError naming the flag. Converts the
    shards to their memory-mapped copies (reused by the mining step)."""
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
    if "://" in output:
        return
    if os.path.isdir(output):
        raise ValueError(f"--output={output} is a folder: mine_bitext writes a TSV file (with "
                         f"{', '.join(WRITTEN_BESIDE)} beside it); pass a file's "
                         f"path, e.g. --output={os.path.join(output, 'mined.tsv')}")
    for companion in WRITTEN_BESIDE + (LOCK_SUFFIX,):
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


def mine_bitext(source: str, target: str, output: str, margin: str = "ratio",
                retrieval: str = "max", k: int = 4, threshold=None, index: str = "flat",
                with_ids: bool = False, pipeline_args=(), test_pipeline=None,
                memory_budget_gb=None, cache_dir=None, nlist=None, nprobe=None) -> int:
    """Mines `source` against `target` (embed_corpus outputs) into the TSV `output`;
    returns the number of pairs mined (the TSV's rows and `<output>.with_tabs.jsonl`'s)."""
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
    """Holds `<output>.lock` (`lealla_tf.folder_lock`) while a run writes
    `output` and its companion files: a second run into the same --output is
    refused (`FolderInUseError`, naming its pid). Holding it, the temporary
    files that killed runs left beside `output` are removed. Remote outputs are
    not locked."""
    folder, name = os.path.split(output)
    folder = folder or "."
    if "://" not in output:
        os.makedirs(folder, exist_ok=True)
    with one_writer(folder, f"--output={output}", lock_name=name + LOCK_SUFFIX):
        if "://" not in output:  # write_atomically's "<file>.tmp-<pid>-<8 hex>"
            remove_dead_leftovers(folder, re.escape(name) + "(?:" + "|".join(
                re.escape(suffix) for suffix in WRITTEN_BESIDE)
                + r")?\.tmp-(?P<pid>\d+)-[0-9a-f]{8}")
        yield

