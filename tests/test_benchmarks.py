"""Tests of the benchmarks' shared helpers (benchmarks/vocab_build.py)."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
    print("child ready", flush=True)
    time.sleep(120)
    sys.exit(0)
""")

PARENT = textwrap.dedent(f"""
    import subprocess, sys
    sys.path.insert(0, {str(REPO)!r})
    from benchmarks.vocab_build import stop_signals_passed_to
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
    with stop_signals_passed_to(child.pid) as stopped:
        print("parent ready", flush=True)
        code = child.wait()
    print("child exited", code, "parent received", stopped, flush=True)
""")


def test_stopping_a_benchmark_stops_the_training_it_started():
    """A SIGTERM to the benchmark reaches its child, which stops; the benchmark
    then sees the child's status. (Before, `pkill -f student_recipe.py` left
    the training child running.)"""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    seen = set()
    while seen != {"parent ready", "child ready"}:
        line = parent.stdout.readline()
        assert line, f"ended early, having printed {seen}"
        seen.add(line.strip())
    parent.send_signal(signal.SIGTERM)
    out, _ = parent.communicate(timeout=60)
    assert f"child exited 7 parent received [{int(signal.SIGTERM)}]" in out
    assert parent.returncode == 0


def test_a_child_run_to_its_end_gives_its_exit_status():
    from benchmarks.vocab_build import run_passing_stop_signals

    assert run_passing_stop_signals([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert run_passing_stop_signals([sys.executable, "-c", "pass"]) == 0
    # The handlers are the caller's again afterwards.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
