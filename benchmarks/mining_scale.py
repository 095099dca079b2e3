r"""Benchmark: can we mine beyond memory, and at what time, peak memory and
recall@1, at 10^6 and 10^7 sentences?

    nice -n 19 python -m benchmarks.mining_scale \
        --output_json=benchmarks/results/mining_scale.json \
        [--only=ivfpq_1e7x1e6_d128,ivfpq_1e6x1e6_d768] [--work_dir=runs/mining_scale]

Each case runs in three processes, so that each one's peak resident memory can be
read (its VmHWM, which counts memory-mapped pages while they are mapped):
1. generate: synthetic embeddings written to raw float32 shards chunk by chunk:
   unit vectors around 1,000 gaussian cluster centres (cosine ~0.5 within a
   cluster); every even query is a planted near-duplicate of a candidate (cosine
   ~0.96), every odd one a fresh point, so recall is meaningful;
2. mine: `lealla_tf.mining.margins.mine` over the shards memory-mapped (`Rows`), k = 4,
   ratio margin, max retrieval, under `memory_budget_gb`, keeping its neighbour
   lists;
3. recall: the IVF(-PQ) top-1 of 10^4 sampled queries (from those lists) against
   exact search (flat, streamed over the candidate shards under the same budget).
Queries are the mining's source side, candidates its target side. Results merge
into --output_json by case name, so cases can be run one at a time. A case that
runs past --timeout_s is recorded as such, with what it had done.

A quick run (what the tests do): `--only=tiny --work_dir=<tmp>`.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from benchmarks.common import machine

CASES = {
    "ivfpq_1e6x1e6_d768": {"candidates": 10 ** 6, "queries": 10 ** 6, "d": 768,
                           "index": "ivfpq", "nlist": 1024, "nprobe": 8, "train_size": 65_536,
                           "memory_budget_gb": 2.0, "sample": 2_000},
    "ivfpq_1e7x1e6_d128": {"candidates": 10 ** 7, "queries": 10 ** 6, "d": 128,
                           "index": "ivfpq", "nlist": 2048, "nprobe": 8, "train_size": 131_072,
                           "memory_budget_gb": 3.0},
    "ivfpq_2e6x2e5_d128": {"candidates": 2 * 10 ** 6, "queries": 2 * 10 ** 5, "d": 128,
                           "index": "ivfpq", "nlist": 1024, "nprobe": 8, "train_size": 65_536,
                           "memory_budget_gb": 1.0},
    "ivfpq_25e4x25e4_d768": {"candidates": 250_000, "queries": 250_000, "d": 768,
                             "index": "ivfpq", "nlist": 1024, "nprobe": 8, "train_size": 65_536,
                             "memory_budget_gb": 2.0, "sample": 2_000},
    "ivfpq_1e6x1e5_d128": {"candidates": 10 ** 6, "queries": 10 ** 5, "d": 128,
                           "index": "ivfpq", "nlist": 1024, "nprobe": 8, "train_size": 65_536,
                           "memory_budget_gb": 1.0},
    "smoke": {"candidates": 20_000, "queries": 5_000, "d": 64, "index": "ivfpq", "nlist": 64,
              "nprobe": 8, "memory_budget_gb": 0.25, "sample": 1_000},
    "tiny": {"candidates": 4_000, "queries": 1_000, "d": 16, "index": "ivfpq", "nlist": 16,
             "nprobe": 4, "memory_budget_gb": 0.05, "sample": 200},
}
CHUNK = 65_536
SHARD_ROWS = 10 ** 6
CLUSTERS, CLUSTER_SPREAD, DUPLICATE_NOISE = 1_000, 1.0, 0.3
SAMPLE, SEED = 10_000, 0

GENERATE = f"""
import json, os, sys
import numpy as np
config, directory = json.loads(sys.argv[1]), sys.argv[2]
n_c, n_q, d = config["candidates"], config["queries"], config["d"]
stride = n_c // n_q
rng = np.random.default_rng({SEED})
centres = rng.standard_normal(({CLUSTERS}, d), dtype=np.float32)
centres /= np.linalg.norm(centres, axis=1, keepdims=True)

def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)

