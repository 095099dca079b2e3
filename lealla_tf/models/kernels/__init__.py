"""Fused CPU kernels for training `LeallaEncoder` (the C++ sources beside this file).

On a CPU, TensorFlow runs a transformer layer's elementwise work one op at a
time, and on lealla_small's training step that work (layer norms, GELU, residual
adds, dropout, softmax, transposes and their gradients) took more time than the
matmuls in bfloat16 (`benchmarks/step_profile.py`). Three ops of
`fused_layers.cc`, each with its gradient, do those blocks in one pass over
their rows:

- `attention(qkv, bias, mask, seed, num_heads, rate)`: every head's masked
  softmax attention with dropout on the probabilities, from the packed
  projection's rows to the rows the output projection reads;
- `bias_gelu(x, bias, approximate)`: GELU of `x + bias`;
- `bias_dropout_add_norm(x, bias, residual, gamma, beta, seed, rate, epsilon)`:
  layer norm of `dropout(x + bias) + residual`.

They compute in float32 whatever the tensors' type (float32 or bfloat16), draw
the dropout masks of `lealla_tf.models.layers.hash_dropout` bit for bit, and equal the
op-by-op layer within round-off (tests/models/test_kernels.py). A fourth,
`sparse_apply_adamw` (`sparse_adamw.cc`), updates a lookup table with
`lealla_tf.train.optimizers.FusedAdamW`'s arithmetic in one pass from its sparse
gradient, where decay, densifying and fused Adam took four.

The library is compiled for this machine (`-march=native`) on first use, or by
`python -m lealla_tf.models.kernels` (the Makefile's setup runs it), into
`$LEALLA_TF_KERNEL_CACHE` (default `~/.cache/lealla_tf/kernels`), keyed by the
source, TensorFlow's version and flags, the compiler and the processor, so a
changed source, TensorFlow or machine builds anew. Each library has its size and
sha256 written beside it (`<library>.sha256`) and is loaded only when both match,
so a truncated or foreign file is rebuilt (with one warning line), never loaded;
a library that lacks the ops is refused.

Loading a library runs its code, and its name is predictable, so nothing is
loaded from where another user could have put it. Before anything is opened,
the cache folder and every folder above it must belong to this user or root,
and no other user may write the cache folder (nor a folder above it, unless its
sticky bit is set, as /tmp's is): otherwise the kernels are refused with one
line naming the folder, and training runs without them. In the cache, the
library and its checksum must be regular files of this user (or root) that no
other user can write, opened without following a symlink; anything else is
rebuilt. The library is then loaded through the very descriptor that was
checked and hashed (`/proc/self/fd/N`), so it cannot be swapped in between. A
build killed midway leaves
`fused_layers-build-<pid>-*.so`, removed by the next build once that pid has
gone. `LEALLA_TF_FUSED_KERNELS=0`
turns them off; so does a machine without a C++ compiler (`$CXX`, default
g++), with one warning naming why: training then runs the op-by-op layer.
"""

import errno
import fcntl
import hashlib
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Optional

from lealla_tf.progress import quiet_startup_if_run_as

# `python -m lealla_tf.models.kernels` imports this package, and TensorFlow with it,
# before its __main__ runs: the command line is quieted here.
quiet_startup_if_run_as("lealla_tf.models.kernels")

import tensorflow as tf  # noqa: E402

SOURCES = [pathlib.Path(__file__).with_name(name)
           for name in ("fused_layers.cc", "sparse_adamw.cc")]
SWITCH = "LEALLA_TF_FUSED_KERNELS"
CACHE = "LEALLA_TF_KERNEL_CACHE"

_state = {"library": None, "failure": None, "warned": False}


class KernelBuildError(RuntimeError):
    """The fused kernels could not be compiled or loaded here (the message says why)."""


