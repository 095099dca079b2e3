"""lealla_tf.cli.mine_bitext: a --help that says what a ratio threshold means, a
summary whose reading line runs as written, and one-line errors (a held
--output among them, naming its holder's pid)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT, assert_one_line_stderr, write_embedding_output

from lealla_tf.cli import mine_bitext as command
from lealla_tf.pipelines.mine_bitext import output_file_lock


def test_help_recommends_a_ratio_threshold_and_says_what_it_means(capsys):
    with pytest.raises(SystemExit):
        command.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Artetxe & Schwenk" in text and "1.04-1.06" in text and "--threshold=1.05" in text
    assert "1.0: no better than a neighbour" in text
    assert "ratio_shifted" in text
    assert ("with open('runs/mined_deu_eng.tsv', encoding='utf-8') as f: rows = "
            "[line.rstrip('\\n').split('\\t') for line in f]") in text
    assert command.MARGINS == ("absolute", "distance", "ratio", "ratio_shifted")


def test_the_summary_counts_and_reads_the_output(tmp_path, capsys):
    rng = np.random.default_rng(0)
    source = rng.normal(size=(40, 8)).astype(np.float32)
    target = source + 0.1 * rng.normal(size=(40, 8))
    source[3] = np.nan
    write_embedding_output(tmp_path / "src", source, prefix="s")
    write_embedding_output(tmp_path / "tgt", target, prefix="t")
    output = tmp_path / "mined.tsv"
    assert command.main([f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}",
                         f"--output={output}", "--with_ids"]) == 0
    summary = capsys.readouterr().out
    lines = summary.splitlines()
    assert lines[0].startswith("mine_bitext: ") and "from 40 source x 40 target sentences" in (
        lines[0])
    assert f"dead-lettered  1 embeddings (NaN, infinite or zero) -> {output}.dead_letter" in (
        summary)
    assert "(TSV: score, source, target, source id, target id; best first)" in summary
    namespace = {}
    example = summary.split("read it in Python:\n")[1].splitlines()
    exec("\n".join(line.strip() for line in example), namespace)
    pairs = int(lines[0].split()[1])
    assert len(namespace["rows"]) == pairs > 30 and len(namespace["rows"][0]) == 5


def test_the_reading_line_reads_one_row_a_pair_and_the_with_tabs_file_the_rest(tmp_path,
                                                                                capsys):
    """A sentence may hold characters that `str.splitlines` (and a text file's
    universal newlines, for the carriage return) end a line at: its pair is in
    the with-tabs file, whole, and the summary's reading line (a plain `open()`)
    reads every other pair as one row."""
    sentences = ["line\u2028separator", "paragraph\u2029separator", "next\x85line",
                 "form\x0cfeed", "vertical\x0btab", "group\x1dseparator", "carriage\rreturn",
                 "plain", "plain too"]
    write_embedding_output(tmp_path / "emb", np.random.default_rng(0).normal(
        size=(len(sentences), 8)), shards=1, texts=sentences)
    output = tmp_path / "mined.tsv"
    assert command.main([f"--source={tmp_path / 'emb'}", f"--target={tmp_path / 'emb'}",
                         f"--output={output}", "--k=1"]) == 0
    assert (f"with tabs      7 of the pairs (a tab or line break in a sentence or id) -> "
            f"{output}.with_tabs.jsonl") in capsys.readouterr().out
    namespace = {}
    exec(command.reading_example(str(output)), namespace)
    assert sorted(row[1:] for row in namespace["rows"]) == [["plain", "plain"],
                                                            ["plain too", "plain too"]]
    aside = [json.loads(line) for line in
             (tmp_path / "mined.tsv.with_tabs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted([pair["source"], pair["target"]] for pair in aside) == sorted(
        [sentence, sentence] for sentence in sentences[:7])


def test_the_summary_names_the_pairs_with_tabs(tmp_path, capsys):
    sentences = ["one\tcell", "plain one", "plain two", "two\tcells\there", "plain three"]
    write_embedding_output(tmp_path / "emb", np.random.default_rng(0).normal(
        size=(len(sentences), 8)), shards=1, texts=sentences)
    output = tmp_path / "mined.tsv"
    assert command.main([f"--source={tmp_path / 'emb'}", f"--target={tmp_path / 'emb'}",
                         f"--output={output}", "--k=1"]) == 0
    assert (f"with tabs      2 of the pairs (a tab or line break in a sentence or id) -> "
            f"{output}.with_tabs.jsonl") in capsys.readouterr().out


@pytest.mark.parametrize("budget", ["inf", "nan", "0", "-1", "-inf"])
def test_memory_budget_must_be_a_positive_finite_number(tmp_path, capsys, budget):
    write_embedding_output(tmp_path / "d8", np.random.default_rng(0).normal(size=(30, 8)))
    code = command.main([f"--source={tmp_path / 'd8'}", f"--target={tmp_path / 'd8'}",
                         f"--output={tmp_path / 'm.tsv'}", f"--memory_budget_gb={budget}"])
    assert_one_line_stderr(code, capsys.readouterr().err,
                           "--memory_budget_gb must be a positive number of GiB",
                           f"got {float(budget)}")
    assert not (tmp_path / "m.tsv").exists()


def test_a_held_output_is_a_one_line_error_naming_the_holder(tmp_path, capsys):
    write_embedding_output(tmp_path / "d8", np.random.default_rng(0).normal(size=(30, 8)))
    output = tmp_path / "m.tsv"
    with output_file_lock(str(output)):
        code = command.main([f"--source={tmp_path / 'd8'}", f"--target={tmp_path / 'd8'}",
                             f"--output={output}"])
    assert_one_line_stderr(code, capsys.readouterr().err, f"--output={output}",
                           f"is being written by another run (pid {os.getpid()})")
    assert not output.exists()


def test_flag_and_input_faults_are_one_line_errors_and_write_nothing(tmp_path, capsys):
    rng = np.random.default_rng(0)
    write_embedding_output(tmp_path / "d8", rng.normal(size=(30, 8)))
    write_embedding_output(tmp_path / "d6", rng.normal(size=(30, 6)))
    write_embedding_output(tmp_path / "empty", np.zeros((0, 8)), shards=1)
    (tmp_path / "none").mkdir()

    def mine_args(source="d8", target="d8", *extra):
        return [f"--source={tmp_path / source}", f"--target={tmp_path / target}",
                f"--output={tmp_path / 'm.tsv'}", *extra]

    for args, needles in [
            (mine_args("none", "none", "--k=0"), ["--k must be at least 1, got 0"]),
            (mine_args("none", "none"), ["MANIFEST"]),
            (mine_args("d8", "d8", "--threshold=nan"), ["--threshold"]),
            (mine_args("d8", "d6"), ["--source and --target", "differ in dimension (8 vs 6)"]),
            (mine_args("empty", "d8"), ["--source=", "has no embeddings"]),
            (mine_args("d8", "empty"), ["--target=", "has no embeddings"]),
            (mine_args("d8", "d8", "--k=-3"), ["--k"]),
            (mine_args("d8", "d8", "--memory_budget_gb=0.001"), ["memory_budget_gb=0.001"]),
            (mine_args("d8", "d8", "--index=ivfpq"), ["ivfpq needs at least 256"]),
            (mine_args("d8", "d8", "--index=ivf", "--nprobe=0"), ["nprobe"])]:
        assert_one_line_stderr(command.main(args), capsys.readouterr().err, *needles)
    assert not (tmp_path / "m.tsv").exists()
    shard = next((tmp_path / "d6").glob("run-*/embeddings-00000-*.tfrecord.gz"))
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    assert_one_line_stderr(command.main(mine_args("d8", "d6")), capsys.readouterr().err,
                           shard.name, "unreadable")


def test_the_script_with_k_zero_exits_2_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "beam_pipelines/mine_bitext.py", f"--source={tmp_path}",
         f"--target={tmp_path}", f"--output={tmp_path / 'm.tsv'}", "--k=0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert_one_line_stderr(result.returncode, result.stderr, "--k must be at least 1, got 0")


def listing(folder):
    """Every path under `folder`, relative to it."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_an_output_that_is_a_folder_is_one_line_and_nothing_is_written(tmp_path, capsys):
    """mine_bitext writes a file: an --output that is a folder, or one below a
    file, is one line naming the flag, checked before anything is written (no
    `.tmp-*`, no lock, no copy of a shard); what is there stays as it was."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "mined").mkdir()
    write_embedding_output(tmp_path / "d8", np.random.default_rng(0).normal(size=(30, 8)))
    inputs = [f"--source={tmp_path / 'd8'}", f"--target={tmp_path / 'd8'}"]
    before = listing(tmp_path)
    # The folder's line names every file a run writes beside the TSV.
    for output, needle in [("mined", "is a folder: mine_bitext writes a TSV file (with "
                            ".dead_letter.jsonl, .with_tabs.jsonl, .summary.json beside it)"),
                           ("notes.txt/out", "notes.txt is a file")]:
        assert_one_line_stderr(command.main([*inputs, f"--output={tmp_path / output}"]),
                               capsys.readouterr().err, f"--output={tmp_path / output}", needle)
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert listing(tmp_path) == before


def test_a_truncated_manifest_is_named(tmp_path, capsys):
    write_embedding_output(tmp_path / "d8", np.random.default_rng(0).normal(size=(30, 8)))
    write_embedding_output(tmp_path / "cut", np.random.default_rng(1).normal(size=(30, 8)))
    manifest = tmp_path / "cut" / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:30])
    for source, target in [("d8", "cut"), ("cut", "d8")]:
        assert_one_line_stderr(command.main([f"--source={tmp_path / source}",
                                             f"--target={tmp_path / target}",
                                             f"--output={tmp_path / 'm.tsv'}"]),
                               capsys.readouterr().err, str(manifest), "rerun embed_corpus")
    assert not (tmp_path / "m.tsv").exists()
