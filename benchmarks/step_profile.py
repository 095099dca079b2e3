"""Benchmark: where the time of a training step and of an embedding call goes, op by op.

    python -m benchmarks.step_profile --output_json=benchmarks/results/step_profile.json

TensorFlow's profiler over `--calls` calls (after warm-up) of
- `train_float32` / `train_bfloat16`: the training step of
  benchmarks/train_throughput.py (lealla_small, 64 pairs x 32 tokens, LaBSE's 501k
  vocabulary, AMS + FD + LD), in float32 and in bfloat16;
- `embed_<preset>_<b>x<t>`: `LeallaEncoder.forward` (what every export and
  embedder runs) of lealla_small and of the labse preset (random weights) on a
  batch of b sentences of up to t tokens (`--embed_shapes`; 256 x 16 is about a
  token-capped batch of short Tatoeba sentences, 100 x 40 of long ones).

Each op's own time is summed over the threads that ran it (ops nested in an op,
such as a kernel's ParallelFor, are not counted twice) and grouped by what it
does: dense_matmul (oneDNN MatMul / Einsum with their fused bias, GELU and
residual add: the attention projections and the feed-forward block), attention
(the per-head batched matmuls, softmax, transposes, unstack, concat),
elementwise (layer norm, GELU and residual ops, their gradients, casts, bias
gradients), compiled_dropout (the XLA-compiled hash dropout), optimizer (the Adam kernels,
weight decay, the sparse table gradient), embedding_lookup, other. Shares are of
the summed op time; wall ms are the calls' own.
"""

import argparse
import collections
import glob
import os
import re
import shutil
import tempfile
import time

import lealla_tf  # noqa: F401  (oneDNN default before TensorFlow loads)
from benchmarks.common import machine, parse_shapes, write_result
from benchmarks.train_throughput import build_step, synthetic_vocabulary

GROUPS = [
    ("fused_kernels", r"^Lealla"),
    ("attention", r"BatchMatMul|Softmax|Transpose|Unpack|Pack|Concat|Split|Reshape"),
    ("dense_matmul", r"MatMul|Einsum"),
    ("compiled_dropout", r"^_?Xla|XlaLaunch|XlaRun|Xla"),
    ("optimizer", r"ApplyAdam|AssignSubVariableOp|AssignAddVariableOp|UnsortedSegmentSum|"
                  r"^Unique|L2Loss"),
    ("embedding_lookup", r"Gather|ResourceGather"),
    ("elementwise", r"^(Mul|AddV2|Add|AddN|Sub|Sum|Mean|SquaredDifference|Square|Rsqrt|Sqrt|"
                    r"RsqrtGrad|Tanh|TanhGrad|Pow|RealDiv|Neg|BiasAdd|BiasAddGrad|Tile|SelectV2|"
                    r"Select|Cast|GreaterEqual|Maximum|Minimum|Erf|Exp|Relu|ReluGrad|"
                    r"BroadcastTo|_MklNative\w*Relu|_MklSwish)$"),
]
WRAPPERS = {"Process", "ParallelFor", "ExecutorDoneCallback", "FunctionRun"}


def group_of(op_type: str) -> str:
    for name, pattern in GROUPS:
        if re.search(pattern, op_type):
            return name
    return "other"


def op_times(logdir: str, calls: int) -> dict:
    """{op type: thread-milliseconds a call} of the ops the executor ran (each op's
    own event: events nested inside another op's are left out)."""
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


