r"""Benchmark: which pooling and loss weights learn fastest from scratch on this CPU.

    python -m benchmarks.loss_weight_sweep --work_dir=runs/sweep \
        --vocab_file=runs/real/vocab.txt --train_data=runs/real/pairs_teacher \
        --output_json=benchmarks/results/loss_weight_sweep.json

Each configuration trains the lealla_small architecture for --steps steps (batch 64,
max length 32, English-only all-MiniLM-L6-v2 teacher vectors, same data and seed)
and is scored by Tatoeba dev P@1 on the first 100 pairs of every language. A model
directory that already holds --steps steps is only re-evaluated.
"""

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import machine, run_passing_stop_signals
from lealla_tf.recipe.config import find_data_dir

CONFIGURATIONS = {
    "cls_ams": ["--objective=ams"],
    "cls_lealla_paper_weights": [],
    "cls_fd10": ["--loss_weights=fd=10"],
    "cls_fd100": ["--loss_weights=fd=100"],
    "mean_ams": ["--objective=ams", "--encoder_overrides=pooling=mean"],
    "mean_fd10": ["--loss_weights=fd=10", "--encoder_overrides=pooling=mean"],
    "mean_fd1": ["--loss_weights=fd=1", "--encoder_overrides=pooling=mean"],
    "mean_fd1_ld1e4": ["--loss_weights=fd=1,ld=1e4", "--encoder_overrides=pooling=mean"],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--vocab_file", required=True)
    parser.add_argument("--train_data", required=True)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    args = parser.parse_args()
    tatoeba = find_data_dir(args.data_dir) / "tatoeba_dev"
    names = [n for n in args.only.split(",") if n] or list(CONFIGURATIONS)
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    results = {}
    for name in names:
        model_dir = os.path.join(args.work_dir, name)
        command = [sys.executable, "-m", "lealla_tf.cli.train", "--preset=lealla_small",
                   f"--vocab_file={args.vocab_file}", f"--train_data={args.train_data}",
                   "--teacher_english_only", f"--model_dir={model_dir}", "--max_seq_length=32",
                   "--global_batch_size=64", f"--train_steps={args.steps}", "--warmup_steps=30",
                   f"--checkpoint_every={args.steps}", "--no_progress"] + CONFIGURATIONS[name]
        code = run_passing_stop_signals(command, env=environment, stdout=subprocess.DEVNULL)
        if code:
            raise subprocess.CalledProcessError(code, command)
        output = os.path.join(args.work_dir, f"{name}.json")
        subprocess.run([sys.executable, "-m", "lealla_tf.cli.evaluate", f"--model={model_dir}",
                        f"--tatoeba_dir={tatoeba}", "--max_pairs=100", f"--output_json={output}",
                        "--no_progress"], check=True, env=environment, stdout=subprocess.DEVNULL)
        metrics = json.load(open(output))["metrics"]
        last = [json.loads(l) for l in open(os.path.join(model_dir, "train_log.jsonl"))][-1]
        results[name] = {"flags": CONFIGURATIONS[name],
                         "tatoeba_dev_p_at_1_first_100": metrics["tatoeba/average_p_at_1"],
                         "last_step": {k: v for k, v in last.items() if k != "fingerprint"}}
        print(f"{name}: P@1 {100 * metrics['tatoeba/average_p_at_1']:.2f} "
              f"(AMS {last['ams']:.2f})", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump({"benchmark": "loss_weight_sweep", "machine": machine(), "steps": args.steps,
                   "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
