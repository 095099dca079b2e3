r"""Benchmark: what does the main job give a new user, from a clean clone, install
included: its scores, its speed against the teacher, its stages' minutes?

    python -m benchmarks.main_job --output_json=benchmarks/results/main_job.json

Clones this repository's last commit (what a user gets: no uncommitted change)
into --clone_dir, runs `make main` there (the venv's install, the kernels'
build, then `python -m lealla_tf.recipe` with --main_flags) and copies the job's
own `runs/recipe/report/report.json`, unchanged, to --output_json; prints the
wall time of the whole command. Nothing else should run on the machine: the
job plans its steps from its own measured step time.

A quick run (what the tests do): `--repository=<a tiny git repository whose
Makefile's main target writes runs/recipe/report/report.json>`.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from benchmarks.common import run_passing_stop_signals

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPORT = os.path.join("runs", "recipe", "report", "report.json")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--clone_dir", default="/tmp/lealla_tf_clean_clone",
                        help="a new directory for the clone (removed after, unless --keep)")
    parser.add_argument("--repository", default=str(ROOT), help="what to clone")
    parser.add_argument("--main_flags", default="",
                        help="the job's flags (make main MAIN_FLAGS=...), not --work_dir")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its runs/")
    args = parser.parse_args(argv)
    if os.path.exists(args.clone_dir):
        parser.error(f"--clone_dir={args.clone_dir} exists; give a new directory")
    if "--work_dir" in args.main_flags:
        parser.error("--main_flags may not move the job's --work_dir: its report is read from "
                     f"{REPORT}")
    subprocess.run(["git", "clone", "--quiet", args.repository, args.clone_dir], check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.clone_dir, check=True,
                            capture_output=True, text=True).stdout.strip()
    command = ["make", "main", f"MAIN_FLAGS={args.main_flags}"]
    print(f"{commit[:12]}: {' '.join(command)} in {args.clone_dir}", flush=True)
    start = time.time()
    code = run_passing_stop_signals(command, cwd=args.clone_dir)
    minutes = (time.time() - start) / 60
    try:
        if code:
            print(f"error: make main exited with status {code} after {minutes:.1f} min; the "
                  f"clone is kept in {args.clone_dir}", file=sys.stderr)
            return code
        with open(os.path.join(args.clone_dir, REPORT), encoding="utf-8") as f:
            report = json.load(f)  # a whole report, or an error here
        os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
        shutil.copyfile(os.path.join(args.clone_dir, REPORT), args.output_json)
    finally:
        if not (code or args.keep):
            shutil.rmtree(args.clone_dir, ignore_errors=True)
    print(f"main job at {commit[:12]}: {minutes:.1f} min wall with the install; the recipe "
          f"{report.get('total_seconds', 0) / 60:.1f} min; {args.output_json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
