"""TensorFlow's start-up lines kept from a CPU user: an import hook on the first
`import tensorflow`, and what counts as start-up noise.

TensorFlow's C++ libraries print lines as they load (absl's "All log messages
before absl::InitializeLog()", oneDNN, CUDA drivers, each twice) before they read
TF_CPP_MIN_LOG_LEVEL, so even 3 does not hide them; and on a machine without an
NVIDIA driver the first op logs a failed `cuInit` as an error.

`quiet_tensorflow_import()` is what `import lealla_tf` does about it (and all it
does to a program's output): without an NVIDIA driver TF_CPP_MIN_LOG_LEVEL
defaults to 3, and the first `import tensorflow` runs with the lines its libraries
print below that level left out of stderr. `filter_tensorflow_import(min_level)`
is the hook alone, which `lealla_tf.progress.quiet_startup` installs for a command
line. `is_log_noise(line, min_level)` says which lines are left out: TensorFlow's,
and a local Beam worker's as it starts (`lealla_tf.progress.worker_output_filtered`).
LEALLA_TF_VERBOSE=1 (`verbose()`) turns all of it off.

May import: nothing else of lealla_tf.
"""

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

VERBOSE_VARIABLE = "LEALLA_TF_VERBOSE"

# absl's C++ log lines: severity, date, time (00:00:<epoch seconds> before absl
# is initialised), thread, file:line.
_CPP_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ [^ ]+:\d+\] ")
_CPP_SEVERITIES = "IWEF"
# Said once by each of TensorFlow's libraries before it logs its first line, and
# the second line of the CPU-feature notice.
_CPP_NOISE = ("WARNING: All log messages before absl::InitializeLog() is called",
              "To enable the following instructions:")
# Python logging's default format, as Beam's workers log: their INFO lines, and
# the warnings every local worker gives as it starts (also passed on by the
# runner, "Worker: severity: WARN ...").
_PYTHON_LOG_NOISE = re.compile(r"^(INFO|DEBUG):|^WARNING:root:apitools not found|"
                               r"No semi_persistent_directory found")


def verbose() -> bool:
    """Whether the user asked to see every log line (LEALLA_TF_VERBOSE=1)."""
    return os.environ.get(VERBOSE_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


def min_log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL as a number (0, TensorFlow's default, when unset or not one)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def gpu_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver (where TensorFlow's errors matter)."""
    return any(os.path.exists(path) for path in ("/dev/nvidiactl", "/proc/driver/nvidia"))


def is_log_noise(line: str, min_level: int) -> bool:
    """Whether `line` is start-up or worker log noise: one of TensorFlow's C++
    lines below `min_level` (TF_CPP_MIN_LOG_LEVEL: 0 info, 1 warning, 2 error;
    fatal lines always show), absl's notice before them, or a Beam worker's INFO
    line or start-up warning."""
    match = _CPP_LOG_LINE.match(line)
    if match:
        return _CPP_SEVERITIES.index(match.group(1)) < min(min_level, 3)
    if min_level > 0 and line.startswith(_CPP_NOISE):
        return True
    return bool(_PYTHON_LOG_NOISE.search(line))


@contextlib.contextmanager
def _held_stderr(min_level: int):
    """While in the block, what is written to file descriptor 2 (C++ libraries
    and Python alike) is held in a temporary file; afterwards the lines that are
    not start-up noise are written out, in order. A file, not a pipe, so that a
    library that logs much while it loads cannot block on a full pipe."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode("utf-8", "replace").splitlines(True)
                    if not is_log_noise(line, min_level)]
            if kept:
                os.write(2, "".join(kept).encode("utf-8"))


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first `import tensorflow` it hands the import
    to the real finder, with stderr filtered (`_held_stderr`) while the
    package and its libraries load. TensorFlow's own C++ library prints its
    start-up lines whatever TF_CPP_MIN_LOG_LEVEL says."""

    def __init__(self, min_level: int):
        self._min_level = min_level

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _FilteringLoader(spec.loader, self._min_level)
        return spec


class _FilteringLoader(importlib.abc.Loader):
    def __init__(self, loader, min_level: int):
        self._loader, self._min_level = loader, min_level

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        spec = module.__spec__
        spec.loader = module.__loader__ = self._loader  # the real one, once loaded
        with _held_stderr(self._min_level):
            self._loader.exec_module(module)


def filter_tensorflow_import(min_level: int) -> None:
    """The first `import tensorflow` from now on runs with stderr filtered: the
    lines TensorFlow's libraries print as they load below `min_level` (and absl's
    notice) are left out, the others written out in order once it has loaded. Does
    nothing once TensorFlow is loaded, or when the filter is in place already."""
    if "tensorflow" not in sys.modules and not any(
            isinstance(finder, _QuietTensorFlowImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport(min_level))


def quiet_tensorflow_import() -> None:
    """Keeps TensorFlow's start-up lines from a CPU user, as a command line does
    (what `import lealla_tf` does). Unless TensorFlow is loaded already or the
    user asked to see its logs (LEALLA_TF_VERBOSE=1, TF_CPP_MAX_VLOG_LEVEL):
    - without an NVIDIA driver TF_CPP_MIN_LOG_LEVEL defaults to 3 (a value the user
      set is kept), which hides the `cuInit` error;
    - the first `import tensorflow` runs with the lines its libraries print below
      that level left out of stderr (`filter_tensorflow_import`), where there is
      a stderr to filter.
    """
    if verbose() or "tensorflow" in sys.modules or "TF_CPP_MAX_VLOG_LEVEL" in os.environ:
        return
    if not gpu_driver_present():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    level = min_log_level()
    if level > 0 and _has_stderr():
        filter_tensorflow_import(level)


def _has_stderr() -> bool:
    """Whether there is a stderr to filter: a daemon's, or pythonw's, may have none,
    and holding it would then fail `import tensorflow` itself."""
    if sys.stderr is None:
        return False
    try:
        os.fstat(2)
    except OSError:
        return False
    return True
