"""beam_pipelines/mine_bitext.py end to end on two embedded 'languages'."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import CORPUS_SENTENCES, REPO_ROOT, dead_pid, write_embedding_output

from lealla_tf.mining.margins import Rows, mine
from lealla_tf.mining.shards import mmap_embeddings, read_embeddings
from lealla_tf.pipelines import (
    embed_corpus,  # noqa: E402
    mine_bitext,  # noqa: E402
)


def planted(n=300, d=16, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.normal(size=(n, d)).astype(np.float32)
    target = (source + 0.2 * rng.normal(size=(n, d))).astype(np.float32)
    return source, target


def test_mines_identical_sentences_back(corpus_model, tmp_path):
    path, _ = corpus_model
    (tmp_path / "src.txt").write_text("\n".join(CORPUS_SENTENCES) + "\n")
    (tmp_path / "tgt.txt").write_text("\n".join(reversed(CORPUS_SENTENCES)) + "\n")
    for side in ("src", "tgt"):
        embed_corpus.run([f"--input={tmp_path / f'{side}.txt'}", f"--model={path}",
                          f"--output={tmp_path / side}"])
    output = tmp_path / "mined.tsv"
    count = mine_bitext.run([f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}",
                             f"--output={output}", "--with_ids"])
    rows = [line.split("\t") for line in output.read_text().splitlines()]
    assert count == len(rows) == len(CORPUS_SENTENCES)
    assert all(row[1] == row[2] for row in rows), rows  # each sentence mined to itself
    scores = [float(row[0]) for row in rows]
    assert scores == sorted(scores, reverse=True)
    assert {row[3] for row in rows} == {f"src.txt:{i}"
                                        for i in range(1, len(CORPUS_SENTENCES) + 1)}


def test_unknown_embedding_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="MANIFEST"):
        mine_bitext.run([f"--source={tmp_path}", f"--target={tmp_path}",
                         f"--output={tmp_path / 'x.tsv'}"])


def test_memory_mapped_copies_hold_the_shards(tmp_path):
    vectors = np.random.default_rng(1).normal(size=(50, 8)).astype(np.float32)
    write_embedding_output(tmp_path / "out", vectors)
    mapped = mmap_embeddings(str(tmp_path / "out"))
    assert (mapped.rows, mapped.dim, len(mapped.shards)) == (50, 8, 3)
    rows = Rows(mapped.parts, "mapped")
    ids, texts = mapped.ids(np.arange(50)), mapped.texts(np.arange(50))
    order = [int(i.split(":")[1]) for i in ids]
    np.testing.assert_array_equal(rows.read(0, 50), vectors[order])
    assert texts == [f"text s {row}" for row in order]
    assert sorted(order) == list(range(50))
    reference_ids, _ = read_embeddings(str(tmp_path / "out"))
    assert sorted(ids) == sorted(reference_ids)
    # Made once, beside the shards (the run folder), then reused as they are.
    vector_file = mapped.parts[0][0]
    assert os.path.dirname(os.path.dirname(vector_file)).endswith(
        json.load(open(tmp_path / "out" / "MANIFEST.json"))["run"])
    stamp = os.stat(vector_file).st_mtime_ns
    assert os.stat(mmap_embeddings(str(tmp_path / "out")).parts[0][0]).st_mtime_ns == stamp
    elsewhere = mmap_embeddings(str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    assert all(part[0].startswith(str(tmp_path / "cache")) for part in elsewhere.parts)


def read_pairs(path):
    return [line.split("\t") for line in open(path, encoding="utf-8").read().splitlines()]


def test_memory_budget_gives_the_same_pairs(tmp_path):
    source, target = planted()
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, shards=2, prefix="t")
    common = [f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}", "--with_ids",
              "--threshold=1.0"]
    plain = mine_bitext.run(common + [f"--output={tmp_path / 'plain.tsv'}"])
    budget = mine_bitext.run(common + [f"--output={tmp_path / 'budget.tsv'}",
                                       "--memory_budget_gb=0.05", f"--cache_dir={tmp_path / 'c'}"])
    assert plain == budget > 250
    assert read_pairs(tmp_path / "plain.tsv") == read_pairs(tmp_path / "budget.tsv")
    pairs = read_pairs(tmp_path / "plain.tsv")
    assert np.mean([p[3].split(":")[1] == p[4].split(":")[1] for p in pairs]) > 0.95
    assert all(p[1] == "text " + p[3].replace(":", " ") for p in pairs)
    # The same pairs as the library mining the arrays directly.
    mined = mine(source, target, threshold=1.0)
    assert [(f"s:{i}", f"t:{j}") for i, j in zip(mined["source"], mined["target"])] == [
        (p[3], p[4]) for p in pairs]
    summary = json.load(open(f"{tmp_path / 'plain.tsv'}.summary.json"))
    assert summary == {"pairs": plain, "dead_lettered": 0, "source_rows": 300,
                       "target_rows": 300}
    assert open(f"{tmp_path / 'plain.tsv'}.dead_letter.jsonl").read() == ""


def test_nan_and_zero_embeddings_are_dead_lettered(tmp_path):
    source, target = planted(n=40)
    source[5], source[9], target[3] = np.nan, 0.0, np.inf
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    output = tmp_path / "mined.tsv"
    common = [f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}",
              f"--output={output}", "--with_ids", "--k=50"]
    count = mine_bitext.run(common + ["--margin=ratio_shifted"])
    pairs = read_pairs(output)
    assert count == len(pairs) == 37
    mined_ids = {p[3] for p in pairs} | {p[4] for p in pairs}
    assert not mined_ids & {"s:5", "s:9", "t:3"}
    dead = [json.loads(line) for line in open(f"{output}.dead_letter.jsonl")]
    assert sorted((d["side"], d["id"], d["reason"]) for d in dead) == [
        ("source", "s:5", "non_finite"), ("source", "s:9", "zero"),
        ("target", "t:3", "non_finite")]
    assert json.load(open(f"{output}.summary.json"))["dead_lettered"] == 3
    scores = [float(p[0]) for p in pairs]
    assert all(0 <= s <= 39 for s in scores)  # shifted ratio in [0, k]: k capped at 39 targets
    # The paper's ratio: k = 50 reaches every (random) candidate, cosines <= 0 among
    # them, so no ratio is defined: nothing mined, and the summary says why.
    assert mine_bitext.run(common) == 0
    assert json.load(open(f"{output}.summary.json")) == {
        "pairs": 0, "dead_lettered": 3, "source_rows": 40, "target_rows": 40,
        "undefined_ratio": {"source_sentences": 38, "target_sentences": 39,
                            "candidates": 2 * 38 * 39}}


@pytest.mark.slow
def test_dask_runner_mines_what_the_fn_api_runner_mines(dask_cluster, tmp_path):
    """The same command on a dask.distributed cluster (2 worker processes on
    127.0.0.1): the same pairs, dead letters and counts as on the FnApiRunner."""
    source, target = planted(n=200)
    source[7], target[11] = np.nan, 0.0
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, shards=2, prefix="t")
    counts = {}
    for runner, flags in (("fnapi", []), ("dask", [
            "--runner=DaskRunner", f"--dask_client_address={dask_cluster.scheduler_address}"])):
        counts[runner] = mine_bitext.run([
            f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}", "--with_ids",
            f"--output={tmp_path / runner}.tsv", f"--cache_dir={tmp_path / runner}_cache"]
            + flags)
    assert counts["fnapi"] == counts["dask"] > 150
    assert (tmp_path / "fnapi.tsv").read_text() == (tmp_path / "dask.tsv").read_text()
    for suffix in (".dead_letter.jsonl", ".summary.json"):
        assert (open(f"{tmp_path / 'fnapi.tsv'}{suffix}").read()
                == open(f"{tmp_path / 'dask.tsv'}{suffix}").read())
    dead = [json.loads(line) for line in open(f"{tmp_path / 'dask.tsv'}.dead_letter.jsonl")]
    assert sorted((d["side"], d["id"]) for d in dead) == [("source", "s:7"), ("target", "t:11")]


# === Bad flags, concurrent runs, damaged copies and leftovers (issue 44) ===

def assert_one_line_error(capsys, code, *needles):
    """Exit 2 and one line on stderr, `error: ...`, naming `needles`; no traceback
    (the convention of tests/cli/test_bad_inputs.py)."""
    stderr = capsys.readouterr().err
    assert code == 2, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.strip()
             and not line.startswith(("WARNING", "I0000", "W0000", "mine_bitext: "))]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("budget", ["inf", "nan", "0", "-1", "-inf"])
def test_memory_budget_must_be_a_positive_finite_number(tmp_path, capsys, budget):
    write_embedding_output(tmp_path / "d8", np.random.default_rng(0).normal(size=(30, 8)))
    code = mine_bitext.main([f"--source={tmp_path / 'd8'}", f"--target={tmp_path / 'd8'}",
                             f"--output={tmp_path / 'm.tsv'}", f"--memory_budget_gb={budget}"])
    assert_one_line_error(capsys, code, "--memory_budget_gb must be a positive number of GiB",
                          f"got {float(budget)}")
    assert not (tmp_path / "m.tsv").exists()


def test_a_second_run_into_the_same_output_is_refused(tmp_path, capsys):
    """embed_corpus's lock, on `<output>.lock`: a run that a live run holds is
    refused in one line and the first run's files are untouched; the lock of
    a killed run is taken over. Another --output in the same folder is free."""
    source, target = planted(n=60)
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    output = tmp_path / "mined.tsv"
    args = [f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}", f"--output={output}"]
    assert mine_bitext.main(args) == 0
    first = {suffix: open(f"{output}{suffix}").read()
             for suffix in ("", ".summary.json", ".dead_letter.jsonl")}
    assert not os.path.exists(f"{output}.lock")  # released
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "mined.tsv.lock").write_text(f"{holder.pid} sometoken\n")
        capsys.readouterr()
        assert_one_line_error(capsys, mine_bitext.main(args + ["--k=2"]), f"--output={output}",
                              f"is being written by another run (pid {holder.pid})")
        assert {suffix: open(f"{output}{suffix}").read() for suffix in first} == first
        assert mine_bitext.main(args[:2] + [f"--output={tmp_path / 'other.tsv'}"]) == 0
        # The same process holding it (another thread): refused as well.
        (tmp_path / "mined.tsv.lock").unlink()
        with mine_bitext.output_file_lock(str(output)):
            assert_one_line_error(capsys, mine_bitext.main(args), f"pid {os.getpid()}")
    finally:
        holder.kill()
        holder.wait()
    (tmp_path / "mined.tsv.lock").write_text(f"{dead_pid()} sometoken\n")
    assert mine_bitext.main(args) == 0
    assert not os.path.exists(f"{output}.lock")


def copy_folders(directory):
    return sorted(str(path) for path in pathlib.Path(directory).glob("run-*/*.mmap"))


@pytest.mark.parametrize("damage", ["random_bytes", "truncated_vectors", "truncated_ids_ends",
                                    "missing_texts", "garbage_meta", "older_version"])
def test_a_damaged_memory_mapped_copy_is_rebuilt(tmp_path, damage, caplog):
    """The copy is checked against what its meta.json records (sizes and
    CRC32Cs of its files, the shard's size and mtime) and rebuilt when it does
    not match: the same pairs as before, never wrong ones or a traceback."""
    source, target = planted(n=80)
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    args = [f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}", "--with_ids"]
    assert mine_bitext.run(args + [f"--output={tmp_path / 'before.tsv'}"]) > 60
    folder = pathlib.Path(copy_folders(tmp_path / "tgt")[0])
    path = {"random_bytes": "vectors.f32", "truncated_vectors": "vectors.f32",
            "truncated_ids_ends": "ids.ends", "missing_texts": "texts.bin",
            "garbage_meta": "meta.json", "older_version": "meta.json"}[damage]
    data = (folder / path).read_bytes()
    stat = os.stat(folder / path)
    if damage == "random_bytes":  # same size, same mtime: only the checksum tells
        (folder / path).write_bytes(np.random.default_rng(1).bytes(len(data)))
        os.utime(folder / path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif damage.startswith("truncated"):
        (folder / path).write_bytes(data[:len(data) // 2 - 3])
    elif damage == "missing_texts":
        (folder / path).unlink()
    elif damage == "garbage_meta":
        (folder / path).write_bytes(b"\x00{not json")
    else:  # a copy made before meta.json recorded checksums
        meta = json.loads(data)
        (folder / path).write_text(json.dumps({key: meta[key] for key in (
            "rows", "dim", "shard", "stamp")}))
    caplog.clear()
    assert mine_bitext.run(args + [f"--output={tmp_path / 'after.tsv'}"]) > 60
    assert read_pairs(tmp_path / "after.tsv") == read_pairs(tmp_path / "before.tsv")
    warned = [r.getMessage() for r in caplog.records if "does not match its shard" in
              r.getMessage()]
    assert len(warned) == 1 and str(folder) in warned[0], warned
    assert (folder / path).read_bytes() == data if damage != "older_version" else True
    # Rebuilt once: the next run reuses the copy as it is.
    stamp = os.stat(folder / "vectors.f32").st_mtime_ns
    mmap_embeddings(str(tmp_path / "tgt"))
    assert os.stat(folder / "vectors.f32").st_mtime_ns == stamp


def test_a_column_truncated_while_in_use_is_a_one_line_error_naming_the_file(tmp_path):
    write_embedding_output(tmp_path / "out", np.ones((10, 4), np.float32), shards=1)
    mapped = mmap_embeddings(str(tmp_path / "out"))
    ends = pathlib.Path(copy_folders(tmp_path / "out")[0]) / "ids.ends"
    ends.write_bytes(ends.read_bytes()[:8 * 5 + 3])  # was a struct.error
    assert mapped.ids([0, 4]) == ["s:0", "s:4"]
    with pytest.raises(ValueError, match=f"{ends} is truncated") as error:
        mapped.ids([7])
    assert "\n" not in str(error.value)


def test_leftovers_of_killed_runs_are_removed_and_nothing_else(tmp_path):
    """A conversion killed (SIGKILL) mid-copy leaves `<copy>.tmp-<pid>-<host>`
    and a killed write leaves `<output>.tmp-<pid>-<hex>`: the next run removes
    them; a live process's, another host's and files not named by us stay."""
    from lealla_tf.mining.shards import host_tag

    write_embedding_output(tmp_path / "src", planted(n=40)[0], shards=1, prefix="s")
    write_embedding_output(tmp_path / "tgt", planted(n=40)[1], shards=1, prefix="t")
    killed = subprocess.run([sys.executable, "-c", f"""
import os, signal
from lealla_tf.mining import shards as embedding_io
def write_then_die(path, folder, batch_size):
    open(os.path.join(folder, "vectors.f32"), "wb").write(b"half a copy")
    os.kill(os.getpid(), signal.SIGKILL)
embedding_io._write_mapped = write_then_die
embedding_io.mmap_embeddings({str(tmp_path / 'tgt')!r})
"""], cwd=REPO_ROOT, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert killed.returncode == -9
    run_dir = next((tmp_path / "tgt").glob("run-*"))
    (left,) = [p.name for p in run_dir.iterdir() if ".mmap.tmp-" in p.name]
    shard = next(run_dir.glob("*.tfrecord.gz")).name
    dead = int(left.split(".tmp-")[1].split("-")[0])
    assert left == f"{shard}.mmap.tmp-{dead}-{host_tag()}"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        removed = [f"{shard}.mmap.tmp-{dead}", left]  # the second: as earlier versions named it
        (run_dir / removed[0]).mkdir()
        kept = [f"{shard}.mmap.tmp-{live.pid}-{host_tag()}", f"{shard}.mmap.tmp-{dead}-elsewhere",
                f"{shard}.mmap.tmp-notes", "notes.mmap.tmp-1"]
        for name in kept:
            (run_dir / name).mkdir()
        output = tmp_path / "out" / "mined.tsv"
        output.parent.mkdir()
        stale = [f"mined.tsv.tmp-{dead}-0123abcd", f"mined.tsv.summary.json.tmp-{dead}-0123abcd"]
        other = [f"mined.tsv.tmp-{live.pid}-0123abcd", f"other.tsv.tmp-{dead}-0123abcd",
                 "mined.tsv.tmp-notes"]
        for name in stale + other:
            (output.parent / name).write_text("x")
        assert mine_bitext.run([f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}",
                                f"--output={output}"]) > 30
        names = {p.name for p in run_dir.iterdir()}
        assert not names & set(removed) and set(kept) <= names
        names = {p.name for p in output.parent.iterdir()}
        assert not names & set(stale) and set(other) <= names
    finally:
        live.kill()
        live.wait()


def test_help_recommends_a_ratio_threshold_and_says_what_it_means(capsys):
    with pytest.raises(SystemExit):
        mine_bitext.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Artetxe & Schwenk" in text and "1.04-1.06" in text and "--threshold=1.05" in text
    assert "1.0: no better than a neighbour" in text
    assert "ratio_shifted" in text
