r"""Benchmark: the main job's real training step, as its plan stage measures it.

    python -m benchmarks.main_step --work_dir=runs/recipe \
        --output_json=benchmarks/results/main_step.json

From a main job's work directory (its teacher/, vocab.model and sample/), each
row trains the job's own student config (in-step teacher, bfloat16 where the
CPU has it, length buckets, the real sample) for --steps steps in a scratch
directory and times them, the first --warmup left out (tracing, and oneDNN's
first pass over new batch shapes), as the main job's plan does.
Rows, all in one run on one machine:

- `before`: the step of the job before the plan (32 tokens, 4 buckets), batch 64;
- `after`: today's (64 tokens, 6 buckets), batch 64;
- `length_128`: today's at the exports' 128 tokens;
- `batch_<n>`: today's at other batch sizes (AMS negatives against pairs/s);
- `ams_alone`: the comparison student's step, no teacher in it (the full
  step's time less this one is what the teacher pass and the distillation
  heads cost).

With --jit_compile each row is timed twice: as the job runs it (the fused CPU
kernels) and as `<row>_jit_compile`, the XLA-compiled step a TPU runs
(`python -m lealla_tf.train --jit_compile`). A compiled step compiles once per
padded length (`lealla_tf.train.data.fixed_lengths`), possibly after the warmup:
`median_step_seconds` leaves those steps out where the mean cannot.

    python -m benchmarks.main_step --work_dir=runs/recipe --rows=after --jit_compile \
        --output_json=benchmarks/results/main_step.json
"""

import argparse
import dataclasses
import json
import os
import tempfile

from benchmarks.common import machine, write_result


def time_steps(train, vocab_file: str, work: str, steps: int, warmup: int) -> dict:
    """Seconds a step (after `warmup`; the mean, and the median), a dev
    evaluation, and the start-up of a `steps`-step run of `train` in a scratch
    directory (removed after)."""
    import shutil
    import statistics
    import time

    from lealla_tf.train.run import train as run_training

    directory = tempfile.mkdtemp(prefix="main_step-", dir=work)
    try:
        probe = dataclasses.replace(train, train_steps=steps, checkpoint_every=steps,
                                    log_every=1, eval_every=steps, time_budget_minutes=0.0)
        start = time.time()
        result = run_training(probe, directory, vocab_file, progress=False)
        wall = time.time() - start
        with open(os.path.join(directory, "train_log.jsonl")) as f:
            seconds = [json.loads(line)["train_seconds"] for line in f]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    per_step = (seconds[-1] - seconds[warmup - 1]) / (steps - warmup)
    evaluation = (result["seconds"] - result["train_seconds"]) / 2  # at step 0 and the last
    step_seconds = [b - a for a, b in zip([0.0] + seconds, seconds)]
    return {"seconds_per_step": per_step, "evaluation_seconds": evaluation,
            "median_step_seconds": statistics.median(step_seconds[warmup:]),
            "step_seconds": [round(s, 4) for s in step_seconds],
            "start_seconds": max(0.0, wall - result["seconds"]),
            "pairs_per_second": train.global_batch_size / per_step}


def step_rows(work_dir: str, data_dir, rows, steps: int, warmup: int,
              mixed_precision=None) -> dict:
    from lealla_tf.recipe.config import COMPARISON_LEARNING_RATE, RecipeConfig
    from lealla_tf.recipe.stages import mixed_precision as default_precision
    from lealla_tf.recipe.stages import student_loss_weights, train_config

    with open(os.path.join(work_dir, "stages", "teacher.json")) as f:
        teacher = json.load(f)["result"]
    vocab = os.path.join(work_dir, "vocab.model")
    results = {}
    for name, changes in rows.items():
        changes = dict(changes)
        jit_compile = changes.pop("jit_compile", None)
        config = dataclasses.replace(RecipeConfig(work_dir=work_dir), **changes)
        precision = (default_precision(config) if mixed_precision is None else mixed_precision)
        alone = config.objective == "ams"
        train = train_config(
            dataclasses.replace(config, train_steps=1, mixed_precision=precision,
                                learning_rate=COMPARISON_LEARNING_RATE if alone
                                else config.learning_rate),
            data_dir, teacher, os.path.join(work_dir, "teacher"),
            os.path.join(work_dir, "sample"), config.objective,
            {} if alone else student_loss_weights(config), in_step=True)
        if jit_compile is not None:
            train = dataclasses.replace(train, jit_compile=jit_compile)
            changes["jit_compile"] = jit_compile
        results[name] = {**changes, "bfloat16": precision,
                         **time_steps(train, vocab, work_dir, steps, warmup)}
        print(f"{name}: {results[name]['pairs_per_second']:.1f} pairs/s "
              f"({results[name]['seconds_per_step']:.2f} s a step)", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/recipe")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--batch_sizes", default="32,128")
    parser.add_argument("--rows", default="", help="only these rows (comma-separated)")
    parser.add_argument("--steps", type=int, default=60, help="steps a row")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out")
    parser.add_argument("--jit_compile", action="store_true",
                        help="time each row also XLA-compiled (rows <row>_jit_compile)")
    args = parser.parse_args()
    from lealla_tf.recipe.config import find_data_dir

    rows = {"before": {"max_seq_length": 32, "length_buckets": 4},
            "after": {}, "length_128": {"max_seq_length": 128}}
    for size in filter(None, args.batch_sizes.split(",")):
        rows[f"batch_{size}"] = {"global_batch_size": int(size)}
    rows["ams_alone"] = {"objective": "ams"}
    if args.rows:
        rows = {name: rows[name] for name in args.rows.split(",")}
    if args.jit_compile:
        rows = {row: changes for name, fused in rows.items()
                for row, changes in ((name, fused), (f"{name}_jit_compile",
                                                      {**fused, "jit_compile": True}))}
    results = step_rows(args.work_dir, find_data_dir(args.data_dir), rows, args.steps,
                        args.warmup)
    summary = {"benchmark": "main_step", "machine": machine(), "work_dir": args.work_dir,
               "steps": args.steps, "warmup": args.warmup, "rows": results}
    if {"after", "before"} <= set(results):
        summary["after_over_before_pairs_per_second"] = (
            results["after"]["pairs_per_second"] / results["before"]["pairs_per_second"])
    if {"after", "ams_alone"} <= set(results):
        summary["teacher_and_heads_share_of_step"] = 1 - (
            results["ams_alone"]["seconds_per_step"] / results["after"]["seconds_per_step"])
    pairs = [name for name in results if f"{name}_jit_compile" in results]
    if pairs:
        summary["jit_compile_over_fused_median_step_seconds"] = {
            name: results[f"{name}_jit_compile"]["median_step_seconds"]
            / results[name]["median_step_seconds"] for name in pairs}
    write_result(args.output_json, summary)


if __name__ == "__main__":
    main()
