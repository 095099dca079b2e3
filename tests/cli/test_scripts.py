"""`lealla_tf.cli.scripts` and the convention every command line keeps: a console
script for each, --help with every default, one-line flag errors, identical thin
wrappers in export/ and beam_pipelines/, no TensorFlow start-up lines, and progress
as whole lines in a log."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

from lealla_tf.cli import scripts
from lealla_tf.cli.scripts import COMMANDS, run

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRAPPERS = {"export/export_tfhub.py": "lealla_tf.cli.export",
            "export/convert_teacher.py": "lealla_tf.cli.convert_teacher",
            "export/import_checkpoint.py": "lealla_tf.cli.import_checkpoint",
            "beam_pipelines/embed_corpus.py": "lealla_tf.cli.embed_corpus",
            "beam_pipelines/mine_bitext.py": "lealla_tf.cli.mine_bitext"}


def setup_py_scripts():
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CONSOLE_SCRIPTS":
            return [elt.value for elt in node.value.generators[0].iter.elts]
    raise AssertionError("setup.py has no CONSOLE_SCRIPTS")


def test_setup_py_installs_a_console_script_for_every_command():
    assert sorted(setup_py_scripts()) == sorted(COMMANDS)


def test_the_installed_console_script_runs():
    script = pathlib.Path(sys.executable).parent / "lealla-presets"
    assert script.exists(), f"{script} is missing: reinstall (make setup) after setup.py changed"
    out = subprocess.run([str(script), "--vocabulary_size=1000"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "lealla_small" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_help_shows_the_defaults_and_a_bad_flag_is_one_line(script, capsys):
    with pytest.raises(SystemExit) as exited:
        run(script, ["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert f"usage: {script}" in help_text and "(default: " in help_text, help_text[-1500:]
    # every flag says its default, or that it is required, or states its default itself
    options = re.split(r"\n\n(?=\S)", help_text.split("\noptions:\n", 1)[1])[0]
    flags = re.findall(r"^  (--\w+)(.*(?:\n {4,}.*)*)", options, re.M)
    bare = [flag for flag, text in flags if flag != "--help" and not re.search(
        r"default|required", text, re.I)]
    assert not bare, f"{script}: flags without a default in --help: {bare}"
    assert help_text.count("(default: ") == len(re.findall(r"\(default: ", help_text))
    for bad in (["--no_such_flag=1"], ["--hel"]):  # an abbreviation is no flag either
        with pytest.raises(SystemExit) as exited:
            run(script, bad)
        assert exited.value.code == 2
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and error.startswith("error: "), error
    with pytest.raises(SystemExit) as exited:
        run(script, ["--no_such_flag=1"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith("error: ") and "--help" in error, \
        error


def test_a_flag_neither_the_pipeline_nor_beam_knows_is_refused(capsys):
    """Beam only warns about flags it cannot parse and runs on: a misspelled
    --threshold would have mined with none."""
    from lealla_tf.pipelines.options import unknown_beam_flags

    assert unknown_beam_flags(["--direct_num_workers=2", "--runner=DaskRunner",
                               "--thresold=1.2", "--bogus"]) == ["--thresold=1.2", "--bogus"]
    with pytest.raises(SystemExit) as exited:
        run("lealla-mine-bitext", ["--source=a", "--target=b", "--output=c", "--thresold=1.2"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: unrecognized arguments: --thresold=1.2") and \
        len(error.splitlines()) == 1, error


def test_the_root_wrappers_are_identical_thin_shims():
    """Each is its title, the module it runs, and the same nine lines."""
    bodies = set()
    for path, module in WRAPPERS.items():
        text = (ROOT / path).read_text()
        assert f"from {module} import main" in text, path
        docstring_end = text.index('"""', 3) + 3
        bodies.add(re.sub(re.escape(module), "MODULE", text[docstring_end:]))
    assert len(bodies) == 1, bodies


def test_every_command_line_lives_in_cli():
    assert all(module.startswith("lealla_tf.cli.") for module in COMMANDS.values()), COMMANDS


def test_a_script_of_another_name_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/lealla-frobnicate", "--help"])
    assert scripts.main() == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: lealla-frobnicate is none of the console scripts "
                            "lealla-recipe, lealla-train") and len(error.splitlines()) == 1


def test_python_dash_m_entry_points_still_run():
    for module in ("lealla_tf.train", "lealla_tf.recipe", "lealla_tf.cli.export"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                             text=True, timeout=300, cwd=ROOT)
        assert out.returncode == 0 and "(default: " in out.stdout, out.stderr[-2000:]


# --help must answer before TensorFlow loads: ruff.toml exempts
# lealla_tf/cli/ from imports at the top for this. The console script runs
# `scripts.main` as setup.py's entry point does; `python -m` runs the module's
# __main__ as Python does. No console script needs TensorFlow for its --help.
HELP_WITHOUT_TENSORFLOW = """
import runpy, sys
sys.argv = [{argv0!r}, "--help"]
try:
    {call}
except SystemExit as exited:
    code = exited.code
else:
    code = "no exit"
print("exit", code, "tensorflow", "tensorflow" in sys.modules, file=sys.stderr)
"""


