"""Benchmark: mining time and peak memory for n x n random unit vectors.

    python benchmarks/mining_scale.py --output_json=benchmarks/results/mining_scale.json

Each configuration runs `lealla_tf.mining.mine` (k = 4 both ways, ratio margin,
max retrieval) in its own process so its peak resident memory can be read. Exact
(flat) search for 10^5 x 10^5; inverted lists for 10^6 x 10^6 (exact search would
take hours on 2 cores): IVF-flat at d = 128, IVF-PQ (d/8 bytes a vector) at d = 768.
Random vectors have no structure, so this measures cost, not recall.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.vocab_build import machine  # noqa: E402

CONFIGURATIONS = [
    {"n": 100_000, "d": 128, "index": "flat"},
    {"n": 100_000, "d": 768, "index": "flat"},
    {"n": 1_000_000, "d": 128, "index": "ivf", "nlist": 1024, "nprobe": 8},
    {"n": 1_000_000, "d": 768, "index": "ivfpq", "nlist": 1024, "nprobe": 8},
]

CHILD = """
import json, sys, time
import numpy as np
from lealla_tf.mining import mine, normalize_rows
config = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
source = normalize_rows(rng.standard_normal((config["n"], config["d"]), dtype=np.float32))
target = normalize_rows(rng.standard_normal((config["n"], config["d"]), dtype=np.float32))
options = {k: config[k] for k in ("nlist", "nprobe") if k in config}
start = time.perf_counter()
mined = mine(source, target, k=4, margin="ratio", retrieval="max", index_type=config["index"],
             **options)
print(json.dumps({"seconds": time.perf_counter() - start, "pairs": int(len(mined["score"]))}))
"""


def run_one(config):
    process = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(config)],
                               stdout=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    output = process.stdout.read()
    if status != 0:
        raise RuntimeError(f"{config} failed")
    result = json.loads(output.strip().splitlines()[-1])
    result["peak_rss_gib"] = usage.ru_maxrss / 2 ** 20  # ru_maxrss is in KiB on Linux
    result["vectors_gib"] = 2 * config["n"] * config["d"] * 4 / 2 ** 30
    return {**config, **result}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--only_small", action="store_true", help="just the 10^5 runs")
    args = parser.parse_args()
    results = []
    for config in CONFIGURATIONS:
        if args.only_small and config["n"] > 100_000:
            continue
        started = time.time()
        result = run_one(config)
        results.append(result)
        print(f"{config['n']:>9,} x {config['n']:,} d={config['d']:<4} {config['index']:<6} "
              f"mining {result['seconds']:7.1f} s, peak {result['peak_rss_gib']:.2f} GiB "
              f"(input vectors {result['vectors_gib']:.2f} GiB) [{time.time() - started:.0f} s]",
              flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump({"benchmark": "mining_scale", "machine": machine(), "k": 4, "margin": "ratio",
                   "retrieval": "max", "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
