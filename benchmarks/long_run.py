r"""Benchmark: what does the main job's recipe reach when it trains longer, along
its curve on every Tatoeba dev pair and on the held-out news set?

    python -m benchmarks.long_run --train_steps=2000 --work_dir=runs/long \
        --output_json=benchmarks/results/long_run.json

Runs the main job (`python -m lealla_tf.recipe`, today's recipe: its student,
teacher, sample, lengths and rates) with fixed --train_steps, no AMS-alone
comparison, and every checkpoint kept; the job exports the last one and
reports it as `make main` does. Then each kept checkpoint of the student is
evaluated as the job evaluates its export: P@1 on all tatoeba_dev pairs, and
BUCC-protocol F1 and P@1 by length band on the news set. A rerun reuses the
job's finished stages (its work directory) and only evaluates again.

With --branches (e.g. 960,1440 of 2,400: multiples of the job's checkpoint
spacing, a fifth of its steps) the run is a constant-rate run with cooldown
branches: the job's rate holds at its peak after warmup (warmup-stable-decay)
and decays over the last --cooldown of its steps; each branch point's
checkpoint is resumed in a directory of its own with an end of
point / (1 - cooldown) steps and a decay over the steps past the point
(`lealla_tf.train.schedules.WarmupLinearDecay`'s decay_fraction), so one run
gives fully decayed points at every branch's end and the job's; the curve
then holds the trunk at each point, each branch's end and the job's end.

Recipe flags after `--` go to the job: a larger sample asks whether the
plateau is the sample's size (`-- --sample_pairs=200000`), and tiny settings
make a quick run (`-- --data_dir=<tiny> --sample_pairs=120
--encoder_overrides=num_layers=2,hidden_dim=16,num_heads=2,intermediate_dim=32`).
"""

import argparse
import json
import os
import sys
import time

from benchmarks.common import machine, run_passing_stop_signals, write_result
from lealla_tf.recipe.planner import planned_every


class CheckpointModels:
    """The recipe's stages load models by name through `.get`; here a name is a
    checkpoint prefix of one model directory."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir

    def get(self, checkpoint: str):
        from lealla_tf import load_embedder

        return load_embedder(self.model_dir, checkpoint=checkpoint)


def kept_checkpoints(model_dir: str) -> list:
    """[(step, checkpoint prefix)] of the trainer's kept checkpoints, oldest first."""
    import tensorflow as tf

    from lealla_tf.models.model_dir import CHECKPOINT_DIR

    state = tf.train.get_checkpoint_state(os.path.join(model_dir, CHECKPOINT_DIR))
    if state is None:
        raise FileNotFoundError(f"no checkpoints in {model_dir}")
    return sorted((int(path.rsplit("-", 1)[1]), path)
                  for path in state.all_model_checkpoint_paths)


def checkpoint_curve(report: dict, model_dir: str) -> list:
    """Each kept checkpoint's Tatoeba (all pairs) and news figures."""
    curve = []
    for step, checkpoint in kept_checkpoints(model_dir):
        curve.append({"step": step, **point_scores(report, model_dir, checkpoint)})
        print(f"step {step}: Tatoeba P@1 {100 * curve[-1]['tatoeba_dev_all_p_at_1']:.2f}, "
              f"news F1 {100 * (curve[-1]['news_f1'] or 0):.1f}", flush=True)
    return curve


def cooldown_end(point: int, cooldown: float) -> int:
    """The end of a branch from `point` whose decay is `cooldown` of its length."""
    return int(round(point / (1.0 - cooldown)))


def decay_fraction(steps: int, decay_steps: int, warmup: int) -> float:
    """The schedule's decay_fraction that decays over the last `decay_steps`."""
    return min(1.0, decay_steps / max(1, steps - warmup))


