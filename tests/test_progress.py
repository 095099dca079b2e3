"""lealla_tf.progress: a bar on a terminal, plain lines in a log, a quiet start-up."""

import io
import logging
import os
import sys
import time
import warnings

import pytest

from lealla_tf import progress, tensorflow_startup


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_whole_lines_without_carriage_returns():
    log = io.StringIO()
    with progress.progress_bar(total=5, desc="embedding", unit="batch", file=log,
                               seconds=0) as bar:
        for _ in range(5):
            bar.update(1)
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("embedding:   0% (0/5)")
    assert lines[-1].startswith("embedding: 100% (5/5)")
    assert len(lines) == len(set(lines)) == 6  # one a change, none repeated
    assert all("|" not in line for line in lines)  # no bar characters in a log


def test_a_log_gets_a_line_at_most_every_n_seconds():
    log = io.StringIO()
    for _ in progress.progress_bar(range(1000), desc="steps", file=log, seconds=3600):
        pass
    lines = log.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == ["steps:   0% (0/1000)",
                                                      "steps: 100% (1000/1000)"]


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(progress.SECONDS_VARIABLE, "0.05")
    assert progress.progress_seconds() == 0.05
    log = io.StringIO()
    bar = progress.progress_bar(total=3, desc="slow", file=log)
    for _ in range(3):
        time.sleep(0.06)
        bar.update(1)
    bar.close()
    assert len(log.getvalue().splitlines()) == 4
    for bad in ("x", "-1", "nan", "inf"):
        monkeypatch.setenv(progress.SECONDS_VARIABLE, bad)
        assert progress.progress_seconds() == progress.DEFAULT_SECONDS


def test_an_unknown_total_and_a_postfix_read_as_lines():
    log = io.StringIO()
    bar = progress.progress_bar(desc="reading", unit="line", file=log, seconds=0)
    bar.set_postfix_str("1/2 files", refresh=False)
    bar.update(7)
    bar.total = 10  # known later: percentages from then on
    bar.update(3)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "7line" in lines[1] and "1/2 files" in lines[1]
    assert lines[-1].startswith("reading: 100% (10/10)")


def test_a_short_bar_that_clears_itself_writes_nothing_to_a_log():
    log = io.StringIO()
    for _ in progress.progress_bar(range(3), desc="inner", file=log, leave=False):
        pass
    assert log.getvalue() == ""


def test_a_terminal_gets_tqdm_and_disable_writes_nothing():
    terminal = Terminal()
    for _ in progress.progress_bar(range(3), desc="embedding", file=terminal):
        pass
    assert "\r" in terminal.getvalue() and "|" in terminal.getvalue()
    log = io.StringIO()
    for _ in progress.progress_bar(range(3), file=log, disable=True):
        pass
    assert log.getvalue() == ""


def test_a_notebooks_output_gets_the_bar():
    notebook_stream = type("OutStream", (io.StringIO,), {"__module__": "ipykernel.iostream"})()
    assert progress.is_terminal(notebook_stream)
    assert not progress.is_terminal(io.StringIO()) and not progress.is_terminal(None)


def test_terminal_only_arguments_are_accepted_in_a_log():
    """The trainer's bar passes dynamic_ncols; a log has no width."""
    log = io.StringIO()
    bar = progress.progress_bar(total=2, initial=1, desc="training", unit="step",
                                dynamic_ncols=True, file=log, seconds=0)
    bar.set_postfix(loss="0.5")
    bar.update(1)
    bar.close()
    assert log.getvalue().splitlines()[-1].startswith("training: 100% (2/2)")
    assert "loss=0.5" in log.getvalue()


@pytest.fixture()
def restored_logging_and_warnings():
    loggers = [logging.getLogger(name) for name in ("apache_beam", "absl")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


def test_quiet_startup_sets_defaults_that_the_users_settings_override(
        monkeypatch, restored_logging_and_warnings):
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TQDM_MININTERVAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log
    monkeypatch.setattr(progress, "gpu_driver_present", lambda: False)
    progress.quiet_startup()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"  # the cuInit error line too
    assert os.environ["TQDM_MININTERVAL"] == "30"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    progress.quiet_startup()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    monkeypatch.setattr(progress, "gpu_driver_present", lambda: True)
    progress.quiet_startup()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"  # errors of a real GPU still show


def test_quiet_startup_only_for_its_own_command_line(monkeypatch):
    calls = []
    monkeypatch.setattr(progress, "quiet_startup", lambda: calls.append(1))
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "lealla_tf.models.kernels", "--force"],
                        raising=False)
    progress.quiet_startup_if_run_as("lealla_tf.models.kernels")
    monkeypatch.setattr(sys, "orig_argv", ["python", "my_program.py"], raising=False)
    progress.quiet_startup_if_run_as("lealla_tf.models.kernels")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest"], raising=False)
    progress.quiet_startup_if_run_as("lealla_tf.models.kernels")
    assert calls == [1]


