"""The kernel cache (lealla_tf.models.kernels.trusted_cache): a library is loaded only
from a folder and a file no other user could have written, and only when its size
and sha256 match those written beside it; what killed builds leave is cleared."""

import hashlib
import os
import pathlib
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import dead_pid

from lealla_tf.models import kernels
from lealla_tf.models.kernels import trusted_cache

if shutil.which(os.environ.get("CXX", "g++")) is None:  # pragma: no cover - CI has g++
    pytest.skip("no C++ compiler to build the fused kernels", allow_module_level=True)
if tf.config.list_physical_devices("GPU"):  # pragma: no cover - CI is a CPU
    pytest.skip("the fused kernels are CPU-only; TensorFlow sees a GPU here",
                allow_module_level=True)


@pytest.fixture()
def copying_compiler(tmp_path):
    """A `$CXX` that "compiles" by copying the real library (built once in the
    usual cache), and the environment of a fresh cache that uses it."""
    real = kernels.build()
    compiler = tmp_path / "copying-g++"
    compiler.write_text("#!/bin/sh\n"
                        "[ \"$1\" = --version ] && { echo copying 1.0; exit 0; }\n"
                        "while [ \"$1\" != -o ]; do shift; done\n"
                        f"cp '{real}' \"$2\"\n")
    compiler.chmod(0o755)
    environment = {**os.environ, "CXX": str(compiler), kernels.CACHE: str(tmp_path / "cache")}
    script = (f"import os; os.environ.update({environment!r}); "
              "from lealla_tf.models import kernels; print(kernels.library_path())")
    path = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environment, timeout=300).stdout.split()[-1]
    return {"real": real, "env": environment, "library": pathlib.Path(path)}


def run_kernels(environment, *args):
    return subprocess.run([sys.executable, "-m", "lealla_tf.models.kernels", *args],
                          capture_output=True, text=True, env=environment, timeout=300)


