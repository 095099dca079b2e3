r"""Benchmark: how fast is the main job's training step, and where does its time go?

    python -m benchmarks.training_step --work_dir=runs/recipe --jit_compile --profile \
        --output_json=benchmarks/results/training_step.json

From a finished main job's work directory (its stages/teacher.json, teacher/,
vocab.model and sample/), each row trains the job's own student (the recipe's
defaults, changed by any recipe flags given after `--`) for --steps steps in a
scratch directory and times them, the first --warmup left out (tracing, and
oneDNN's first pass over new batch shapes), as the job's plan stage does.
Rows (--rows picks some), all in one run on one machine:

- `job`: the main job's step (in-step teacher, bfloat16 where the CPU has it,
  length buckets, the real sample);
- `length_128`: the same at the exports' 128 tokens;
- `batch_<n>` (--batch_sizes): other batch sizes (AMS negatives against pairs/s);
- `teacher_every_row`: the job's step with the teacher on every pair of the batch
  (`--distilled_rows=1`, the job's step before it took a quarter): the job's
  step against it is `job_speedup_over_teacher_every_row`;
- `ams_alone`: the comparison student's step, no teacher in it; the job's step
  less this one is what the teacher pass and the distillation heads cost
  (`teacher_and_heads_share_of_step`), and this one over `teacher_every_row` is
  the step's teacher-free share (`teacher_free_share`, which the main job's
  planner models as `TEACHER_FREE_SHARE`).

With --jit_compile the job's step is also timed as `job_jit_compile`, the
XLA-compiled step a TPU runs (`python -m lealla_tf.train --jit_compile`) against
the fused CPU kernels the job runs. A compiled step compiles once per padded
length, possibly after the warmup: `median_step_seconds` leaves those steps out
where the mean cannot.

With --profile the `job` row runs --profile_steps more steps under TensorFlow's
profiler (after the timed ones, which it does not slow): each op's own time,
summed over the threads that ran it (ops nested in an op, such as a kernel's
ParallelFor, counted once), grouped by what it does: fused_kernels (the
`lealla_tf.models.kernels` ops), dense_matmul (the projections and the
feed-forward block), attention (per-head matmuls, softmax, reshapes),
elementwise, optimizer, embedding_lookup, compiled, other.

A quick run on a tiny work dir (what the tests do):

    python -m benchmarks.training_step --work_dir=tiny --rows=job --steps=3 --warmup=1 \
        --output_json=/tmp/step.json -- --global_batch_size=4 --max_seq_length=16 \
        --encoder_overrides=num_layers=4,num_heads=4,hidden_dim=8,intermediate_dim=16
"""

import argparse
import collections
import dataclasses
import glob
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks.common import machine, write_result

# Op groups of the profile, first match wins.
GROUPS = [
    ("fused_kernels", r"^Lealla"),
    ("attention", r"BatchMatMul|Softmax|Transpose|Unpack|Pack|Concat|Split|Reshape"),
    ("dense_matmul", r"MatMul|Einsum"),
    ("compiled", r"^_?Xla|XlaLaunch|XlaRun|Xla"),
    ("optimizer", r"ApplyAdam|AssignSubVariableOp|AssignAddVariableOp|UnsortedSegmentSum|"
                  r"^Unique|L2Loss"),
    ("embedding_lookup", r"Gather|ResourceGather"),
    ("elementwise", r"^(Mul|AddV2|Add|AddN|Sub|Sum|Mean|SquaredDifference|Square|Rsqrt|Sqrt|"
                    r"RsqrtGrad|Tanh|TanhGrad|Pow|RealDiv|Neg|BiasAdd|BiasAddGrad|Tile|SelectV2|"
                    r"Select|Cast|GreaterEqual|Maximum|Minimum|Erf|Exp|Relu|ReluGrad|"
                    r"BroadcastTo|_MklNative\w*Relu|_MklSwish)$"),
]
# Executor events that wrap ops rather than being ops.
WRAPPERS = {"Process", "ParallelFor", "ExecutorDoneCallback", "FunctionRun"}


def group_of(op_type: str) -> str:
    for name, pattern in GROUPS:
        if re.search(pattern, op_type):
            return name
    return "other"


