"""benchmarks/common.py, and what every benchmark script keeps to: it runs from the
repository root as a module (`python -m benchmarks.<name>`, as the processes these
tests start do), answers --help at once, and keeps one current result."""

import ast
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

from benchmarks.common import run_passing_stop_signals

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(path.stem for path in (REPO / "benchmarks").glob("*.py")
                    if path.stem not in ("__init__", "common"))


def test_at_most_ten_benchmarks_each_a_module_with_its_help_and_one_result():
    """`python -m benchmarks.<name> --help` works from the repository root with no
    sys.path edits; benchmarks/results/ holds at most one JSON per script (plus
    speed_targets' table); each script has its test file."""
    assert len(BENCHMARKS) <= 10, BENCHMARKS
    for name in BENCHMARKS:
        assert "sys.path" not in (REPO / "benchmarks" / f"{name}.py").read_text(), name
        assert (REPO / "tests" / "benchmarks" / f"test_{name}.py").is_file(), name
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    children = {name: subprocess.Popen(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=REPO, env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in BENCHMARKS}
    for name, child in children.items():
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0 and "usage:" in out, f"{name}: {err[-2000:]}"
        # The question it answers comes first.
        assert "?" in out.split("\n\n")[1], f"{name}: its --help does not open on its question"
    # main_job's runs at the budget that stands in for a CPU half as fast and at the
    # long run's 2.5 hours (issue 61).
    allowed = {f"{name}.json" for name in BENCHMARKS} | {
        "speed_targets.md", "main_job_budget17.json", "main_job_long.json"}
    kept = {path.name for path in (REPO / "benchmarks" / "results").iterdir()}
    assert kept <= allowed, sorted(kept - allowed)


def test_each_benchmarks_help_keeps_its_example_commands_line_continuations():
    """A docstring's example command split with a backslash reads as one line in
    --help unless the docstring is raw (the backslash and newline vanish)."""
    for name in BENCHMARKS:
        source = (REPO / "benchmarks" / f"{name}.py").read_text()
        module = ast.parse(source)
        docstring = ast.get_source_segment(source, module.body[0])
        if docstring and "\\\n" in docstring:
            assert docstring.startswith('r"""'), f"{name}: its docstring must be r\"\"\"...\"\"\""


CHILD = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
    print("child ready", flush=True)
    time.sleep(120)
    sys.exit(0)
""")

PARENT = textwrap.dedent(f"""
    import subprocess, sys
    from benchmarks.common import stop_signals_passed_to
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
    with stop_signals_passed_to(child.pid) as stopped:
        print("parent ready", flush=True)
        code = child.wait()
    print("child exited", code, "parent received", stopped, flush=True)
""")


def test_stopping_a_benchmark_stops_the_training_it_started():
    """A SIGTERM to the benchmark reaches its child, which stops; the benchmark
    then sees the child's status (before, stopping a sweep left its training running)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
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
    assert run_passing_stop_signals([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert run_passing_stop_signals([sys.executable, "-c", "pass"]) == 0
    # The handlers are the caller's again afterwards.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