def cooldown_branch(trunk_dir: str, point: int, end: int, branch_dir: str) -> str:
    """Resumes the trunk's checkpoint at `point` in `branch_dir` (a copy of it)
    with `end` steps and the rate decaying from `point` on; returns the
    checkpoint prefix at `end`. A finished branch is reused."""
    import dataclasses
    import shutil

    import keras
    import tensorflow as tf

    from lealla_tf.configs import TrainConfig, config_from_dict
    from lealla_tf.models.model_dir import CHECKPOINT_DIR, CONFIG_FILE, read_model_config
    from lealla_tf.train.launch import train

    checkpoints = os.path.join(branch_dir, CHECKPOINT_DIR)
    if not os.path.exists(os.path.join(branch_dir, CONFIG_FILE)):
        # config.json comes last: its presence says the copy is whole (a copy
        # cut by a kill starts again; without its checkpoint a run would
        # start from step 0).
        stored = read_model_config(trunk_dir)
        prefix = os.path.join(trunk_dir, CHECKPOINT_DIR, f"ckpt-{point}")
        if not tf.io.gfile.glob(prefix + ".*"):
            raise FileNotFoundError(f"the trunk kept no checkpoint at step {point}: {prefix}")
        shutil.rmtree(branch_dir, ignore_errors=True)
        os.makedirs(checkpoints)
        for path in tf.io.gfile.glob(prefix + ".*"):
            shutil.copy2(path, checkpoints)
        tf.compat.v1.train.update_checkpoint_state(checkpoints, f"ckpt-{point}")
        with open(os.path.join(branch_dir, "branch.json"), "w") as f:
            json.dump({"trunk": os.path.abspath(trunk_dir), "point": point, "end": end}, f)
        names = sorted(os.listdir(trunk_dir), key=lambda name: name == CONFIG_FILE)
        for name in names:  # the vocabulary, then config.json
            if os.path.isfile(os.path.join(trunk_dir, name)) and not name.endswith(".jsonl"):
                shutil.copy2(os.path.join(trunk_dir, name), branch_dir)
    else:
        stored = read_model_config(branch_dir)
    config = config_from_dict(TrainConfig, {k: v for k, v in stored.items()
                                            if k in {f.name for f in
                                                     dataclasses.fields(TrainConfig)}})
    warmup = config.optimizer.warmup_steps
    config = dataclasses.replace(
        config, train_steps=end, eval_every=end - point, checkpoint_every=end - point,
        optimizer=dataclasses.replace(config.optimizer,
                                      decay_fraction=decay_fraction(end, end - point, warmup)))
    final = os.path.join(checkpoints, f"ckpt-{end}")
    if not tf.io.gfile.glob(final + ".*"):
        print(f"branch {point} -> {end}: {end - point} steps of cooldown", flush=True)
        train(config, branch_dir, None, None)
        # Training set the global dtype policy; the job evaluates in float32.
        keras.mixed_precision.set_dtype_policy("float32")
    return final