def op_times(logdir: str, calls: int) -> dict:
    """{op type: thread-milliseconds a call} of the ops the executor ran (each op's
    own event: events nested inside another op's are left out; python's too)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0],
              "rb") as f:
        space.ParseFromString(f.read())
    totals = collections.Counter()
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if line.name.startswith("python"):
                continue
            open_ops = []  # end times of the ops enclosing the current event
            for event in sorted(line.events, key=lambda e: e.offset_ps):
                name = names.get(event.metadata_id, "")
                start, end = event.offset_ps, event.offset_ps + event.duration_ps
                while open_ops and open_ops[-1] <= start:
                    open_ops.pop()
                op_type = name.rsplit(":", 1)[-1]
                if ":" not in name or op_type in WRAPPERS:  # e.g. "Process", "x:Process"
                    continue
                if not open_ops:  # an op's own event, not one nested in an op
                    totals[op_type] += event.duration_ps
                open_ops.append(end)
    return {op: ps / 1e9 / calls for op, ps in totals.items()}


def grouped(ops: dict, wall_ms: float) -> dict:
    """The profile of `ops` ({op: thread-ms a step}): groups with their shares, top ops."""
    total = sum(ops.values()) or 1.0
    groups = collections.Counter()
    for op, ms in ops.items():
        groups[group_of(op)] += ms
    top = sorted(ops.items(), key=lambda item: -item[1])[:25]
    return {"wall_ms": wall_ms, "op_thread_ms": total,
            "groups": {g: {"thread_ms": ms, "share": ms / total}
                       for g, ms in groups.most_common()},
            "top_ops": [{"op": op, "thread_ms": ms, "group": group_of(op)} for op, ms in top]}


class Profiler:
    """A run's planner (`lealla_tf.train.launch.train(planner=)`, called after every
    step) that never plans: it starts TensorFlow's profiler after step `first`
    and stops it after step `stop`. (Not `start`: a planner's `start(steps_done)`
    is the method that resumes a recorded plan.)"""

    def __init__(self, first: int, stop: int):
        self.first, self.stop = first, stop
        self.logdir = tempfile.mkdtemp(prefix="training_step_profile_")
        self.seconds = []

    def __call__(self, measured: dict):
        import tensorflow as tf

        if measured["step"] == self.first:
            tf.profiler.experimental.start(self.logdir)
        elif measured["step"] == self.stop:
            tf.profiler.experimental.stop()
            self.seconds = measured["step_seconds"][self.first:self.stop]
        return None

    def result(self) -> dict:
        try:
            ops = op_times(self.logdir, self.stop - self.first)
        finally:
            shutil.rmtree(self.logdir, ignore_errors=True)
        return grouped(ops, 1e3 * statistics.median(self.seconds))


def time_steps(train, vocab_file: str, work: str, steps: int, warmup: int,
               profile_steps: int = 0) -> dict:
    """Seconds a step (after `warmup`; the mean, and the median), a dev
    evaluation, and the start-up of a `steps`-step run of `train` in a scratch
    directory (removed after); with `profile_steps`, that many more steps
    profiled (`profile`)."""
    from lealla_tf.train.launch import train as run_training

    total = steps + profile_steps
    profiler = Profiler(steps, total) if profile_steps else None
    directory = tempfile.mkdtemp(prefix="training_step-", dir=work)
    try:
        probe = dataclasses.replace(train, train_steps=total, checkpoint_every=total,
                                    log_every=1, eval_every=total, time_budget_minutes=0.0)
        start = time.time()
        result = run_training(probe, directory, vocab_file, progress=False, planner=profiler)
        wall = time.time() - start
        with open(os.path.join(directory, "train_log.jsonl")) as f:
            seconds = [json.loads(line)["train_seconds"] for line in f][:steps]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    per_step = (seconds[-1] - seconds[warmup - 1]) / (steps - warmup)
    evaluation = (result["seconds"] - result["train_seconds"]) / 2  # at step 0 and the last
    step_seconds = [b - a for a, b in zip([0.0] + seconds, seconds)]
    timed = {"seconds_per_step": per_step, "evaluation_seconds": evaluation,
             "median_step_seconds": statistics.median(step_seconds[warmup:]),
             "step_seconds": [round(s, 4) for s in step_seconds],
             "start_seconds": max(0.0, wall - result["seconds"]),
             "pairs_per_second": train.global_batch_size / per_step}
    if profiler is not None:
        timed["profile"] = profiler.result()
    return timed


def job_config(work_dir: str, recipe_flags):
    """The main job's `RecipeConfig` with `recipe_flags` (its command line's);
    ValueError naming a flag that is not the job's, or a malformed one."""
    from lealla_tf.recipe.command_line import recipe_config

    return dataclasses.replace(recipe_config(recipe_flags), work_dir=work_dir)


