"""What the command lines print while they work: a quiet start-up and progress that
suits both a terminal and a log file.

`quiet_startup()` is the first thing every command line does, before TensorFlow
or Beam load: TensorFlow's C++ start-up lines (oneDNN, CUDA drivers, CPU
features, absl's "All log messages before absl::InitializeLog()", each printed
twice, and the `cuInit` error of a machine without a GPU), tensorflow_hub's
`pkg_resources is deprecated` warning and Beam's import-time and INFO logging
stay out of the output. Every setting is a default: a variable the user set
(TF_CPP_MIN_LOG_LEVEL=0 to see TensorFlow's logs again) wins, and
LEALLA_TF_VERBOSE=1 turns all of this off. Only command lines call it: a program
that imports lealla_tf keeps its own warnings filters, loggers and tqdm settings;
`import lealla_tf` only keeps TensorFlow's start-up lines from a CPU user
(`lealla_tf.tensorflow_startup.quiet_tensorflow_import`, where the import hook
both use lives).

`worker_output_filtered()` does the same for the worker processes a local Beam
runner starts (`--direct_running_mode=multi_processing`), which import Beam and
TensorFlow afresh and log at INFO: while a pipeline runs, what they write to
the stderr they inherit goes through a filter that leaves out that noise
(`lealla_tf.tensorflow_startup.is_log_noise`).

`progress_bar(...)` is what every progress display in lealla_tf goes through:
tqdm's bar where its stream (stderr) is a terminal; where it is a file or a pipe
(a log), plain newline-terminated lines instead of tqdm's carriage-return
redraws: one when the bar starts, one at most every `LEALLA_TF_PROGRESS_SECONDS`
seconds (30 by default) while it moves, one when it ends. A bar that clears
itself (`leave=False`) writes nothing unless it runs longer than that.

`PipelineProgress(poll, files)` shows a pipeline's progress while it runs: a
reading bar, then a bar of the lines processed, from what `poll()` reports.

`logged_progress(*loggers)` shows a library's INFO lines (the steps it logs as it
finishes them) on stderr while a command line runs, one line each.

May import: lealla_tf.tensorflow_startup.
"""

import contextlib
import logging
import math
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable

from lealla_tf.tensorflow_startup import (
    filter_tensorflow_import,
    gpu_driver_present,
    is_log_noise,
    min_log_level,
    verbose,
)

SECONDS_VARIABLE = "LEALLA_TF_PROGRESS_SECONDS"
DEFAULT_SECONDS = 30.0

# Cursor movements tqdm writes for nested bars: meaningless in a log.
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def progress_seconds() -> float:
    """Seconds between two progress lines in a log (`LEALLA_TF_PROGRESS_SECONDS`,
    default 30; 0: a line at every update)."""
    try:
        seconds = float(os.environ.get(SECONDS_VARIABLE, DEFAULT_SECONDS))
    except ValueError:
        return DEFAULT_SECONDS
    return seconds if math.isfinite(seconds) and seconds >= 0 else DEFAULT_SECONDS


def is_terminal(stream) -> bool:
    """Whether `stream` is an interactive terminal, or a Jupyter notebook's
    output (which draws tqdm's bar too); False for files, pipes, None."""
    if type(stream).__module__.startswith("ipykernel"):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


# Logged on the root logger as Beam is imported (BigQuery's optional client).
_BEAM_IMPORT_NOISE = ("apitools not found",)


class _DropRecords(logging.Filter):
    def __init__(self, prefixes):
        super().__init__()
        self._prefixes = tuple(prefixes)

    def filter(self, record):
        return not str(record.msg).startswith(self._prefixes)