def profile(function, calls: int, warmup: int = 2) -> dict:
    """Wall ms a call, and the op times grouped, of `function()` (blocking)."""
    import tensorflow as tf

    for _ in range(warmup):
        function()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    logdir = tempfile.mkdtemp(prefix="step_profile_")
    tf.profiler.experimental.start(logdir)
    for _ in range(calls):
        function()
    tf.profiler.experimental.stop()
    try:
        ops = op_times(logdir, calls)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    total = sum(ops.values()) or 1.0
    groups = collections.Counter()
    for op, ms in ops.items():
        groups[group_of(op)] += ms
    top = sorted(ops.items(), key=lambda item: -item[1])[:25]
    return {"wall_ms": 1e3 * sorted(times)[len(times) // 2],
            "op_thread_ms": total,
            "groups": {g: {"thread_ms": ms, "share": ms / total}
                       for g, ms in groups.most_common()},
            "top_ops": [{"op": op, "thread_ms": ms, "group": group_of(op)} for op, ms in top]}


def embed_function(preset: str, rows: int, length: int):
    import numpy as np
    import tensorflow as tf

    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.models.presets import get_preset

    config = get_preset(preset).encoder
    encoder = build_encoder(config)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, config.vocabulary_size, size=(rows, length)).astype("int32")
    lengths = rng.integers(max(length // 2, 1), length + 1, size=rows)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype("int32")
    inputs = {"input_word_ids": tf.constant(ids * mask), "input_mask": tf.constant(mask),
              "input_type_ids": tf.zeros((rows, length), tf.int32)}
    forward = tf.function(lambda x: encoder.forward(x)["sentence_embedding"])
    return lambda: forward(inputs).numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--what", default="train_float32,train_bfloat16,embed",
                        help="which of train_float32, train_bfloat16, embed")
    parser.add_argument("--embed_presets", default="lealla_small,labse")
    parser.add_argument("--embed_shapes", default="256x16,100x40")
    args = parser.parse_args()
    wanted = [w.strip() for w in args.what.split(",") if w.strip()]
    unknown = sorted(set(wanted) - {"train_float32", "train_bfloat16", "embed"})
    if unknown or not wanted:
        parser.error(f"--what takes train_float32, train_bfloat16 and embed; got {args.what!r}")
    if args.calls < 1:
        parser.error(f"--calls must be at least 1, got {args.calls}")
    from lealla_tf.models.presets import PRESETS

    presets = [p.strip() for p in args.embed_presets.split(",") if p.strip()]
    if [p for p in presets if p not in PRESETS]:
        parser.error(f"unknown --embed_presets in {args.embed_presets!r}; known: {sorted(PRESETS)}")
    try:
        shapes = parse_shapes(args.embed_shapes)
        if any(min(s) < 1 for s in shapes):
            raise ValueError
    except ValueError:
        parser.error(f"--embed_shapes are rows x tokens like 256x16,100x40, each at least 1; "
                     f"got {args.embed_shapes!r}")
    result = {"benchmark": "step_profile", "machine": machine(), "calls": args.calls,
              "profiles": {}}
    with tempfile.TemporaryDirectory() as work:
        vocab = synthetic_vocabulary(os.path.join(work, "vocab.txt"))
        for precision in ("float32", "bfloat16"):
            if f"train_{precision}" not in wanted:
                continue
            model_dir = tempfile.mkdtemp(dir=work)
            step, batch, _ = build_step("lealla_small", vocab, 64, 32, precision == "bfloat16",
                                        model_dir)
            name = f"train_{precision}"
            result["profiles"][name] = profile(lambda: float(step(batch)["total"]), args.calls)
            print(name, {g: round(v["share"], 3)
                         for g, v in result["profiles"][name]["groups"].items()}, flush=True)
    if "embed" in wanted:
        import keras

        keras.mixed_precision.set_dtype_policy("float32")
        for preset in presets:
            for rows, length in shapes:
                name = f"embed_{preset}_{rows}x{length}"
                result["profiles"][name] = profile(embed_function(preset, rows, length),
                                                   args.calls)
                print(name, round(result["profiles"][name]["wall_ms"], 1), "ms",
                      {g: round(v["share"], 3)
                       for g, v in result["profiles"][name]["groups"].items()}, flush=True)
    write_result(args.output_json, result)


if __name__ == "__main__":
    main()
