"""Compiling the kernels' library for this machine.

The sources beside this file are compiled with `-march=native` into the cache
(`trusted_cache`), on first use or by `python -m lealla_tf.models.kernels` (the
Makefile's setup runs it). The library's name is keyed by the sources,
TensorFlow's version and flags, the compiler and the processor, so a changed
source, TensorFlow or machine builds anew. A build holds a lock in the cache
(concurrent processes wait for one another), compiles into a partial file, and
installs it with its checksum; a cached library that does not pass
`trusted_cache.open_verified` is rebuilt with one warning line, never loaded.
"""

import fcntl
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile

import tensorflow as tf

from lealla_tf.models.kernels.trusted_cache import (
    BUILD_PREFIX,
    KernelBuildError,
    cache_dir,
    install,
    remove_partial_builds,
    trusted_folder,
    unwritable,
    valid,
    why_not_loadable,
)

SOURCES = [pathlib.Path(__file__).with_name(name)
           for name in ("fused_layers.cc", "sparse_adamw.cc")]
# 0 / false / off / no switches the kernels off (`op_library.enabled`); the
# errors here name it as the way to train without them.
SWITCH = "LEALLA_TF_FUSED_KERNELS"


def _compiler() -> str:
    """`$CXX` (default g++), or KernelBuildError when it is not on PATH."""
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise KernelBuildError(
            f"no C++ compiler {compiler!r} on PATH to build the fused training kernels "
            f"(install g++, or set CXX; {SWITCH}=0 trains without them)")
    return compiler


def _command(output: str) -> list:
    """The compiler's command line that builds the library into `output`."""
    return ([_compiler(), "-shared", "-fPIC", "-O3", "-march=native", "-DNDEBUG", "-w",
             "-fno-math-errno",  # sqrt vectorizes; nothing here reads errno
             # TensorFlow's bundled Eigen does not compile with AVX512-FP16 under
             # g++ 12 (PacketMathFP16.h: "expected initializer"), which
             # -march=native turns on for Sapphire Rapids; the kernels use no fp16.
             *(["-mno-avx512fp16"] if _has_avx512fp16() else []),
             *tf.sysconfig.get_compile_flags(), *map(str, SOURCES), "-o", output,
             *tf.sysconfig.get_link_flags()])


def _has_avx512fp16() -> bool:
    return "avx512_fp16" in _processor()


def _processor() -> str:
    """What -march=native compiles for: the processor's name and flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.machine() + platform.processor()


def library_path() -> pathlib.Path:
    """Where this source, TensorFlow, compiler and processor's library lives."""
    compiler = _compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256()
    for part in (*(source.read_bytes() for source in SOURCES), tf.__version__.encode(),
                 " ".join(_command("out")).encode(), version.encode(), _processor().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"fused_layers-{key.hexdigest()[:16]}.so"


def build(force: bool = False) -> pathlib.Path:
    """Compiles the library unless a valid one (see `valid`) is in the cache; its
    path. Concurrent builds (several processes) wait for one another."""
    path = library_path()
    path = trusted_folder(path.parent) / path.name  # refused before anything is opened
    if valid(path) and not force:
        return path
    try:
        lock = open(os.open(path.parent / ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                            | os.O_CLOEXEC, 0o644), "w")
    except OSError as error:
        raise unwritable(path.parent, error) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_partial_builds(path.parent)
        why = why_not_loadable(path)
        if why is None and not force:
            return path
        if os.path.lexists(path) and why is not None:
            print(f"warning: the cached fused kernels {path} {why}; rebuilding them",
                  file=sys.stderr, flush=True)
        else:
            print(f"compiling the fused training kernels for this machine into {path.parent} "
                  "(once)", file=sys.stderr, flush=True)
        try:
            handle, partial = tempfile.mkstemp(prefix=f"{BUILD_PREFIX}{os.getpid()}-",
                                               suffix=".so", dir=path.parent)
        except OSError as error:
            raise unwritable(path.parent, error) from None
        os.close(handle)
        try:
            done = subprocess.run(_command(partial), capture_output=True, text=True)
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line]
                names = ", ".join(source.name for source in SOURCES)
                raise KernelBuildError(
                    f"compiling {names} failed (exit {done.returncode}): "
                    + ("; ".join(errors[:3]) or done.stderr[-500:]))
            install(pathlib.Path(partial), path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    return path