def test_logged_progress_shows_a_librarys_steps_and_restores_its_logger():
    stream = io.StringIO()
    logger = logging.getLogger("lealla_tf.test_progress")
    with progress.logged_progress(logger.name, prefix="job: ", stream=stream):
        logger.info("step %d done", 1)
        logger.debug("not shown")
    logger.info("after the block")
    assert stream.getvalue() == "job: step 1 done\n"
    assert logger.level == logging.NOTSET and logger.propagate and not logger.handlers


def test_every_progress_display_goes_through_the_helper():
    """tqdm is imported by lealla_tf.progress alone: every bar, the trainer's too, is a
    bar on a terminal and lines in a log."""
    import pathlib
    import re

    package = pathlib.Path(progress.__file__).parent
    users = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                   if re.search(r"^\s*(from tqdm|import tqdm)", path.read_text(), re.M))
    assert set(users) == {"progress.py"}, users


def test_worker_output_is_filtered_and_the_processs_own_messages_pass():
    """In a fresh process whose stderr is file descriptor 2 (in this one pytest
    captures sys.stderr, and the filter stands aside)."""
    import subprocess
    import textwrap

    worker = ("import sys; sys.stderr.write(chr(10).join(["
              "'INFO:__main__:Logging handler created.', "
              "'I0000 00:00:1795.5   12 port.cc:153] oneDNN custom operations are on.', "
              "'a worker error', '']))")
    code = textwrap.dedent(f"""
        import subprocess, sys
        from lealla_tf.progress import worker_output_filtered
        with worker_output_filtered():
            print("own message", file=sys.stderr)
            subprocess.run([sys.executable, "-c", {worker!r}])
        print("after", file=sys.stderr)
        """)
    env = {k: v for k, v in os.environ.items() if k != tensorflow_startup.VERBOSE_VARIABLE}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["own message", "a worker error", "after"]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, tensorflow_startup.VERBOSE_VARIABLE: "1"}, timeout=60)
    assert "INFO:__main__:Logging handler created." in done.stderr.splitlines()


def test_a_pipelines_progress_reads_then_processes_and_ends_at_the_final_counts(monkeypatch):
    """A reading bar while lines are read, then a bar of the lines processed
    out of those read; `finish` ends it at the run's counts, the skipped lines
    left out of the total."""
    monkeypatch.setenv(progress.SECONDS_VARIABLE, "0")
    log, states = io.StringIO(), [(0, 5, 0), (1, 12, 0), (2, 20, 3), (2, 20, 9)]
    polled = []

    def poll():
        polled.append(states[min(len(polled), len(states) - 1)])
        return polled[-1]

    with progress.PipelineProgress(poll, files=2, unit="pair", interval=0.005,
                                   file=log) as shown:
        deadline = time.time() + 20
        while len(polled) < len(states) and time.time() < deadline:
            time.sleep(0.005)
        shown.finish(lines_read=20, processed=18, skipped=2)
    lines = log.getvalue().splitlines()
    reading = [line for line in lines if line.startswith("reading: ")]
    working = [line for line in lines if line.startswith("embedding: ")]
    assert reading and working and lines.index(reading[-1]) < lines.index(working[0]), lines
    assert "1/2 files" in " ".join(reading) and reading[-1].startswith("reading: 20line"), reading
    assert working[0].startswith("embedding:   0% (0/20)"), working  # of the lines read
    assert any(line.startswith("embedding:  15% (3/20)") for line in working), working
    assert working[-1].startswith("embedding: 100% (18/18)"), working
    quiet = io.StringIO()
    with progress.PipelineProgress(None, files=2, file=quiet) as shown:
        shown.finish(lines_read=20, processed=18, skipped=2)
    assert quiet.getvalue() == ""
