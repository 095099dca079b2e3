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
    from lealla_tf.evaluation.news import NEWS_PRIMARY_METRIC
    from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC
    from lealla_tf.recipe.evaluations import evaluate_stage, news_stage

    data_dir = report["data_dir"]
    work = report["work_dir"]
    models = CheckpointModels(model_dir)
    vocab_file = report["vocabulary"]["output"]  # the students' (and the job's) tokenizer
    news_languages = report["news_set"]["languages"]
    curve = []
    for step, checkpoint in kept_checkpoints(model_dir):
        start = time.time()
        tatoeba = evaluate_stage({"student": (checkpoint, 0)},
                                 os.path.join(data_dir, "tatoeba_dev"), models)["student"]
        news = news_stage({"student": checkpoint}, os.path.join(work, "news"), news_languages,
                          vocab_file, models).get("student", {})
        point = {"step": step, "tatoeba_dev_all_p_at_1": tatoeba[TATOEBA_PRIMARY_METRIC],
                 "news_f1": news.get(NEWS_PRIMARY_METRIC),
                 "news_length_p_at_1": news.get("news_length/average_p_at_1"),
                 "seconds": time.time() - start}
        print(f"step {step}: Tatoeba P@1 {100 * point['tatoeba_dev_all_p_at_1']:.2f}, news F1 "
              f"{100 * (point['news_f1'] or 0):.1f}", flush=True)
        curve.append(point)
    return curve


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/long")
    parser.add_argument("--train_steps", type=int, default=2000)
    parser.add_argument("--checkpoints", type=int, default=8,
                        help="checkpoints along the run, each evaluated on all pairs")
    parser.add_argument("--output_json", default="benchmarks/results/long_run.json")
    parser.add_argument("recipe_flags", nargs="*",
                        help="more flags for the main job, after --, e.g. -- --learning_rate=1e-3")
    args = parser.parse_args(argv)
    if args.train_steps < 1 or args.checkpoints < 1:
        parser.error("--train_steps and --checkpoints must be positive")

    every = max(1, -(-args.train_steps // args.checkpoints))
    command = [sys.executable, "-m", "lealla_tf.recipe", f"--work_dir={args.work_dir}",
               f"--train_steps={args.train_steps}",
               f"--eval_every={every}", f"--keep_checkpoints={args.checkpoints + 1}",
               *args.recipe_flags]
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
    curve = checkpoint_curve(report, model_dir)
    headline = report.get("headline", {})
    result = {
        "benchmark": "long_run", "machine": machine(),
        "command": "python -m benchmarks.long_run " + " ".join(argv or sys.argv[1:]),
        "recipe_command": " ".join(command[1:]),
        "train_steps": args.train_steps,
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