def warnings(stderr):
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def test_a_truncated_or_foreign_cached_library_is_rebuilt_not_loaded(copying_compiler):
    """A truncated cached library killed every process that loaded it (SIGBUS, exit
    135); a foreign one gave an AttributeError. Each is now rebuilt, with one
    warning line, because it does not match the checksum written beside it."""
    environment, library = copying_compiler["env"], copying_compiler["library"]
    done = run_kernels(environment, "--strict")
    assert done.returncode == 0 and done.stdout.strip().endswith(str(library)), done.stderr
    assert kernels.checksum_path(library).read_text().split() == [
        hashlib.sha256(library.read_bytes()).hexdigest(), str(library.stat().st_size)]
    foreign = pathlib.Path(np.linalg._umath_linalg.__file__).read_bytes()
    for damaged, why in ((library.read_bytes()[:library.stat().st_size // 2],
                          "does not match the size and sha256"), (foreign, "does not match")):
        library.write_bytes(damaged)
        done = run_kernels(environment, "--strict")
        assert done.returncode == 0, done.stderr[-2000:]
        assert len(warnings(done.stderr)) == 1 and why in warnings(done.stderr)[0], done.stderr
        assert library.read_bytes() == copying_compiler["real"].read_bytes()
        assert kernels.valid(library)
    # Without its checksum (a library of an older version) it is rebuilt too.
    kernels.checksum_path(library).unlink()
    done = run_kernels(environment, "--strict")
    assert done.returncode == 0 and "has no checksum" in warnings(done.stderr)[0]
    assert kernels.valid(library)


def test_a_killed_builds_partial_library_is_removed_by_the_next_build(copying_compiler):
    """Only partial libraries that are ours (by name) and whose builder has exited."""
    environment, library = copying_compiler["env"], copying_compiler["library"]
    cache = library.parent
    cache.mkdir(parents=True)
    ours_killed = cache / f"{kernels.BUILD_PREFIX}{dead_pid()}-abc123.so"
    ours_running = cache / f"{kernels.BUILD_PREFIX}{os.getpid()}-def456.so"
    legacy_empty = cache / "tmpa1b2c3d4.so"  # an older version's mkstemp name, not yet written
    legacy_ours = cache / "tmpe5f6g7h8.so"
    not_ours = [cache / "tmpzzzzzzzz.so", cache / "other.so", cache / "notes.txt"]
    for path in (ours_killed, ours_running, legacy_empty):
        path.write_bytes(b"")
    legacy_ours.write_bytes(b"\x7fELF...LeallaAttention...")
    for path in not_ours:
        path.write_bytes(b"someone else's")
    done = run_kernels(environment, "--strict")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not ours_killed.exists() and not legacy_empty.exists() and not legacy_ours.exists()
    assert ours_running.exists() and all(path.exists() for path in not_ours)
    assert kernels.valid(library)
    assert not list(cache.glob(f"{kernels.BUILD_PREFIX}*-*.so.sha256*"))


# === A cache another user can write is never loaded from ===

PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("planted code ran\n", f); fclose(f); }
}
"""


def plant(path: pathlib.Path, marker: pathlib.Path) -> None:
    """A library at `path` whose constructor writes `marker`, with the size and
    sha256 a build would have written beside it."""
    source = path.with_name("planted.c")
    path.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(PLANTED % marker)
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(path)], check=True)
    source.unlink()
    kernels.checksum_path(path).write_text(trusted_cache.fingerprint(path) + "\n")


def planted_library(monkeypatch, cache=None, xdg=None):
    """The environment of a cache (`$LEALLA_TF_KERNEL_CACHE`, or under
    `$XDG_CACHE_HOME`) and the predictable path a planted library takes there."""
    environment = {k: v for k, v in os.environ.items() if k not in (kernels.CACHE,
                                                                    "XDG_CACHE_HOME")}
    monkeypatch.delenv(kernels.CACHE, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    if cache is not None:
        environment[kernels.CACHE] = str(cache)
        monkeypatch.setenv(kernels.CACHE, str(cache))
    if xdg is not None:
        environment["XDG_CACHE_HOME"] = str(xdg)
        monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    return environment, kernels.library_path()


@pytest.mark.parametrize("where", ["cache", "xdg"])
def test_a_planted_library_in_a_folder_others_can_write_never_runs(tmp_path, monkeypatch,
                                                                   where):
    """`$LEALLA_TF_KERNEL_CACHE` (or `$XDG_CACHE_HOME`) at a world-writable folder: a
    library planted there under the predictable name, its checksum beside it, ran its
    constructor inside training. The folder is now refused before anything is
    loaded: training falls back with one warning naming the folder, and
    `python -m lealla_tf.models.kernels --strict` exits 1 naming it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    marker = tmp_path / "planted-code-ran"
    environment, library = planted_library(monkeypatch, **{where: shared})
    plant(library, marker)
    shared.chmod(0o777)  # anyone may write here (no sticky bit)
    script = ("from lealla_tf.models import kernels\n"
              "print('available', kernels.available(), kernels.usable())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert not marker.exists(), "the planted library's code ran"
    assert done.returncode == 0, done.stderr[-2000:]
    assert "available False False" in done.stdout
    lines = warnings(done.stderr)
    assert len(lines) == 1 and str(shared) in lines[0] and "other users can write" in lines[0], \
        done.stderr
    done = run_kernels(environment, "--strict")
    assert not marker.exists(), "the planted library's code ran"
    assert done.returncode == 1 and str(shared) in done.stderr, done.stderr


@pytest.mark.parametrize("fault", ["group_writable", "symlink", "foreign_owner"])
def test_a_cached_library_others_could_have_written_is_rebuilt_not_loaded(
        copying_compiler, tmp_path, fault):
    """In a folder of our own, a library file another user could have written (or
    a symlink to one elsewhere) is not loaded even with a matching checksum: it
    is rebuilt, with one warning line naming it."""
    environment, library = copying_compiler["env"], copying_compiler["library"]
    marker = tmp_path / "planted-code-ran"
    if fault == "symlink":
        elsewhere = tmp_path / "elsewhere" / library.name
        plant(elsewhere, marker)
        library.parent.mkdir(parents=True)
        library.symlink_to(elsewhere)
        kernels.checksum_path(library).write_text(trusted_cache.fingerprint(elsewhere) + "\n")
    else:
        plant(library, marker)
        if fault == "group_writable":
            library.chmod(0o775)
        else:
            if os.geteuid() != 0:
                pytest.skip("only root can give a file to another user")
            os.chown(library, 65534, 65534)
    done = run_kernels(environment, "--strict")
    assert not marker.exists(), "the planted library's code ran"
    assert done.returncode == 0, done.stderr[-2000:]
    lines = warnings(done.stderr)
    assert len(lines) == 1 and str(library) in lines[0] and "rebuilding" in lines[0], done.stderr
    assert not library.is_symlink()
    assert library.read_bytes() == copying_compiler["real"].read_bytes()
    assert kernels.valid(library)


# === The checks themselves, without a build ===

def test_a_folder_is_trusted_only_when_no_other_user_can_change_it(tmp_path):
    made = kernels.trusted_folder(tmp_path / "a" / "b")
    assert made == (tmp_path / "a" / "b").resolve()
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700  # created for this user alone
    (tmp_path / "a" / "b").chmod(0o775)
    with pytest.raises(kernels.KernelBuildError, match="other users can write .*chmod go-w"):
        kernels.trusted_folder(tmp_path / "a" / "b")
    # a folder above it that others may write is fine with the sticky bit (as /tmp)
    (tmp_path / "a" / "b").chmod(0o700)
    (tmp_path / "a").chmod(0o777 | stat.S_ISVTX)
    assert kernels.trusted_folder(tmp_path / "a" / "b") == made
    (tmp_path / "a").chmod(0o777)
    with pytest.raises(kernels.KernelBuildError, match=str(tmp_path / "a")):
        kernels.trusted_folder(tmp_path / "a" / "b")
    (tmp_path / "a").chmod(0o755)
    (tmp_path / "file").write_text("")
    with pytest.raises(kernels.KernelBuildError, match="cannot write the kernel cache"):
        kernels.trusted_folder(tmp_path / "file")


def test_a_library_is_valid_only_with_its_own_checksum_beside_it(tmp_path):
    library = tmp_path / "fused_layers-0123.so"
    library.write_bytes(b"\x7fELF a library")
    assert trusted_cache.why_not_loadable(library) == "has no checksum beside it"
    kernels.checksum_path(library).write_text(trusted_cache.fingerprint(library) + "\n")
    assert kernels.valid(library)
    assert trusted_cache.fingerprint(library).split() == [
        hashlib.sha256(library.read_bytes()).hexdigest(), str(library.stat().st_size)]
    library.write_bytes(b"\x7fELF another library")
    assert "does not match the size and sha256" in trusted_cache.why_not_loadable(library)
    kernels.checksum_path(library).write_text(trusted_cache.fingerprint(library) + "\n")
    library.chmod(0o664)
    assert "can be written by other users" in trusted_cache.why_not_loadable(library)
    library.chmod(0o644)
    link = tmp_path / "link.so"
    link.symlink_to(library)
    kernels.checksum_path(link).write_text(trusted_cache.fingerprint(library) + "\n")
    assert trusted_cache.why_not_loadable(link) == "is a symbolic link"


def test_install_puts_the_checksum_then_the_library_for_this_user_alone(tmp_path):
    partial = tmp_path / f"{kernels.BUILD_PREFIX}{os.getpid()}-x.so"
    partial.write_bytes(b"\x7fELF built")
    partial.chmod(0o600)
    library = tmp_path / "fused_layers-0123.so"
    trusted_cache.install(partial, library)
    assert not partial.exists() and kernels.valid(library)
    for path in (library, kernels.checksum_path(library)):
        assert not stat.S_IMODE(path.stat().st_mode) & 0o022, path
    assert not list(tmp_path.glob("*.tmp"))
