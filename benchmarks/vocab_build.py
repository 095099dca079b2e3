"""Benchmark: learn a vocabulary from all of ../shared/data/parallel, report on tatoeba_dev.

    python benchmarks/vocab_build.py --vocab_size=32000 --output_json=benchmarks/results/vocab_32k.json

Writes time, [UNK] rate and tokens per sentence per Tatoeba language, and the machine.
"""

import argparse
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from lealla_tf.recipe import find_data_dir  # noqa: E402
from lealla_tf.vocabulary import build_vocabulary, format_report, vocabulary_report  # noqa: E402


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
    import json

    print(json.dumps({k: v for k, v in result.items() if k != leave_out}, indent=2))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--sentencepiece", action="store_true")
    parser.add_argument("--output_json", required=True)
    args = parser.parse_args()
    data_dir = find_data_dir(args.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "vocab.model" if args.sentencepiece else "vocab.txt")
        summary = build_vocabulary([str(data_dir / "parallel")], args.vocab_size, output,
                                   sentencepiece=args.sentencepiece, progress=False)
        start = time.time()
        report = vocabulary_report(summary["output"], str(data_dir / "tatoeba_dev"))
        report_seconds = time.time() - start
    print(format_report(report))
    result = {"benchmark": "vocab_build", "machine": machine(), "build": summary,
              "report_seconds": report_seconds, "tatoeba_dev": report}
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(f"built in {summary['seconds']:.1f} s; average unk rate "
          f"{100 * report['average']['unk_rate']:.2f}%, "
          f"{report['average']['tokens_per_sentence']:.2f} tokens/sentence -> {args.output_json}")


if __name__ == "__main__":
    main()
