"""Compiling the kernels' library (lealla_tf.models.kernels.native_build): a name keyed by
what it is built from, a failed compile named in one line, and the setup step going on."""

import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from lealla_tf.models import kernels
from lealla_tf.models.kernels import native_build

if shutil.which(os.environ.get("CXX", "g++")) is None:  # pragma: no cover - CI has g++
    pytest.skip("no C++ compiler to build the fused kernels", allow_module_level=True)
if tf.config.list_physical_devices("GPU"):  # pragma: no cover - CI is a CPU
    pytest.skip("the fused kernels are CPU-only; TensorFlow sees a GPU here",
                allow_module_level=True)


def test_a_failed_compile_is_named_and_the_setup_step_goes_on(tmp_path):
    """`python -m lealla_tf.models.kernels` (make setup): a compiler error is one line
    with the compiler's own error; exit 0 (training falls back), 1 with --strict."""
    compiler = tmp_path / "broken-g++"
    compiler.write_text("#!/bin/sh\n"
                        "[ \"$1\" = --version ] && { echo broken 1.0; exit 0; }\n"
                        "echo 'fused_layers.cc:1:1: error: this compiler is broken' >&2\n"
                        "exit 1\n")
    compiler.chmod(0o755)
    environment = {**os.environ, "CXX": str(compiler), kernels.CACHE: str(tmp_path / "cache")}
    for flags, code in (([], 0), (["--strict"], 1)):
        done = subprocess.run([sys.executable, "-m", "lealla_tf.models.kernels", *flags],
                              capture_output=True, text=True, env=environment, timeout=300)
        assert done.returncode == code, done.stderr[-2000:]
        assert "not built: compiling fused_layers.cc, sparse_adamw.cc failed (exit 1): " \
               "fused_layers.cc:1:1: error: this compiler is broken" in done.stderr
    assert not list((tmp_path / "cache").glob("*.so"))  # no half-written library left


def fake_compiler(folder, version):
    compiler = folder / f"g++-{version}"
    compiler.write_text(f"#!/bin/sh\necho fake {version}\n")
    compiler.chmod(0o755)
    return str(compiler)


def test_the_librarys_name_changes_with_the_compiler_and_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(kernels.CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, "1.0"))
    first = kernels.library_path()
    assert first.parent == tmp_path / "cache" and first.name.startswith("fused_layers-")
    assert kernels.library_path() == first  # the same inputs, the same name
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, "2.0"))
    assert kernels.library_path() != first
    monkeypatch.setattr(native_build, "_processor", lambda: "model name: another\n")
    assert kernels.library_path().name != first.name


def test_the_command_compiles_for_this_machine(monkeypatch):
    command = native_build._command("out.so")
    assert "-march=native" in command and command[command.index("-o") + 1] == "out.so"
    assert all(str(source) in command for source in kernels.SOURCES)
    assert set(tf.sysconfig.get_compile_flags()) <= set(command)
    monkeypatch.setattr(native_build, "_processor", lambda: "flags: avx512f avx512_fp16\n")
    assert "-mno-avx512fp16" in native_build._command("out.so")
    monkeypatch.setattr(native_build, "_processor", lambda: "flags: avx2\n")
    assert "-mno-avx512fp16" not in native_build._command("out.so")


def test_no_compiler_on_path_is_named_with_the_switch(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(kernels.KernelBuildError,
                       match="no C.. compiler .*LEALLA_TF_FUSED_KERNELS=0"):
        kernels.build()