def enabled() -> bool:
    """False when `LEALLA_TF_FUSED_KERNELS` is 0 / false / off / no."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> pathlib.Path:
    if os.environ.get(CACHE):
        return pathlib.Path(os.environ[CACHE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "lealla_tf" / "kernels"


def _compiler() -> str:
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise KernelBuildError(
            f"no C++ compiler {compiler!r} on PATH to build the fused training kernels "
            f"(install g++, or set CXX; {SWITCH}=0 trains without them)")
    return compiler


def _command(output: str) -> list:
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
        import platform

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


# Every op the library must define; a library without them is not ours.
OPS = ("lealla_attention", "lealla_attention_grad", "lealla_bias_gelu", "lealla_bias_gelu_grad",
       "lealla_bias_dropout_add_norm", "lealla_bias_dropout_add_norm_grad",
       "lealla_sparse_apply_adam_w")
# A build compiles into `<BUILD_PREFIX><pid>-<random>.so` beside the library, then
# renames it; a killed build leaves that file, removed by the next build.
BUILD_PREFIX = "fused_layers-build-"
# Older versions compiled into mkstemp's `tmpXXXXXXXX.so`.
_LEGACY_PARTIAL = re.compile(r"^tmp[A-Za-z0-9_]{8}\.so$")


def checksum_path(path: pathlib.Path) -> pathlib.Path:
    """Where the size and sha256 of a built library are written, beside it."""
    return path.with_name(path.name + ".sha256")


def _fingerprint_fd(fd: int) -> str:
    digest, offset = hashlib.sha256(), 0
    while True:
        block = os.pread(fd, 1 << 20, offset)
        if not block:
            return f"{digest.hexdigest()} {offset}"
        digest.update(block)
        offset += len(block)


def _fingerprint(path: pathlib.Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _fingerprint_fd(fd)
    finally:
        os.close(fd)


# === Trust: nothing is loaded from where another user could have put it ===

def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _folder_problem(directory: str, info: os.stat_result, itself: bool) -> Optional[str]:
    """Why another user could change what `directory` holds (None: nobody can).
    A folder above the cache may be writable by others when its sticky bit keeps
    them from renaming what is not theirs (/tmp)."""
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a folder"
    if not _trusted_owner(info.st_uid):
        return (f"{directory} belongs to uid {info.st_uid}, not to this user "
                f"(uid {os.geteuid()}) or root")
    if info.st_mode & 0o022 and (itself or not info.st_mode & stat.S_ISVTX):
        return (f"other users can write {directory} "
                f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def _untrusted(folder, problem: str) -> KernelBuildError:
    return KernelBuildError(
        f"refusing to load code from the kernel cache {folder}: {problem}, so a library "
        f"there could be anyone's; make it yours alone (chmod go-w) or set {CACHE} to a "
        "folder only you can write")


def trusted_folder(folder) -> pathlib.Path:
    """The real path of the cache `folder`, created (mode 0700) where missing,
    once it and every folder above it are this user's or root's and no other
    user can change what it holds (see `_folder_problem`). KernelBuildError
    naming the folder otherwise, before anything in it is opened."""
    real = pathlib.Path(os.path.realpath(folder))
    missing, existing = [], real
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    for directory in [existing, *existing.parents]:
        try:
            info = os.lstat(directory)
        except OSError as error:
            raise _unwritable(folder, error) from None
        if directory == real and not stat.S_ISDIR(info.st_mode):
            raise _unwritable(folder, NotADirectoryError(errno.ENOTDIR, "not a folder"))
        problem = _folder_problem(str(directory), info, itself=directory == real)
        if problem:
            raise _untrusted(folder, problem)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass  # a concurrent build made it: checked as any other below
        except OSError as error:
            raise _unwritable(folder, error) from None
        problem = _folder_problem(str(directory), os.lstat(directory),
                                  itself=directory == real)
        if problem:
            raise _untrusted(folder, problem)
    return real


def _file_problem(info: os.stat_result) -> Optional[str]:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if not _trusted_owner(info.st_uid):
        return f"belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _open_checked(path) -> int:
    """A descriptor of `path`, opened without following a symlink, once it is a
    regular file of this user (or root) that no other user can write;
    `_Problem` saying why not otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _Problem("is missing") from None
    except OSError as error:
        raise _Problem("is a symbolic link" if error.errno == errno.ELOOP
                       else f"cannot be read ({error.strerror})") from None
    problem = _file_problem(os.fstat(fd))
    if problem:
        os.close(fd)
        raise _Problem(problem)
    return fd


