"""`lealla-kernels` (`lealla_tf.cli.build_kernels`): build, report, and exit 0 unless
--strict when the kernels cannot be built. The compiler is not run here (its
tests are tests/models/test_native_build.py and test_op_library.py): `build` and
`load` are stand-ins."""

import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from lealla_tf.cli.build_kernels import main
from lealla_tf.models import kernels


@pytest.fixture()
def calls(monkeypatch):
    made = []
    monkeypatch.setattr(kernels, "build", lambda force=False: made.append(("build", force))
                        or "/cache/fused.so")
    monkeypatch.setattr(kernels, "load", lambda: made.append(("load",)))
    return made


def test_a_built_library_is_loaded_and_its_path_printed(calls, capsys):
    assert main([]) == 0
    assert calls == [("build", False), ("load",)]
    assert capsys.readouterr().out.strip() == "lealla_tf.models.kernels: /cache/fused.so"
    calls.clear()
    assert main(["--force"]) == 0
    assert calls[0] == ("build", True)


@pytest.mark.parametrize("strict,code", [(False, 0), (True, 1)])
def test_a_machine_that_cannot_build_says_why_and_fails_only_when_strict(monkeypatch, capsys,
                                                                      strict, code):
    def cannot(force=False):
        raise kernels.KernelBuildError("no C++ compiler g++")

    monkeypatch.setattr(kernels, "build", cannot)
    assert main(["--strict"] if strict else []) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "lealla_tf.models.kernels: not built: no C++ compiler g++"


def test_python_dash_m_of_the_kernels_package_runs_this_command_line():
    done = subprocess.run([sys.executable, "-m", "lealla_tf.models.kernels", "--help"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: lealla-kernels") and "--strict" in done.stdout