def clustered(n):
    noise = rng.standard_normal((n, d), dtype=np.float32) * ({CLUSTER_SPREAD} / np.sqrt(d))
    return unit(centres[rng.integers(0, len(centres), n)] + noise)

class Shards:
    def __init__(self, prefix):
        self.prefix, self.rows, self.handle, self.parts = prefix, 0, None, []
    def write(self, x):
        while len(x):
            if self.rows % {SHARD_ROWS} == 0:
                self.handle and self.handle.close()
                path = os.path.join(directory, f"{{self.prefix}}-{{len(self.parts):03d}}.f32")
                self.handle = open(path, "wb")
                self.parts.append([path, 0, d])
            room = {SHARD_ROWS} - self.rows % {SHARD_ROWS}
            self.handle.write(x[:room].astype("<f4").tobytes())
            self.parts[-1][1] += len(x[:room])
            self.rows += len(x[:room])
            x = x[room:]
    def close(self):
        self.handle.close()
        return self.parts

candidates, queries = Shards("candidates"), Shards("queries")
chunk = {2 ** 24} // d  # rows generated at once: a few copies of 64 MiB
for start in range(0, n_c, chunk):
    block = clustered(min(chunk, n_c - start))
    candidates.write(block)
    first, last = -(-start // stride), min(n_q, -(-(start + len(block)) // stride))
    if first < last:
        j = np.arange(first, last)
        planted = unit(block[j * stride - start] + rng.standard_normal(
            (len(j), d), dtype=np.float32) * ({DUPLICATE_NOISE} / np.sqrt(d)))
        queries.write(np.where((j % 2 == 0)[:, None], planted, clustered(len(j))))
json.dump({{"candidates": candidates.close(), "queries": queries.close(), "stride": stride}},
          open(os.path.join(directory, "parts.json"), "w"))
"""

MINE = """
import json, logging, os, sys, time
import numpy as np
from lealla_tf.mining.margins import log, mine
from lealla_tf.mining.neighbours import Rows
config, directory = json.loads(sys.argv[1]), sys.argv[2]

class Phases(logging.Handler):  # each phase's end, as a JSON line, even if killed later
    def emit(self, record):
        print(json.dumps({"phase:" + record.args[0]: [round(record.args[1], 1),
                                                      round(time.process_time(), 1)]}),
              flush=True)

log.addHandler(Phases())
log.setLevel(logging.INFO)
parts = json.load(open(os.path.join(directory, "parts.json")))
options = {k: config[k] for k in ("nlist", "nprobe", "train_size") if k in config}
start = time.perf_counter()
mined = mine(Rows([tuple(p) for p in parts["queries"]], "queries"),
             Rows([tuple(p) for p in parts["candidates"]], "candidates"), k=4, margin="ratio",
             retrieval="max", index_type=config["index"],
             memory_budget_gb=config["memory_budget_gb"],
             neighbours_dir=os.path.join(directory, "neighbours"), work_dir=directory,
             **options)
seconds = time.perf_counter() - start
planted = mined["source"] % 2 == 0
found = planted & (mined["target"] == mined["source"] * parts["stride"])
print(json.dumps({"seconds": seconds, "pairs": int(len(mined["score"])),
                  "planted_pairs_mined": int(found.sum()),
                  "score_range": [float(mined["score"].min()), float(mined["score"].max())]}))
"""

RECALL = f"""
import json, os, sys, time
import numpy as np
from lealla_tf.mining.neighbours import Rows, knn
config, directory = json.loads(sys.argv[1]), sys.argv[2]
parts = json.load(open(os.path.join(directory, "parts.json")))
queries = Rows([tuple(p) for p in parts["queries"]], "queries")
candidates = Rows([tuple(p) for p in parts["candidates"]], "candidates")
rng = np.random.default_rng(1)
sample = np.sort(rng.choice(queries.rows, size=min(config.get("sample", {SAMPLE}),
                                                    queries.rows), replace=False))
with open(os.path.join(directory, "neighbours", "forward.ids"), "rb") as f:
    k = os.path.getsize(f.name) // (8 * queries.rows)
    approximate = np.array([np.frombuffer(os.pread(f.fileno(), 8, 8 * k * int(i)), np.int64)[0]
                            for i in sample])
start = time.perf_counter()
_, exact = knn(queries.take(sample, {CHUNK}), candidates, 1, "flat",
               memory_budget_gb=config["memory_budget_gb"])
seconds = time.perf_counter() - start
hit = approximate == exact[:, 0]
planted = sample % 2 == 0
print(json.dumps({{"recall_at_1": float(hit.mean()),
                  "recall_at_1_planted": float(hit[planted].mean()),
                  "recall_at_1_fresh": float(hit[~planted].mean()),
                  "exact_top1_is_planted": float(np.mean(
                      exact[planted, 0] == sample[planted] * parts["stride"])),
                  "sample": int(len(sample)), "exact_search_seconds": seconds}}))
"""


PEAK = """
import atexit, json, resource
def _peak():
    with open("/proc/self/status") as f:
        kib = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"peak_rss_kib": kib, "cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}),
          flush=True)