def point_scores(report: dict, model_dir: str, checkpoint: str) -> dict:
    """One checkpoint's Tatoeba (all pairs) and news figures, as the job scores."""
    from lealla_tf.evaluation.news import NEWS_PRIMARY_METRIC
    from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC
    from lealla_tf.recipe.evaluations import evaluate_stage, news_stage

    models = CheckpointModels(model_dir)
    start = time.time()
    tatoeba = evaluate_stage({"student": (checkpoint, 0)},
                             os.path.join(report["data_dir"], "tatoeba_dev"), models)["student"]
    news = news_stage({"student": checkpoint}, os.path.join(report["work_dir"], "news"),
                      report["news_set"]["languages"], report["vocabulary"]["output"],
                      models).get("student", {})
    return {"tatoeba_dev_all_p_at_1": tatoeba[TATOEBA_PRIMARY_METRIC],
            "news_f1": news.get(NEWS_PRIMARY_METRIC),
            "news_length_p_at_1": news.get("news_length/average_p_at_1"),
            "seconds": time.time() - start}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/long")
    parser.add_argument("--train_steps", type=int, default=2000)
    parser.add_argument("--checkpoints", type=int, default=8,
                        help="checkpoints along the run, each evaluated on all pairs")
    parser.add_argument("--branches", default="",
                        help="constant-rate trunk: cooldown branches at these steps, e.g. 800,1600")
    parser.add_argument("--cooldown", type=float, default=0.2,
                        help="with --branches: the share of each point's steps that decays")
    parser.add_argument("--warmup_steps", type=int, default=None,
                        help="the job's warmup (default: the job's, a tenth of the steps)")
    parser.add_argument("--output_json", default="benchmarks/results/long_run.json")
    parser.add_argument("recipe_flags", nargs="*",
                        help="more flags for the main job, after --, e.g. -- --learning_rate=1e-3")
    args = parser.parse_args(argv)
    if args.train_steps < 1 or args.checkpoints < 1:
        parser.error("--train_steps and --checkpoints must be positive")
    try:
        points = sorted({int(p) for p in args.branches.split(",") if p.strip()})
    except ValueError:
        parser.error(f"--branches={args.branches!r}: comma-separated steps")
    if not 0.0 < args.cooldown < 1.0:
        parser.error("--cooldown must be in (0, 1)")
    warmup = (args.warmup_steps if args.warmup_steps is not None
              else max(1, args.train_steps // 10))  # the job's rule for fixed steps
    decay_start = args.train_steps - int(round(args.cooldown * args.train_steps))
    if points and not (warmup < points[0] and points[-1] <= decay_start):
        parser.error(f"--branches must lie after the warmup ({warmup}) and before "
                     f"the trunk's decay starts (step {decay_start})")
    # The job checkpoints at its planned evaluations, every planned_every steps:
    # a branch starts from one of those checkpoints.
    spacing = planned_every(args.train_steps)
    if any(point % spacing for point in points):
        parser.error(f"--branches must be multiples of {spacing}: the job checkpoints every "
                     f"{spacing} steps (a fifth of --train_steps)")

    schedule = [] if args.warmup_steps is None else [f"--warmup_steps={args.warmup_steps}"]
    if points:
        # every checkpoint kept, the job's own evaluations
        fraction = decay_fraction(args.train_steps, args.train_steps - decay_start, warmup)
        schedule.append(f"--decay_fraction={fraction:.6f}")
        schedule.append(f"--keep_checkpoints={args.train_steps // spacing + 1}")
    else:
        every = max(1, -(-args.train_steps // args.checkpoints))
        schedule += [f"--eval_every={every}", f"--keep_checkpoints={args.checkpoints + 1}"]
    command = [sys.executable, "-m", "lealla_tf.recipe", f"--work_dir={args.work_dir}",
               f"--train_steps={args.train_steps}", *schedule, *args.recipe_flags]
    print(" ".join(command), flush=True)
    start = time.time()
    code = run_passing_stop_signals(command)
    if code:
        print(f"error: the main job exited with {code}; rerun the same command to resume it",
              file=sys.stderr)
        return code
    invocation_minutes = (time.time() - start) / 60  # less when the job's stages were reused
    with open(os.path.join(args.work_dir, "report", "report.json")) as f:
        report = json.load(f)
    model_dir = os.path.join(args.work_dir, "student")
    if points:
        # the trunk at each branch point (constant rate), then each decayed end
        curve = [{"step": point, "decayed": False,
                  **point_scores(report, model_dir, os.path.join(model_dir, "checkpoints",
                                                                 f"ckpt-{point}"))}
                 for point in points]
        for point in points:
            end = cooldown_end(point, args.cooldown)
            branch_dir = os.path.join(args.work_dir, "branches", f"from_{point}")
            final = cooldown_branch(model_dir, point, end, branch_dir)
            curve.append({"step": end, "decayed": True, "branched_at": point,
                          **point_scores(report, branch_dir, final)})
            print(f"step {end} (cooldown from {point}): Tatoeba P@1 "
                  f"{100 * curve[-1]['tatoeba_dev_all_p_at_1']:.2f}, news F1 "
                  f"{100 * (curve[-1]['news_f1'] or 0):.1f}", flush=True)
        final = kept_checkpoints(model_dir)[-1]
        curve.append({"step": final[0], "decayed": True, "trunk_end": True,
                      **point_scores(report, model_dir, final[1])})
    else:
        curve = checkpoint_curve(report, model_dir)
    headline = report.get("headline", {})
    result = {
        "benchmark": "long_run", "machine": machine(),
        "command": "python -m benchmarks.long_run " + " ".join(argv or sys.argv[1:]),
        "recipe_command": " ".join(command[1:]),
        "train_steps": args.train_steps,
        "branches": points, "cooldown": args.cooldown if points else None,
        "total_steps_trained": args.train_steps + sum(
            cooldown_end(p, args.cooldown) - p for p in points),
        "job_minutes": sum(report.get("stage_seconds", {}).values()) / 60,
        "invocation_minutes": invocation_minutes,
        "stage_seconds": report.get("stage_seconds"),
        "tatoeba_dev_all": {"p_at_1": report["tatoeba"]["student"]["tatoeba/average_p_at_1"],
                            "teacher_p_at_1":
                                report["tatoeba"]["teacher"]["tatoeba/average_p_at_1"]},
        "news": {"student_f1": report["news"].get("student", {}).get("news/average_f1"),
                 "teacher_f1": report["news"].get("teacher", {}).get("news/average_f1")},
        "headline": headline,
        "curve_all_pairs": curve,
        # the trainer's evaluations along the run: the first eval_max_pairs a language
        "curve_dev_subset": report["training"]["student"].get("evaluations"),
        "train_seconds": report["training"]["student"].get("train_seconds"),
        "pairs_per_second": report["training"]["student"].get("pairs_per_second"),
        "export": report.get("export", {}).get("paths", {}).get("model"),
        "parameters": report.get("export", {}).get("parameters"),
    }
    news = result["news"]
    if news["student_f1"] and news["teacher_f1"]:
        news["student_over_teacher"] = news["student_f1"] / news["teacher_f1"]
    write_result(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