def loads_tensorflow_for_help(argv0: str, call: str) -> bool:
    done = subprocess.run([sys.executable, "-c", HELP_WITHOUT_TENSORFLOW.format(
        argv0=argv0, call=call)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1:] or [""]
    assert done.returncode == 0 and last[0].startswith("exit 0 "), done.stderr[-2000:]
    assert "(default: " in done.stdout, done.stdout[-1500:]
    return last[0].endswith("tensorflow True")


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_help_answers_before_tensorflow_loads(script):
    assert not loads_tensorflow_for_help(
        f"/usr/bin/{script}", "from lealla_tf.cli.scripts import main; sys.exit(main())"), \
        f"{script} --help imported tensorflow: import it inside main() ({COMMANDS[script]})"


# Not `python -m lealla_tf.models.kernels`: Python imports a package before its
# __main__, and that package's names are the fused ops, which are TensorFlow ops
# (`lealla-kernels --help`, the same command line, is checked above).
@pytest.mark.parametrize("module", ["lealla_tf.recipe", "lealla_tf.train"])
def test_python_dash_m_help_answers_before_tensorflow_loads(module):
    assert not loads_tensorflow_for_help(
        module, f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"), \
        f"python -m {module} --help imported tensorflow"


# === What the command lines print (issue 46, item 4) ===

# TensorFlow's and absl's C++ log lines (the oneDNN and CPU-feature notices, the
# failed cuInit of a machine without a GPU), Python logging's INFO lines (Beam's),
# and tensorflow_hub's pkg_resources warning.
START_UP_NOISE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages|INFO:|"
                            r"To enable the following instructions)|cuInit|pkg_resources")


def run_as_a_user(*args, progress_seconds="0"):
    """A command line as a user starts it: without the suite's quieting variables
    (TF_CPP_MIN_LOG_LEVEL, CUDA_VISIBLE_DEVICES), stdout and stderr piped (not a
    terminal, as in a log file), a progress line at every update."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "PYTHONWARNINGS")
           and not name.startswith("TQDM_")}
    env["LEALLA_TF_PROGRESS_SECONDS"] = progress_seconds
    done = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    noise = [line for line in (done.stdout + done.stderr).splitlines()
             if START_UP_NOISE.search(line)]
    assert not noise, noise
    return done


@pytest.mark.slow
def test_embed_corpus_and_mine_bitext_print_progress_lines_and_a_summary(exported_model, tmp_path):
    (tmp_path / "in.txt").write_text("The dog is nice.\n\nDer Hund ist nett.\nI like tea.\n")
    output = tmp_path / "embeddings"
    done = run_as_a_user("beam_pipelines/embed_corpus.py", f"--input={tmp_path / 'in.txt'}",
                         f"--model={exported_model['export']}", f"--output={output}")
    assert "\r" not in done.stderr
    steps = done.stderr.splitlines()
    assert steps and all(line.startswith(("reading: ", "embedding: ")) for line in steps), steps
    assert steps[-1].startswith("embedding: 100% (3/3)")
    assert "4 lines read from 1 file" in done.stdout and "dead-lettered  1 line -> " in done.stdout
    assert f"output         {output}" in done.stdout
    assert f"ids, vectors = read_embeddings({str(output)!r})" in done.stdout

    mined = tmp_path / "mined.tsv"
    done = run_as_a_user("beam_pipelines/mine_bitext.py", f"--source={output}",
                         f"--target={output}", f"--output={mined}", "--k=1")
    assert "\r" not in done.stderr
    steps = done.stderr.splitlines()
    assert steps and all(line.startswith("mine_bitext: ") for line in steps), steps
    assert any("forward search done" in line for line in steps), steps
    assert "pairs mined from 3 source x 3 target sentences" in done.stdout
    assert f"output         {mined} (TSV" in done.stdout and str(mined) + ".dead_letter.jsonl" \
        in done.stdout
    namespace = {}
    exec(done.stdout.split("read it in Python:\n")[1].strip(), namespace)
    assert [row[1] for row in namespace["rows"]] == [row[2] for row in namespace["rows"]]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["evaluate", "export", "train", "kernels"])
def test_command_lines_start_without_tensorflow_start_up_lines(command, exported_model,
                                                               tiny_tatoeba_dir, tiny_parallel_dir,
                                                               sentence_vocab_file, tmp_path):
    """No TensorFlow start-up lines on a machine without a GPU (nor on one with
    it), and progress in a log file as whole lines."""
    args = {
        "evaluate": ["-m", "lealla_tf.cli.evaluate", f"--model={exported_model['export']}",
                     f"--tatoeba_dir={tiny_tatoeba_dir}", f"--output_json={tmp_path / 'e.json'}"],
        "export": ["export/export_tfhub.py", f"--model_dir={exported_model['model_dir']}",
                   f"--export_path={tmp_path / 'x'}"],
        # The trainer's own bar is not yet this helper's (trainer.py): --no_progress.
        "train": ["-m", "lealla_tf.cli.train", f"--model_dir={tmp_path / 'm'}",
                  f"--train_data={tiny_parallel_dir}", f"--vocab_file={sentence_vocab_file}",
                  "--objective=ams", "--encoder_overrides=num_layers=1,hidden_dim=8,num_heads=2,"
                  "intermediate_dim=8", "--global_batch_size=4", "--train_steps=1",
                  "--max_seq_length=16", "--no_progress"],
        "kernels": ["-m", "lealla_tf.models.kernels"],
    }[command]
    done = run_as_a_user(*args)
    if command != "train":
        assert "\r" not in done.stderr