def step_rows(work_dir: str, data_dir, rows: dict, steps: int, warmup: int,
              recipe_flags=(), profile_steps: int = 0) -> dict:
    """Each row's timing: the job's student with the row's changes to its config."""
    from lealla_tf.recipe.training import (
        mixed_precision,
        student_loss_weights,
        student_train_config,
    )

    with open(os.path.join(work_dir, "stages", "teacher.json")) as f:
        teacher = json.load(f)["result"]
    vocab = os.path.join(work_dir, "vocab.model")
    base = job_config(work_dir, recipe_flags)
    results = {}
    for name, changes in rows.items():
        changes = dict(changes)
        jit_compile = changes.pop("jit_compile", None)
        config = dataclasses.replace(base, **changes)
        alone = config.objective == "ams"
        precision = mixed_precision(config)
        train = student_train_config(
            dataclasses.replace(config, train_steps=1, mixed_precision=precision,
                                learning_rate=config.comparison_learning_rate if alone
                                else config.learning_rate),
            data_dir, teacher, os.path.join(work_dir, "teacher"),
            os.path.join(work_dir, "sample"), config.objective,
            {} if alone else student_loss_weights(config), in_step=True)
        if jit_compile is not None:
            train = dataclasses.replace(train, jit_compile=jit_compile)
            changes["jit_compile"] = jit_compile
        profiled = profile_steps if name == "job" else 0
        results[name] = {**changes, "bfloat16": precision,
                         **time_steps(train, vocab, work_dir, steps, warmup, profiled)}
        print(f"{name}: {results[name]['pairs_per_second']:.1f} pairs/s "
              f"({results[name]['seconds_per_step']:.2f} s a step)", flush=True)
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/recipe",
                        help="a finished main job's work directory (make main)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--batch_sizes", default="32,128", help="the batch_<n> rows")
    parser.add_argument("--rows", default="", help="only these rows (comma-separated)")
    parser.add_argument("--steps", type=int, default=60, help="steps a row")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out")
    parser.add_argument("--jit_compile", action="store_true",
                        help="time the job's step also XLA-compiled (row job_jit_compile)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the job row's step, op by op (--profile_steps more steps)")
    parser.add_argument("--profile_steps", type=int, default=8)
    parser.add_argument("recipe_flags", nargs="*",
                        help="recipe flags for every row, after --, e.g. -- --max_seq_length=32")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 2 or not 1 <= args.warmup < args.steps or args.profile_steps < 1:
        parser.error("--warmup must be at least 1 and below --steps; --profile_steps at least 1")
    rows = {"job": {}, "length_128": {"max_seq_length": 128}}
    try:
        for size in filter(None, args.batch_sizes.split(",")):
            rows[f"batch_{int(size)}"] = {"global_batch_size": int(size)}
    except ValueError:
        parser.error(f"--batch_sizes takes comma-separated integers, got {args.batch_sizes!r}")
    rows["teacher_every_row"] = {"distilled_rows": 1.0}
    rows["ams_alone"] = {"objective": "ams"}
    if args.rows:
        unknown = [name for name in args.rows.split(",") if name not in rows]
        if unknown:
            parser.error(f"unknown --rows {unknown}; choose from {', '.join(rows)}")
        rows = {name: rows[name] for name in args.rows.split(",")}
    if (args.profile or args.jit_compile) and "job" not in rows:
        parser.error("--profile and --jit_compile go with the job row: add it to --rows")
    from lealla_tf.recipe.command_line import config_from_flags, flag_values

    try:
        flags = flag_values(args.recipe_flags)
    except ValueError as error:
        parser.error(f"the recipe flags after -- must be the main job's ({error}; python -m "
                     "lealla_tf.recipe --help)")
    try:
        config_from_flags(flags)
    except ValueError as error:
        parser.error(f"the recipe flags after --: {error}")
    missing = [path for path in ("stages/teacher.json", "teacher", "vocab.model", "sample")
               if not os.path.exists(os.path.join(args.work_dir, path))]
    if missing:
        print(f"error: --work_dir={args.work_dir} lacks {', '.join(missing)}: run the main job "
              "(make main) first", file=sys.stderr)
        return 2
    if args.jit_compile:
        rows["job_jit_compile"] = {"jit_compile": True}
    from lealla_tf.recipe.settings import find_data_dir

    results = step_rows(args.work_dir, find_data_dir(args.data_dir), rows, args.steps,
                        args.warmup, args.recipe_flags, args.profile_steps if args.profile else 0)
    summary = {"benchmark": "training_step", "machine": machine(), "work_dir": args.work_dir,
               "recipe_flags": args.recipe_flags, "steps": args.steps, "warmup": args.warmup,
               "rows": results}
    if {"job", "ams_alone"} <= set(results):
        summary["teacher_and_heads_share_of_step"] = 1 - (
            results["ams_alone"]["seconds_per_step"] / results["job"]["seconds_per_step"])
    if {"job", "teacher_every_row"} <= set(results):
        summary["job_speedup_over_teacher_every_row"] = (
            results["teacher_every_row"]["seconds_per_step"]
            / results["job"]["seconds_per_step"])
    if {"teacher_every_row", "ams_alone"} <= set(results):
        summary["teacher_free_share"] = (results["ams_alone"]["seconds_per_step"]
                                         / results["teacher_every_row"]["seconds_per_step"])
    if {"job", "job_jit_compile"} <= set(results):
        summary["jit_compile_over_fused_median_step_seconds"] = (
            results["job_jit_compile"]["median_step_seconds"]
            / results["job"]["median_step_seconds"])
    write_result(args.output_json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
