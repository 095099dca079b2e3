"""lealla_tf.cli.embed_corpus: progress on stderr, a one-screen summary whose
reading lines run as written, and one-line errors (a live run's --output among
them, naming its pid)."""

import gzip
import os
import subprocess
import sys
import time

import pytest
from conftest import CORPUS_SENTENCES, REPO_ROOT, assert_one_line_stderr

from lealla_tf.cli import embed_corpus as command
from lealla_tf.mining.run_folders import read_manifest
from lealla_tf.mining.shards import read_embeddings
from lealla_tf.pipelines.corpus_steps import PROGRESS_FOLDER


@pytest.fixture()
def corpus(tmp_path):
    """Two input files: 6 lines, of which 2 are dead letters (not UTF-8, empty)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(
        "".join(f"{sentence}\n" for sentence in CORPUS_SENTENCES[:3]).encode()
        + b"\xff\xfe not utf-8\n\n")
    (tmp_path / "in" / "b.txt.gz").write_bytes(gzip.compress(b"The dog is nice.\n"))
    return tmp_path


def test_the_command_line_shows_progress_and_a_summary_that_reads_the_output(
        corpus_model, corpus, capsys, monkeypatch):
    """Progress on stderr as newline-ended lines (stderr is not a terminal here),
    then a summary on stdout: the counts, the dead letters' file, the output,
    and Python lines that read it, which run as written."""
    monkeypatch.setenv("LEALLA_TF_PROGRESS_SECONDS", "0")
    output = str(corpus / "out")
    assert command.main([f"--input={corpus / 'in' / '*'}", f"--model={corpus_model[0]}",
                         f"--output={output}"]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "\x1b" not in captured.err
    lines = captured.err.splitlines()
    assert any(line.startswith("reading: ") and "2/2 files" in line for line in lines), lines
    assert lines[-1].startswith("embedding: 100% (4/4)"), lines
    summary = captured.out
    assert "6 lines read from 2 files" in summary
    assert "embedded       4 sentences" in summary
    dead = os.path.join(output, read_manifest(output)["run"], "dead_letter.jsonl")
    assert f"dead-lettered  2 lines -> {dead}" in summary
    assert f"output         {output} (" in summary and not os.path.exists(
        os.path.join(output, read_manifest(output)["run"], PROGRESS_FOLDER))
    pipeline = next(line for line in summary.splitlines() if line.startswith("  pipeline "))
    assert all(f"{stage} " in pipeline for stage in ("read", "model", "embed", "write"))
    assert len(summary.splitlines()) <= 12  # one screen
    example = summary.split("read it in Python:\n")[1]
    assert "read_embeddings(" in example and "mmap_embeddings(" in example
    namespace = {}
    exec("\n".join(line.strip() for line in example.splitlines()), namespace)
    assert len(namespace["ids"]) == 4 and namespace["vectors"].shape == (4, 16)
    assert namespace["mapped"].rows == 4
    # --help shows the same lines
    help_text = command.build_parser().format_help()
    assert all(f"  {line}\n" in help_text
               for line in command.reading_example("runs/embeddings").splitlines())


# The first of two runs into one output: it holds the output while the second
# starts (its pipeline waits for the file argv[1]), then runs to the end.
PAUSED_RUN = """
import pathlib, sys, time
from lealla_tf.cli import embed_corpus as command
from lealla_tf.pipelines import embed_corpus
go = pathlib.Path(sys.argv[1])
run_pipeline = embed_corpus.run_pipeline
def paused(pipeline, *args, **kwargs):
    go.with_suffix(".started").touch()
    while not go.exists():
        time.sleep(0.05)
    run_pipeline(pipeline, *args, **kwargs)