def quiet_startup() -> None:
    """Quiets TensorFlow and Beam for a command line; call it before they are
    imported (TensorFlow reads TF_CPP_MIN_LOG_LEVEL as it loads).

    - TF_CPP_MIN_LOG_LEVEL: 3 (errors too) on a machine without an NVIDIA
      driver, where the only error TensorFlow logs at start-up is the failed
      `cuInit`; 2 (warnings and info) where there is one, so GPU errors show.
    - `import tensorflow`, when it comes, runs with stderr filtered: the
      lines its libraries print as they load below that level are left out
      (its C++ library ignores TF_CPP_MIN_LOG_LEVEL), unless the user set
      TF_CPP_MIN_LOG_LEVEL or TF_CPP_MAX_VLOG_LEVEL.
    - tensorflow_hub's `pkg_resources is deprecated` UserWarning is ignored.
    - Beam's loggers log warnings and errors only (its workers log INFO for
      every channel they open), and its import-time warning about BigQuery's
      optional client is left out.
    - TQDM_MININTERVAL: where stderr is not a terminal, any tqdm bar that does
      not go through `progress_bar` redraws at most every
      `progress_seconds()` seconds (tqdm reads TQDM_* defaults).
    """
    if verbose():
        return
    users_choice = any(name in os.environ
                       for name in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if gpu_driver_present() else "3")
    if not users_choice:
        filter_tensorflow_import(int(os.environ["TF_CPP_MIN_LOG_LEVEL"]))
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated",
                            category=UserWarning)
    if not is_terminal(sys.stderr):
        os.environ.setdefault("TQDM_MININTERVAL", f"{progress_seconds():g}")
    for name in ("apache_beam", "absl"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    root = logging.getLogger()
    if not any(isinstance(f, _DropRecords) for f in root.filters):
        root.addFilter(_DropRecords(_BEAM_IMPORT_NOISE))


def quiet_startup_if_run_as(module: str) -> None:
    """`quiet_startup()` when this process is `python -m <module>` (for a package
    whose `__init__` loads TensorFlow before its `__main__` runs)."""
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == module:
        quiet_startup()


@contextlib.contextmanager
def worker_output_filtered():
    """While in the block, file descriptor 2 (the stderr that the worker
    processes a local runner starts inherit, and that C++ code writes to) is a
    pipe whose lines a thread passes on to the real stderr, leaving out
    `is_log_noise` lines; `sys.stderr` (this process's own messages and
    progress) writes to the real stderr directly. Does nothing where sys.stderr
    is not file descriptor 2 (captured, as in tests) or LEALLA_TF_VERBOSE=1."""
    try:
        direct = sys.stderr.fileno() == 2
    except (AttributeError, ValueError, OSError):
        direct = False
    if verbose() or not direct:
        yield
        return
    min_level = min_log_level()
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    own = open(real, "w", buffering=1, encoding=sys.stderr.encoding,
               errors=sys.stderr.errors, closefd=False)
    saved = sys.stderr

    def forward():
        with open(read_end, "rb") as pipe:
            for line in pipe:  # ends when every writer (fd 2 here, the workers) is gone
                if not is_log_noise(line.decode("utf-8", "replace"), min_level):
                    os.write(real, line)

    thread = threading.Thread(target=forward, name="worker output filter", daemon=True)
    thread.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stderr = own
    try:
        yield
    finally:
        own.flush()
        sys.stderr = saved
        os.dup2(real, 2)
        thread.join(timeout=5)  # a worker that outlives the run keeps it open
        own.close()  # a stale user of it fails, rather than write to a reused fd
        if not thread.is_alive():
            os.close(real)


class _LineWriter:
    """A file for tqdm that turns its carriage-return redraws into whole lines
    (a redraw that repeats the line before it is dropped)."""

    def __init__(self, stream):
        self._stream = stream
        self._last = None

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", None) or "utf-8"

    def write(self, text) -> None:
        for part in re.split(r"[\r\n]", _ESCAPES.sub("", str(text))):
            line = part.rstrip()
            if line and line != self._last:
                self._stream.write(line + "\n")
                self._last = line

    def flush(self) -> None:
        flush = getattr(self._stream, "flush", None)
        if flush is not None:
            flush()


_LOG_BAR = None


def _log_bar_class():
    """tqdm whose status is a line without a bar: `desc: 45% (450/1000)
    [elapsed<remaining, rate, postfix]`, or with no total known, tqdm's own
    count-and-rate line."""
    global _LOG_BAR
    if _LOG_BAR is None:
        from tqdm import tqdm  # noqa: PLC0415 - see progress_bar

        class LogLines(tqdm):
            def display(self, msg=None, pos=None):
                # A redraw with nothing new (close() redraws the last line) is left out.
                state = (self.n, self.total, self.postfix, self.desc)
                if msg is None and state == getattr(self, "_shown", None):
                    return True
                if msg is None:
                    self._shown = state
                return super().display(msg, pos)

            @property
            def format_dict(self):
                values = super().format_dict
                if values.get("total"):
                    values["bar_format"] = (("{desc}: " if values.get("prefix") else "")
                                            + "{percentage:3.0f}% ({n_fmt}/{total_fmt}) "
                                            "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")
                return values

        _LOG_BAR = LogLines
    return _LOG_BAR


def progress_bar(iterable=None, *, file=None, seconds=None, **kwargs):
    """A tqdm bar (tqdm's arguments: desc, total, unit, initial, disable, leave,
    ...) on a terminal, or a bar that writes plain lines at most every `seconds`
    (default `progress_seconds()`) where `file` (default stderr) is not one.
    Either way it is a tqdm instance: iterate it, or call update / set_postfix
    / close, or use it as a context manager."""
    # tqdm reads its TQDM_* defaults as it is imported: after quiet_startup sets them.
    from tqdm import tqdm  # noqa: PLC0415 - see the line above

    stream = sys.stderr if file is None else file
    if kwargs.get("disable") or is_terminal(stream):
        return tqdm(iterable, file=stream, **kwargs)
    seconds = progress_seconds() if seconds is None else seconds
    for terminal_only in ("dynamic_ncols", "ncols", "mininterval", "maxinterval", "miniters",
                          "ascii", "bar_format"):
        kwargs.pop(terminal_only, None)
    if not kwargs.get("leave", True):
        kwargs.setdefault("delay", seconds)  # a short inner bar stays silent
    return _log_bar_class()(iterable, file=_LineWriter(stream), mininterval=seconds,
                            maxinterval=max(seconds, 1.0), miniters=1, ascii=True, **kwargs)


@contextlib.contextmanager
def logged_progress(*names: str, prefix: str = "", stream=None):
    """While in the block, the INFO (and higher) lines of the loggers `names` go
    to `stream` (default: stderr), one line each after `prefix`, as the
    command line's progress; they do not also reach the root logger's handlers. The loggers'
    levels and propagation are restored afterwards."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate))
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger, level, propagate in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


class PipelineProgress:
    """A running pipeline's progress, from a thread that calls `poll()` every
    `interval` seconds: (files read completely, lines read, lines processed)
    so far. A `reading` bar (lines, files of `files`) gives way, once every
    file is read or processing starts, to a `work` bar (lines processed, in
    `unit`s, of those read). `finish(lines_read, processed, skipped)` ends it
    at the run's final counts, the `skipped` lines left out of the total.
    With `poll` None it shows nothing. The bars close when the block ends."""

    def __init__(self, poll: Callable[[], tuple[int, int, int]] | None, files: int,
                 unit: str = "sentence", work: str = "embedding", interval: float = 1.0,
                 file=None):
        self._poll, self._files, self._unit, self._work = poll, files, unit, work
        self._interval, self._file, self._stop = interval, file, threading.Event()
        self._thread = self._reading = self._working = None

    def __enter__(self):
        if self._poll is not None:
            self._reading = progress_bar(desc="reading", unit="line", file=self._file)
            self._thread = threading.Thread(target=self._watch, name="pipeline progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_):
        self._halt()
        for bar in (self._reading, self._working):
            if bar is not None:
                bar.close()
        self._reading = self._working = None

    def _halt(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self):
        while not self._stop.wait(self._interval):
            self._show(*self._poll())

    def _show(self, files_read: int, lines_read: int, processed: int, final: bool = False):
        if self._working is None:
            self._reading.set_postfix_str(f"{files_read}/{self._files} files", refresh=False)
            self._reading.update(lines_read - self._reading.n)
            if files_read == self._files or processed or final:
                self._reading.close()
                self._working = progress_bar(desc=self._work, unit=self._unit,
                                             total=lines_read, file=self._file)
        if self._working is not None:
            self._working.update(processed - self._working.n)

    def finish(self, lines_read: int, processed: int, skipped: int = 0) -> None:
        """Ends the display at the run's final counts."""
        if self._poll is None:
            return
        self._halt()
        self._show(self._files, lines_read, self._working.n if self._working else 0, final=True)
        self._working.total = lines_read - skipped
        self._working.update(processed - self._working.n)
        self.__exit__()
