"""lealla_tf.pipelines.mine_bitext end to end on two embedded 'languages': the
pairs the library mines, dead letters and counts, one writer an output, and the
leftovers of killed writes removed."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import CORPUS_SENTENCES, REPO_ROOT, dead_pid, write_embedding_output

from lealla_tf.folder_lock import FolderInUseError
from lealla_tf.mining.margins import mine
from lealla_tf.pipelines.embed_corpus import embed_corpus
from lealla_tf.pipelines.mine_bitext import mine_bitext, output_file_lock


def planted(n=300, d=16, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.normal(size=(n, d)).astype(np.float32)
    target = (source + 0.2 * rng.normal(size=(n, d))).astype(np.float32)
    return source, target


def text(path) -> str:
    return pathlib.Path(path).read_text(encoding="utf-8")


def read_pairs(path):
    return [line.split("\t") for line in text(path).splitlines()]


def test_mines_identical_sentences_back(corpus_model, tmp_path):
    path, _ = corpus_model
    (tmp_path / "src.txt").write_text("\n".join(CORPUS_SENTENCES) + "\n")
    (tmp_path / "tgt.txt").write_text("\n".join(reversed(CORPUS_SENTENCES)) + "\n")
    for side in ("src", "tgt"):
        embed_corpus([str(tmp_path / f"{side}.txt")], path, str(tmp_path / side))
    output = tmp_path / "mined.tsv"
    count = mine_bitext(str(tmp_path / "src"), str(tmp_path / "tgt"), str(output), with_ids=True)
    rows = read_pairs(output)
    assert count == len(rows) == len(CORPUS_SENTENCES)
    assert all(row[1] == row[2] for row in rows), rows  # each sentence mined to itself
    scores = [float(row[0]) for row in rows]
    assert scores == sorted(scores, reverse=True)
    assert {row[3] for row in rows} == {f"src.txt:{i}"
                                        for i in range(1, len(CORPUS_SENTENCES) + 1)}


def test_unknown_embedding_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="MANIFEST"):
        mine_bitext(str(tmp_path), str(tmp_path), str(tmp_path / "x.tsv"))


def test_memory_budget_gives_the_same_pairs(tmp_path):
    source, target = planted()
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, shards=2, prefix="t")
    common = dict(source=str(tmp_path / "src"), target=str(tmp_path / "tgt"), with_ids=True,
                  threshold=1.0)
    plain = mine_bitext(output=str(tmp_path / "plain.tsv"), **common)
    budget = mine_bitext(output=str(tmp_path / "budget.tsv"), memory_budget_gb=0.05,
                         cache_dir=str(tmp_path / "c"), **common)
    assert plain == budget > 250
    assert read_pairs(tmp_path / "plain.tsv") == read_pairs(tmp_path / "budget.tsv")
    pairs = read_pairs(tmp_path / "plain.tsv")
    assert np.mean([p[3].split(":")[1] == p[4].split(":")[1] for p in pairs]) > 0.95
    assert all(p[1] == "text " + p[3].replace(":", " ") for p in pairs)
    # The same pairs as the library mining the arrays directly.
    mined = mine(source, target, threshold=1.0)
    assert [(f"s:{i}", f"t:{j}") for i, j in zip(mined["source"], mined["target"])] == [
        (p[3], p[4]) for p in pairs]
    summary = json.loads(text(f"{tmp_path / 'plain.tsv'}.summary.json"))
    assert summary == {"pairs": plain, "dead_lettered": 0, "pairs_with_tabs": 0,
                       "source_rows": 300, "target_rows": 300}
    for suffix in (".dead_letter.jsonl", ".with_tabs.jsonl"):
        assert text(f"{tmp_path / 'plain.tsv'}{suffix}") == ""


def test_nan_and_zero_embeddings_are_dead_lettered(tmp_path):
    source, target = planted(n=40)
    source[5], source[9], target[3] = np.nan, 0.0, np.inf
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    output = tmp_path / "mined.tsv"
    common = dict(source=str(tmp_path / "src"), target=str(tmp_path / "tgt"),
                  output=str(output), with_ids=True, k=50)
    count = mine_bitext(margin="ratio_shifted", **common)
    pairs = read_pairs(output)
    assert count == len(pairs) == 37
    mined_ids = {p[3] for p in pairs} | {p[4] for p in pairs}
    assert not mined_ids & {"s:5", "s:9", "t:3"}
    dead = [json.loads(line) for line in text(f"{output}.dead_letter.jsonl").splitlines()]
    assert sorted((d["side"], d["id"], d["reason"]) for d in dead) == [
        ("source", "s:5", "non_finite"), ("source", "s:9", "zero"),
        ("target", "t:3", "non_finite")]
    assert json.loads(text(f"{output}.summary.json"))["dead_lettered"] == 3
    scores = [float(p[0]) for p in pairs]
    assert all(0 <= s <= 39 for s in scores)  # shifted ratio in [0, k]: k capped at 39 targets
    # The paper's ratio: k = 50 reaches every (random) candidate, cosines <= 0 among
    # them, so no ratio is defined: nothing mined, and the summary says why.
    assert mine_bitext(**common) == 0
    assert json.loads(text(f"{output}.summary.json")) == {
        "pairs": 0, "dead_lettered": 3, "pairs_with_tabs": 0, "source_rows": 40,
        "target_rows": 40,
        "undefined_ratio": {"source_sentences": 38, "target_sentences": 39,
                            "candidates": 2 * 38 * 39}}


def test_pairs_a_tsv_row_cannot_hold_go_whole_to_the_with_tabs_file(tmp_path):
    """A tab in a sentence (or, with ids, a tab or line feed in an id) would
    split its TSV row into other columns: such a pair goes, whole and with its
    rank, to `<output>.with_tabs.jsonl`; every other pair stays in the TSV."""
    source, target = planted(n=60)
    texts = [f"sentence {row}" + ("\twith a tab" if row % 7 == 0 else "") for row in range(60)]
    ids = [f"s:{row}" + ("\nline" if row == 10 else "") for row in range(60)]
    write_embedding_output(tmp_path / "src", source, texts=texts, ids=ids)
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    output = tmp_path / "mined.tsv"
    count = mine_bitext(str(tmp_path / "src"), str(tmp_path / "tgt"), str(output), with_ids=True)
    rows = read_pairs(output)
    tabbed = [json.loads(line) for line in text(f"{output}.with_tabs.jsonl").splitlines()]
    assert all(len(row) == 5 for row in rows) and len(rows) + len(tabbed) == count > 50
    assert {pair["source_id"] for pair in tabbed} <= {ids[row] for row in range(0, 60, 7)} | {
        ids[10]}
    assert len(tabbed) >= 8 and all(
        pair["source"] == texts[ids.index(pair["source_id"])] for pair in tabbed)
    # Ranks interleave with the TSV's rows, best first, as one list.
    scores = {pair["rank"]: round(pair["score"], 6) for pair in tabbed}  # as the TSV writes
    in_tsv = iter(float(row[0]) for row in rows)
    merged = [scores[rank] if rank in scores else next(in_tsv) for rank in range(count)]
    assert merged == sorted(merged, reverse=True)
    assert json.loads(text(f"{output}.summary.json"))["pairs_with_tabs"] == len(tabbed)
    # Without ids in the TSV, an id's line feed splits nothing: only the tabbed sentences.
    mine_bitext(str(tmp_path / "src"), str(tmp_path / "tgt"), str(output), k=2)
    assert all(pair["source_id"] != ids[10]
               for pair in map(json.loads, text(f"{output}.with_tabs.jsonl").splitlines()))


# Every line break of Python's universal newlines (CR) or str.splitlines (the rest).
LINE_BREAKS = ("\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
               "\u2029")


def test_a_line_break_any_reader_ends_a_row_at_sends_the_pair_to_the_with_tabs_file(tmp_path):
    """A sentence (or, with ids, an id) holding CR, VT, FF, FS, GS, RS, NEL, U+2028
    or U+2029 would end its row early for a reader with universal newlines
    (`open()`) or `str.splitlines`: such a pair goes whole to
    `<output>.with_tabs.jsonl`, so that the TSV reads as one row a pair
    whatever the reader, and nothing is lost. The JSON-lines files too read as
    one record a line (a dead-lettered id holds U+2029)."""
    source, target = planted(n=40)
    source[30] = np.nan
    texts = [f"sentence {row}" + (f"{LINE_BREAKS[row]}after" if row < len(LINE_BREAKS) else "")
             for row in range(40)]
    ids = [f"s:{row}" + {20: "\u2028x", 30: "\u2029y"}.get(row, "") for row in range(40)]
    write_embedding_output(tmp_path / "src", source, texts=texts, ids=ids)
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    output = tmp_path / "mined.tsv"
    for with_ids, broken in ((False, set(range(len(LINE_BREAKS)))),
                             (True, set(range(len(LINE_BREAKS))) | {20})):
        count = mine_bitext(str(tmp_path / "src"), str(tmp_path / "tgt"), str(output),
                            with_ids=with_ids)
        with open(output, encoding="utf-8") as f:  # universal newlines
            rows = [line.rstrip("\n").split("\t") for line in f]
        tabbed = [json.loads(line) for line in text(f"{output}.with_tabs.jsonl").splitlines()]
        assert text(output).splitlines() == ["\t".join(row) for row in rows]
        assert len(rows) + len(tabbed) == count == 39
        assert all(len(row) == (5 if with_ids else 3) for row in rows)
        assert sorted(ids.index(pair["source_id"]) for pair in tabbed) == sorted(broken)
        for pair in tabbed:  # whole: the sentences and ids as embedded
            row = ids.index(pair["source_id"])
            assert pair["source"] == texts[row] and pair["target"] == f"text t {row}"
        assert {row[1] for row in rows} == {texts[row] for row in set(range(40)) - broken - {30}}
        dead = [json.loads(line) for line in text(f"{output}.dead_letter.jsonl").splitlines()]
        assert [record["id"] for record in dead] == [ids[30]]
        assert json.loads(text(f"{output}.summary.json"))["pairs_with_tabs"] == len(broken)


def test_what_a_tsv_row_cannot_hold_is_every_line_break_and_the_tab():
    """The characters that send a pair to the with-tabs file: the tab, and every
    character `str.splitlines` ends a line at (the universal newlines' CR among
    them), and no other."""
    from lealla_tf.pipelines.mine_bitext import NOT_IN_A_ROW

    ends_a_line = {chr(c) for c in range(0x110000) if len(f"a{chr(c)}b".splitlines()) > 1}
    assert ends_a_line >= set("".join(LINE_BREAKS)) | {"\n"}
    assert {chr(c) for c in range(0x110000) if NOT_IN_A_ROW.search(chr(c))} == (
        ends_a_line | {"\t"})


@pytest.mark.slow
def test_dask_runner_mines_what_the_fn_api_runner_mines(dask_cluster, tmp_path):
    """The same call on a dask.distributed cluster (2 worker processes on
    127.0.0.1): the same pairs, dead letters and counts as on the FnApiRunner."""
    source, target = planted(n=200)
    source[7], target[11] = np.nan, 0.0
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, shards=2, prefix="t")
    counts = {}
    for runner, flags in (("fnapi", []), ("dask", [
            "--runner=DaskRunner", f"--dask_client_address={dask_cluster.scheduler_address}"])):
        counts[runner] = mine_bitext(
            str(tmp_path / "src"), str(tmp_path / "tgt"), f"{tmp_path / runner}.tsv",
            with_ids=True, cache_dir=f"{tmp_path / runner}_cache", pipeline_args=flags)
    assert counts["fnapi"] == counts["dask"] > 150
    assert (tmp_path / "fnapi.tsv").read_text() == (tmp_path / "dask.tsv").read_text()
    for suffix in (".dead_letter.jsonl", ".summary.json"):
        assert text(f"{tmp_path / 'fnapi.tsv'}{suffix}") == text(f"{tmp_path / 'dask.tsv'}{suffix}")
    dead = [json.loads(line) for line in text(f"{tmp_path / 'dask.tsv'}.dead_letter.jsonl")
            .splitlines()]
    assert sorted((d["side"], d["id"]) for d in dead) == [("source", "s:7"), ("target", "t:11")]


# === Concurrent runs and leftovers (issue 44) ===

LOCK_HOLDER = """
import sys, time
from lealla_tf.folder_lock import hold_folder
hold_folder(sys.argv[1], lock_name=sys.argv[2])
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_run_into_the_same_output_is_refused(tmp_path):
    """`<output>.lock`: a run that a live run holds is refused naming its pid,
    and the first run's files are untouched; the lock of a killed run blocks
    nobody. Another output in the same folder is free."""
    source, target = planted(n=60)
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    sides, output = (str(tmp_path / "src"), str(tmp_path / "tgt")), tmp_path / "mined.tsv"
    assert mine_bitext(*sides, str(output)) > 0
    first = {suffix: text(f"{output}{suffix}")
             for suffix in ("", ".summary.json", ".dead_letter.jsonl")}
    assert (tmp_path / "mined.tsv.lock").read_text() == ""  # released: emptied, not removed
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path),
                               "mined.tsv.lock"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError, match=(
                f"--output={output} is being written by another run \\(pid {holder.pid}\\)")):
            mine_bitext(*sides, str(output), k=2)
        assert {suffix: text(f"{output}{suffix}") for suffix in first} == first
        assert mine_bitext(*sides, str(tmp_path / "other.tsv")) > 0
    finally:
        holder.kill()  # killed: the lock it held goes with it
        holder.wait()
        holder.stdout.close()
    # The same process holding it (another thread): refused as well.
    with output_file_lock(str(output)):
        with pytest.raises(FolderInUseError, match=f"pid {os.getpid()}"):
            mine_bitext(*sides, str(output))
    assert mine_bitext(*sides, str(output), k=2) > 0


def test_leftovers_of_killed_writes_are_removed_and_nothing_else(tmp_path):
    """A write killed mid-file leaves `<output>.tmp-<pid>-<hex>` (or a companion
    file's): the next run into that output removes them; a live process's,
    another output's and files not named by us stay."""
    write_embedding_output(tmp_path / "src", planted(n=40)[0], shards=1, prefix="s")
    write_embedding_output(tmp_path / "tgt", planted(n=40)[1], shards=1, prefix="t")
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        output = tmp_path / "out" / "mined.tsv"
        output.parent.mkdir()
        stale = [f"mined.tsv.tmp-{dead}-0123abcd", f"mined.tsv.summary.json.tmp-{dead}-0123abcd"]
        other = [f"mined.tsv.tmp-{live.pid}-0123abcd", f"other.tsv.tmp-{dead}-0123abcd",
                 "mined.tsv.tmp-notes"]
        for name in stale + other:
            (output.parent / name).write_text("x")
        assert mine_bitext(str(tmp_path / "src"), str(tmp_path / "tgt"), str(output)) > 30
        names = {p.name for p in output.parent.iterdir()}
        assert not names & set(stale) and set(other) <= names
    finally:
        live.kill()
        live.wait()
