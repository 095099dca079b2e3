r"""Benchmark: a longer run on the whole parallel corpus instead of the main job's sample.

    make main   # for runs/recipe/vocab.model and the converted teacher
    python -m benchmarks.corpus_long_run --recipe_dir=runs/recipe --work_dir=runs/ams_corpus \
        --train_steps=1500 --output_json=benchmarks/results/corpus_long_run.json

The main job's student (lealla_small, mean pooling, the pruned teacher vocabulary,
teacher-PCA embeddings, 64 x 32; at the width's default peak rate, 5e-4, not
the 2e-3 of the main job's 200 steps since 36830e7) trains with --objective
(default AMS, which needs no teacher vectors, nor does `ams+hd`, whose teacher
runs inside the step, nor does the main job's `lealla+hd` with --teacher_in_step;
so the data is every pair of `parallel/`, sampled across languages, with
tatoeba_dev removed) and is
evaluated on the first 50 pairs a language every --eval_every steps, then on all
of tatoeba_dev. The question it answers: is the main job's plateau (31-32 % on
the subset after 250 steps on 13,984 pairs) the sample's size? Rerunning
resumes the training from its checkpoint (a finished run is only evaluated
again). A finished run can be
extended: rerun with a larger --train_steps and --warmup_steps set to the
first run's (1 % of its steps); the data goes on with pairs not yet seen and
the linear decay restarts from where the longer schedule stands (a warm
restart, e.g. half the peak rate when doubling the steps).
"""

import argparse
import json
import os
import pathlib
import sys
import time

from benchmarks.common import machine, run_passing_stop_signals, write_result
from lealla_tf.evaluation.plots import read_jsonl
from lealla_tf.evaluation.retrieval import (
    TATOEBA_MARGIN_METRIC,
    TATOEBA_PRIMARY_METRIC,
    best_and_worst,
    per_language,
)
from lealla_tf.recipe.config import find_data_dir


def run(command):
    print("+", " ".join(command), flush=True)
    code = run_passing_stop_signals(command)
    if code:  # the child's own message is above; pass its status on (128 + N for signal N)
        print(f"corpus_long_run: {command[2]} exited with status {code}", file=sys.stderr)
        sys.exit(code if code > 0 else 128 - code)


def training_flags(args, data: pathlib.Path, recipe: pathlib.Path) -> list:
    """`lealla_tf.cli.train`'s flags for this run: the main job's student on every
    pair of `data`/parallel, with `recipe`'s vocabulary and teacher."""
    tatoeba = str(data / "tatoeba_dev")
    train_flags = [
        "--preset=lealla_small", "--encoder_overrides=pooling=mean",
        f"--model_dir={args.work_dir}", f"--vocab_file={recipe / 'vocab.model'}",
        "--max_seq_length=32", "--length_buckets=4", "--global_batch_size=64",
        f"--train_data={data / 'parallel'}", f"--decontaminate={tatoeba}",
        f"--objective={args.objective}", f"--embedding_init={args.embedding_init}",
        f"--embedding_init_source={recipe / 'teacher'}", f"--train_steps={args.train_steps}",
        f"--tatoeba_dir={tatoeba}", f"--eval_every={args.eval_every}", "--eval_max_pairs=50",
        f"--checkpoint_every={args.eval_every}", "--no_progress"]
    if args.loss_weights:
        train_flags.append(f"--loss_weights={args.loss_weights}")
    if args.teacher_in_step:
        train_flags.append("--teacher_in_step")
    if args.warmup_steps is not None:
        train_flags.append(f"--warmup_steps={args.warmup_steps}")
    return train_flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe_dir", default="runs/recipe",
                        help="a finished main job (vocab.model, teacher/)")
    parser.add_argument("--data_dir", default=None, help="holds parallel/ and tatoeba_dev/")
    parser.add_argument("--work_dir", default="runs/ams_corpus")
    parser.add_argument("--objective", default="ams")
    parser.add_argument("--loss_weights", default="",
                        help="as lealla_tf.cli.train's, e.g. hd=300 (the main job's weight)")
    parser.add_argument("--embedding_init", default="teacher_pca",
                        help="the runs in the README used teacher_pca; the main job's "
                             "student now starts from teacher_select")
    parser.add_argument("--teacher_in_step", action="store_true",
                        help="fd/ld targets from the converted teacher run in each step (as "
                             "the main job's student), so lealla+hd can train on every pair")
    parser.add_argument("--train_steps", type=int, default=1500)
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--warmup_steps", type=int, default=None,
                        help="default: 1%% of train_steps; to extend a finished run, its value")
    parser.add_argument("--output_json", required=True)
    return parser


def main():
    args = build_parser().parse_args()

    data = find_data_dir(args.data_dir)
    recipe = pathlib.Path(args.recipe_dir)
    needed = [recipe / "vocab.model", recipe / "teacher"]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: run `make main` first (or pass --recipe_dir)")
    train_flags = training_flags(args, data, recipe)
    tatoeba = str(data / "tatoeba_dev")
    start = time.perf_counter()
    run([sys.executable, "-m", "lealla_tf.cli.train", *train_flags])
    train_wall = time.perf_counter() - start
    full_json = os.path.join(args.work_dir, "tatoeba_dev_all.json")
    start = time.perf_counter()
    run([sys.executable, "-m", "lealla_tf.cli.evaluate", f"--model={args.work_dir}",
         f"--tatoeba_dir={tatoeba}", f"--output_json={full_json}", "--no_progress"])
    eval_wall = time.perf_counter() - start

    with open(full_json) as f:
        full = json.load(f)["metrics"]
    curve = [{"step": row["step"], "train_seconds": row["train_seconds"],
              "p_at_1_first_50": row[TATOEBA_PRIMARY_METRIC]}
             for row in read_jsonl(os.path.join(args.work_dir, "eval_log.jsonl"))]
    train_log = read_jsonl(os.path.join(args.work_dir, "train_log.jsonl"))
    last = train_log[-1] if train_log else {}
    languages = per_language(full)
    best, worst = best_and_worst(languages)
    result = {
        "benchmark": "corpus_long_run", "machine": machine(),
        "train_flags": train_flags,
        "this_invocation_seconds": {"train": train_wall, "evaluate_all": eval_wall},
        # Every term the objective logs, not only AMS's.
        "last_step": last,
        "curve": curve,
        "tatoeba_dev_all": {"p_at_1": full.get(TATOEBA_PRIMARY_METRIC),
                            "margin_p_at_1": full.get(TATOEBA_MARGIN_METRIC),
                            "languages": len(languages),
                            "best_10": {l: languages[l] for l in best},
                            "worst_10": {l: languages[l] for l in worst}},
    }
    write_result(args.output_json, result)


if __name__ == "__main__":
    main()