atexit.register(_peak)
"""


def run_child(code: str, config: dict, directory: str, timeout_s: float) -> dict:
    """Runs `code` in a fresh process: its JSON lines, wall time and peak RSS.

    The peak is the process's own high-water mark (VmHWM, reset by exec; wait4's
    ru_maxrss would also count the parent's memory before the exec), read at exit
    and, for a process killed at the timeout, polled every second."""
    started, polled = time.time(), 0
    process = subprocess.Popen([sys.executable, "-c", PEAK + code, json.dumps(config),
                                directory], stdout=subprocess.PIPE, text=True,
                               cwd=str(pathlib.Path(__file__).resolve().parents[1]))
    while process.poll() is None:
        try:
            with open(f"/proc/{process.pid}/status") as f:
                polled = max(polled, next(int(line.split()[1]) for line in f
                                          if line.startswith("VmHWM:")))
        except (OSError, StopIteration):
            pass
        if time.time() - started > timeout_s:
            process.kill()
            process.wait()
            break
        time.sleep(1)
    result = {}
    with process.stdout:
        for line in process.stdout.read().strip().splitlines():
            result.update(json.loads(line))
    if time.time() - started > timeout_s:
        return {**result, "timed_out_after_s": round(time.time() - started),
                "peak_rss_gib": round(polled / 2 ** 20, 3)}
    if process.returncode != 0:
        raise RuntimeError(f"{config} failed (status {process.returncode})")
    peak = max(polled, result.pop("peak_rss_kib", 0))
    return {**result, "wall_s": round(time.time() - started, 1),
            "peak_rss_gib": round(peak / 2 ** 20, 3)}


def run_case(name: str, config: dict, work_dir: str, timeout_s: float) -> dict:
    directory = os.path.join(work_dir, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    result = {"case": name, **config, "load_average_at_start": os.getloadavg()[0],
              "input_gib": (config["candidates"] + config["queries"]) * config["d"] * 4 / 2 ** 30}
    try:
        result["generate"] = run_child(GENERATE, config, directory, timeout_s)
        result["mine"] = run_child(MINE, config, directory, timeout_s)
        if "timed_out_after_s" not in result["mine"]:
            result["recall"] = run_child(RECALL, config, directory, timeout_s)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--only", default="ivfpq_1e6x1e6_d768,ivfpq_1e7x1e6_d128",
                        help=f"comma-separated cases of {sorted(CASES)}")
    parser.add_argument("--work_dir", default="runs/mining_scale")
    parser.add_argument("--timeout_s", type=float, default=1500,
                        help="per process (generate, mine, recall)")
    args = parser.parse_args(argv)
    names = [name for name in args.only.split(",") if name]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    previous = {}
    if os.path.exists(args.output_json):
        with open(args.output_json) as f:
            previous = json.load(f)
    results = {r.get("case", f"legacy_{i}"): r for i, r in enumerate(previous.get("results", []))}
    for name in names:
        result = run_case(name, CASES[name], args.work_dir, args.timeout_s)
        result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        results[name] = result
        print(json.dumps(result), flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
        with open(args.output_json, "w") as f:
            json.dump({**previous, "benchmark": "mining_scale", "machine": machine(), "k": 4,
                       "margin": "ratio", "retrieval": "max",
                       "results": list(results.values())}, f, indent=2)


if __name__ == "__main__":
    main()