embed_corpus.run_pipeline = paused
sys.exit(command.main(sys.argv[2:]))
"""


def test_a_second_run_into_a_live_runs_output_is_refused_naming_its_pid(corpus_model, tmp_path,
                                                                         capsys):
    """Two embed_corpus runs on one --output at once: the second is refused in
    one line naming the first's pid and touches nothing; the first commits."""
    (tmp_path / "ok.txt").write_text("The dog is nice.\n")
    output = tmp_path / "out"
    args = [f"--input={tmp_path / 'ok.txt'}", f"--model={corpus_model[0]}", f"--output={output}"]
    go = tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", PAUSED_RUN, str(go), *args], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    try:
        deadline = time.monotonic() + 240
        while not go.with_suffix(".started").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run never started its pipeline"
            time.sleep(0.1)
        run_folders = sorted(p.name for p in output.iterdir())
        assert_one_line_stderr(command.main(args), capsys.readouterr().err,
                               str(output), f"pid {first.pid}")
        assert sorted(p.name for p in output.iterdir()) == run_folders  # untouched
    finally:
        go.touch()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    manifest = read_manifest(str(output))
    assert [p.name for p in output.iterdir() if p.name.startswith("run-")] == [manifest["run"]]
    assert read_embeddings(str(output))[0] == ["ok.txt:1"]


HOLDER = """
import sys, time
from lealla_tf.folder_lock import hold_folder
hold_folder(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_faults_are_one_line_errors_and_commit_nothing(corpus_model, tmp_path, capsys):
    """Duplicated ids (named, with where they occur), bad values, a --model that
    is no model, and an --output a live run holds (naming its pid): exit 2, one
    line, nothing committed. A killed holder's lock blocks nobody."""
    (tmp_path / "ids.tsv").write_text("a\tThe dog.\nb\tThe cat.\na\tA house.\n")
    output = tmp_path / "out"
    base = [f"--input={tmp_path / 'ids.tsv'}", f"--model={corpus_model[0]}", f"--output={output}"]
    assert_one_line_stderr(command.main([*base, "--format=tsv"]), capsys.readouterr().err,
                           "1 id occurs more than once", "'a' (2x: ids.tsv:1, ids.tsv:3)")
    assert not (output / "MANIFEST.json").exists()
    for flag, message in (("--model_batch_size=0", "--num_shards and --model_batch_size"),
                          ("--threads_per_worker=-1", "--threads_per_worker must be at least 0"),
                          ("--english_only", "--english_only applies to --pairs")):
        assert_one_line_stderr(command.main(base + [flag]), capsys.readouterr().err, message)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(output)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_one_line_stderr(command.main(base), capsys.readouterr().err,
                               f"--output={output} is being written by another run "
                               f"(pid {holder.pid})")
    finally:
        holder.kill()  # killed: the kernel lets go of its lock
        holder.wait()
        holder.stdout.close()
    assert command.main(base) == 0
    # A --model that is no model is refused before any worker starts.
    assert_one_line_stderr(command.main([f"--input={tmp_path / 'ids.tsv'}",
                                         f"--model={tmp_path / 'no_model'}",
                                         f"--output={tmp_path / 'out2'}"]),
                           capsys.readouterr().err, "no_model")
    assert not (tmp_path / "out2").exists()


def listing(folder):
    """Every path under `folder`, relative to it."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_an_output_that_is_a_file_is_one_line_and_nothing_is_written(corpus_model, tmp_path,
                                                                      capsys):
    """embed_corpus writes a folder: an --output that is a file, or one below a
    file, is one line naming the flag, checked before anything is written (no
    `.tmp-*`, no lock); what is there stays as it was."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "ok.txt").write_text("The dog is nice.\n")
    inputs = [f"--input={tmp_path / 'ok.txt'}", f"--model={corpus_model[0]}"]
    before = listing(tmp_path)
    for output, needle in [("notes.txt", "is a file"), ("notes.txt/out", "notes.txt is a file")]:
        assert_one_line_stderr(command.main([*inputs, f"--output={tmp_path / output}"]),
                               capsys.readouterr().err, f"--output={tmp_path / output}", needle)
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert listing(tmp_path) == before
