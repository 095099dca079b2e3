"""What the benchmarks share: where they ran, how they write their result, how a
stop reaches the processes they start, and the Tatoeba sentences several of
them measure on.

Every benchmark runs from the repository root as a module, e.g.

    python -m benchmarks.embedding_speed --help

and writes one JSON to `benchmarks/results/<script>.json` (see docs/benchmarks.md).
This module imports only the standard library at load time (lealla_tf and
TensorFlow inside the functions that need them), so that a benchmark's --help
and its flag errors answer at once.
"""

import contextlib
import json
import os
import signal
import subprocess


@contextlib.contextmanager
def stop_signals_passed_to(pid: int, group: bool = False):
    """While inside, a SIGTERM or SIGINT to this process is passed on to the
    child `pid` (the training a benchmark started), which stops at its next
    step and exits; the caller's wait then returns. Without it, stopping the
    benchmark left its training running. `group`: pass it to the child's
    whole process group instead (a child started with `start_new_session`,
    whose own children, Beam's workers say, must stop too).

    Yields the list of signal numbers received, for the caller to stop too
    rather than go on to its next child."""
    received = []

    def pass_on(signum, frame):
        received.append(signum)
        try:
            (os.killpg if group else os.kill)(pid, signum)
        except ProcessLookupError:  # it has already ended
            pass

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_passing_stop_signals(command, **popen_options) -> int:
    """Runs `command` (a training, say) to its end, passing a SIGTERM or SIGINT
    on to it (see `stop_signals_passed_to`); returns its exit status, or
    128 + N if signal N came after it had finished cleanly."""
    child = subprocess.Popen(command, **popen_options)
    with stop_signals_passed_to(child.pid) as stopped:
        code = child.wait()
    return 128 + stopped[0] if stopped and not code else code


def machine() -> dict:
    """Where a benchmark ran (`lealla_tf.machine.machine`)."""
    from lealla_tf.machine import machine as this_machine

    return this_machine()


def write_result(path: str, result: dict, leave_out: str = "") -> None:
    """Prints a benchmark's result (less its bulky `leave_out` entry) and writes
    it as JSON to `path`."""
    print(json.dumps({k: v for k, v in result.items() if k != leave_out}, indent=2))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


def tatoeba_sentences(data_dir, count):
    """`count` sentences of tatoeba_dev (both sides), spread evenly over its
    languages: every k-th sentence in corpus order."""
    from lealla_tf.parallel_corpus import find_tatoeba_languages, read_tatoeba

    sentences = []
    tatoeba = str(data_dir / "tatoeba_dev")
    for language in find_tatoeba_languages(tatoeba):
        source, english = read_tatoeba(tatoeba, language)
        sentences += source + english
    # Interleave languages evenly: take every k-th sentence.
    step = max(1, len(sentences) // count)
    return sentences[::step][:count]