class _Problem(Exception):
    """Why a cached library is not loaded (a phrase: "<library> {why}")."""


def _open_verified(path: pathlib.Path) -> int:
    """A descriptor of the library at `path` once it passes `_open_checked` and
    its size and sha256 match those written beside it (by a file that passes
    `_open_checked` too); `_Problem` saying why not otherwise."""
    try:
        checksum = _open_checked(checksum_path(path))
    except _Problem as problem:
        raise _Problem("has no checksum beside it" if str(problem) == "is missing"
                       else f"has a checksum beside it that {problem}") from None
    try:
        expected = os.pread(checksum, 4096, 0).decode("ascii", "replace").split()[:2]
    finally:
        os.close(checksum)
    fd = _open_checked(path)
    if len(expected) != 2 or _fingerprint_fd(fd) != " ".join(expected):
        os.close(fd)
        raise _Problem("does not match the size and sha256 written beside it when it was built")
    return fd


def _why_not_loadable(path: pathlib.Path) -> Optional[str]:
    try:
        os.close(_open_verified(path))
    except _Problem as problem:
        return str(problem)
    return None


def valid(path: pathlib.Path) -> bool:
    """Whether `path` is the library a build wrote: a regular file of this user
    that no other user can write, whose size and sha256 match those written
    beside it. A truncated library killed the process that loaded it (SIGBUS),
    a foreign one failed later, and a planted one ran its code; none is loaded."""
    return _why_not_loadable(pathlib.Path(path)) is None


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (ours or another user's)?
    except OSError as error:
        return error.errno == errno.EPERM
    return True


def _remove_partial_builds(folder: pathlib.Path) -> None:
    """Removes the partial libraries of killed builds (called holding the build
    lock): ours by name, and only where the pid in the name runs no more. An
    older version's `tmpXXXXXXXX.so` is taken as ours when it is empty (the
    compiler had not written yet) or names our ops."""
    for entry in folder.iterdir():
        name = entry.name
        if name.startswith(BUILD_PREFIX) and name.endswith(".so"):
            pid = name[len(BUILD_PREFIX):].split("-", 1)[0]
            if not pid.isdigit() or _pid_running(int(pid)):
                continue
        elif _LEGACY_PARTIAL.match(name):
            try:
                if entry.stat().st_size and b"LeallaAttention" not in entry.read_bytes():
                    continue
            except OSError:
                continue
        else:
            continue
        try:
            entry.unlink()
        except OSError:
            pass


def _unwritable(folder: pathlib.Path, error: OSError) -> KernelBuildError:
    return KernelBuildError(f"cannot write the kernel cache {folder} ({error}); "
                            f"set {CACHE} to a writable folder")


def _install(partial: pathlib.Path, path: pathlib.Path) -> None:
    """Moves a compiled library into place, its checksum first: a library that is
    there is loaded only once the checksum beside it matches. Both are made
    writable by this user alone, whatever the umask."""
    checksum = checksum_path(path)
    staged = checksum.with_name(f"{checksum.name}.{os.getpid()}.tmp")
    try:
        os.chmod(partial, 0o755)
        if staged.exists():
            staged.unlink()
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, (_fingerprint(partial) + "\n").encode("ascii"))
        finally:
            os.close(fd)
        os.replace(staged, checksum)
        os.replace(partial, path)
    except OSError as error:
        raise _unwritable(path.parent, error) from None
    finally:
        if staged.exists():
            staged.unlink()


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
        raise _unwritable(path.parent, error) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_partial_builds(path.parent)
        why = _why_not_loadable(path)
        if why is None and not force:
            return path
        if os.path.lexists(path) and why is not None:
            print(f"warning: the cached fused kernels {path} {why}; rebuilding them "
                  "(about 15 s)", file=sys.stderr, flush=True)
        else:
            print(f"compiling the fused training kernels for this machine into {path.parent} "
                  "(once; about 15 s)", file=sys.stderr, flush=True)
        try:
            handle, partial = tempfile.mkstemp(prefix=f"{BUILD_PREFIX}{os.getpid()}-",
                                               suffix=".so", dir=path.parent)
        except OSError as error:
            raise _unwritable(path.parent, error) from None
        os.close(handle)
        try:
            done = subprocess.run(_command(partial), capture_output=True, text=True)
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line]
                names = ", ".join(source.name for source in SOURCES)
                raise KernelBuildError(
                    f"compiling {names} failed (exit {done.returncode}): "
                    + ("; ".join(errors[:3]) or done.stderr[-500:]))
            _install(pathlib.Path(partial), path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    return path


def load():
    """The loaded op library (built if needed), gradients registered.
    KernelBuildError when it cannot be built or loaded here."""
    if _state["library"] is not None:
        return _state["library"]
    if _state["failure"] is not None:
        raise KernelBuildError(_state["failure"])
    try:
        path = build()
        library = _load_verified(path)
        missing = [op for op in OPS if not hasattr(library, op)]
        if missing:
            raise KernelBuildError(f"{path} is not the fused kernels' library (it lacks "
                                   f"{', '.join(missing)}); delete it to rebuild")
    except KernelBuildError as error:
        _state["failure"] = str(error)
        raise
    except (tf.errors.NotFoundError, OSError) as error:
        _state["failure"] = f"loading the fused kernels failed: {error}"
        raise KernelBuildError(_state["failure"]) from None
    _register_gradients(library)
    _state["library"] = library
    return library


def _load_verified(path: pathlib.Path):
    """tf.load_op_library of the library at `path`, checked (see `valid`) before
    it is loaded, and loaded through the descriptor that was checked."""
    try:
        fd = _open_verified(path)
    except _Problem as problem:
        raise KernelBuildError(f"the fused kernels {path} {problem}; not loaded") from None
    try:
        via = f"/proc/self/fd/{fd}"
        return tf.load_op_library(via if os.path.exists(via) else str(path))
    finally:
        os.close(fd)


def available() -> bool:
    """Whether the fused kernels can be used in this process: switched on, and
    built and loaded. The first failure is logged once as a warning with its reason."""
    if not enabled():
        return False
    try:
        load()
        return True
    except KernelBuildError as error:
        if not _state["warned"]:
            _state["warned"] = True
            print(f"warning: training without the fused kernels: {error}", file=sys.stderr)
        return False


def usable(strategy=None) -> bool:
    """`available()`, and `strategy` (default: the current one) computes on CPUs
    only: the kernels have no GPU or TPU version."""
    strategy = strategy or tf.distribute.get_strategy()
    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy: this process's devices
        devices = []
    accelerators = tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    if accelerators or any("CPU" not in device.upper() for device in devices):
        return False
    return available()


def unavailable_reason() -> Optional[str]:
    """Why `available()` is False (None when it is True)."""
    if not enabled():
        return f"{SWITCH}={os.environ.get(SWITCH)}"
    return None if available() else _state["failure"]


# === The ops ===

def _dropout_attributes(rate: float) -> dict:
    from lealla_tf.models.layers.hash_dropout import check_rate, keep_threshold

    rate = check_rate(rate)
    if rate == 0.0:
        return {"dropout_threshold": 0, "dropout_scale": 1.0}
    return {"dropout_threshold": keep_threshold(rate), "dropout_scale": 1.0 / (1.0 - rate)}


def _seed(seed):
    if seed is None:
        return tf.zeros([2], tf.int64)
    return tf.cast(seed, tf.int64)


@tf.autograph.experimental.do_not_convert
def attention(qkv, bias, mask, seed, num_heads: int, rate: float = 0.0):
    """Multi-head attention of a packed projection's rows.

    Args:
        qkv: `[batch * length, 3 * num_heads * size]` (float32 or bfloat16): each
            token's query (already scaled by 1 / sqrt(size)), key and value,
            head-major within each, before their bias.
        bias: float32 `[3 * num_heads * size]`, added to each row.
        mask: int32 `[batch, length]`, 0 at padded keys (their scores get -1e9,
            as Keras' masked softmax adds).
        seed: two integers for the dropout on the probabilities (or None when
            `rate` is 0).
        rate: dropout rate on the attention probabilities.

    Returns: `[batch * length, num_heads * size]`, heads side by side, in `qkv`'s type.
    """
    return load().lealla_attention(qkv, tf.cast(bias, tf.float32), tf.cast(mask, tf.int32),
                                   _seed(seed), num_heads=num_heads,
                                   **_dropout_attributes(rate))


@tf.autograph.experimental.do_not_convert
def bias_gelu(x, bias, approximate: bool = True):
    """GELU (tanh-approximate or exact erf) of `x + bias`, `x` `[rows, width]`."""
    return load().lealla_bias_gelu(x, tf.cast(bias, tf.float32), approximate=approximate)


@tf.autograph.experimental.do_not_convert
def bias_dropout_add_norm(x, bias, residual, gamma, beta, seed, rate: float, epsilon: float):
    """Layer norm (over the last axis, float32 statistics) of
    `dropout(x + bias) + residual`, all `[rows, width]` in one type; `gamma`,
    `beta` and `bias` `[width]` (read as float32)."""
    outputs = load().lealla_bias_dropout_add_norm(
        x, tf.cast(bias, tf.float32), residual, tf.cast(gamma, tf.float32),
        tf.cast(beta, tf.float32), _seed(seed), epsilon=epsilon, **_dropout_attributes(rate))
    return outputs[0]


@tf.autograph.experimental.do_not_convert
def sparse_apply_adamw(variable, momentum, velocity, gradient, lr, beta1_power, beta2_power,
                       beta1, beta2, epsilon, weight_decay):
    """AdamW with decoupled weight decay on `variable` (float32, rows first) from a
    `tf.IndexedSlices` `gradient`, in one pass over the table (the arithmetic of
    `lealla_tf.train.optimizers.FusedAdamW`'s decay + `ResourceApplyAdam` on the
    densified gradient; repeated indices are summed). The variables are
    resource handles; the scalars float32."""
    from lealla_tf.machine import usable_cpus

    return load().lealla_sparse_apply_adam_w(
        variable, momentum, velocity, gradient.indices, tf.cast(gradient.values, tf.float32),
        *[tf.cast(x, tf.float32) for x in (lr, beta1_power, beta2_power, beta1, beta2,
                                           epsilon, weight_decay)],
        num_threads=usable_cpus())


def _register_gradients(library) -> None:
    def dropout(op):
        return {"dropout_threshold": op.get_attr("dropout_threshold"),
                "dropout_scale": op.get_attr("dropout_scale")}

    @tf.RegisterGradient("LeallaAttention")
    def _attention_gradient(op, dcontext):
        qkv, bias, mask, seed = op.inputs
        dqkv, dbias = library.lealla_attention_grad(
            dcontext, qkv, bias, mask, seed, num_heads=op.get_attr("num_heads"), **dropout(op))
        return [dqkv, dbias, None, None]

    @tf.RegisterGradient("LeallaBiasGelu")
    def _bias_gelu_gradient(op, dy):
        x, bias = op.inputs
        return list(library.lealla_bias_gelu_grad(dy, x, bias,
                                                  approximate=op.get_attr("approximate")))

    @tf.RegisterGradient("LeallaBiasDropoutAddNorm")
    def _norm_gradient(op, dy, _dmean, _drstd):
        # mean and rstd are outputs for this gradient only (the wrapper returns y).
        x, bias, residual, gamma, beta, seed = op.inputs
        dx, dbias, dresidual, dgamma, dbeta = library.lealla_bias_dropout_add_norm_grad(
            dy, x, bias, residual, gamma, beta, seed, op.outputs[1], op.outputs[2],
            **dropout(op))
        return [dx, dbias, dresidual, dgamma, dbeta, None]
