"""One convention for every command line: console scripts for all of them,
--help with every default, one-line flag errors, and identical thin wrappers in
export/ and beam_pipelines/."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

from lealla_tf.cli.scripts import COMMANDS, run

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRAPPERS = {"export/export_tfhub.py": "lealla_tf.cli.export",
            "export/convert_teacher.py": "lealla_tf.cli.convert_teacher",
            "export/import_checkpoint.py": "lealla_tf.cli.import_checkpoint",
            "beam_pipelines/embed_corpus.py": "lealla_tf.pipelines.embed_corpus",
            "beam_pipelines/mine_bitext.py": "lealla_tf.pipelines.mine_bitext"}


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


def test_python_dash_m_entry_points_still_run():
    for module in ("lealla_tf.train", "lealla_tf.recipe"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                             text=True, timeout=300, cwd=ROOT)
        assert out.returncode == 0 and "(default: " in out.stdout, out.stderr[-2000:]
