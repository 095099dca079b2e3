r"""Benchmark: training pairs/s of lealla_small and the labse preset on this machine.

    python -m benchmarks.train_throughput --output_json=runs/train_throughput.json

The real train step of `lealla_tf.train.trainer.Trainer` (AMS + feature + logit
distillation, AdamW, global-norm clipping) on batches of 64 pairs x 32 tokens
per side, with LaBSE's 501,153-token vocabulary and precomputed 768-d teacher
vectors, measured in one run. Token ids are random (speed does not depend on
them); fp32 and, with --mixed_precision, bfloat16 compute.

    python -m benchmarks.train_throughput --output_json=... \
        --train_data=runs/recipe/pairs_teacher --vocab=runs/recipe/vocab.model

measures instead the whole training loop (tf.data, tokenization, the step) of
lealla_small on real pairs with teacher vectors, with and without length
buckets (`--length_buckets`), and the padding of the batches each produces.

    python -m benchmarks.train_throughput --speedups \
        --train_data=runs/recipe/pairs_teacher --vocab=runs/recipe/vocab.model \
        --output_json=runs/train_speedups.json

measures, each in a fresh process and all in one run, what each speed-up is
worth: the step at 64 x 32 with the main job's vocabulary size and LaBSE's,
oneDNN kernels off and on; the same step compiled with XLA (`jit_compile`);
and the whole loop on real pairs before (oneDNN off,
tf.data autotuned on the step's cores) and after (oneDNN on, the input pipeline
on one thread of its own).

    python -m benchmarks.train_throughput --levers --rounds=2 \
        --output_json=runs/train_levers.json

measures the step at 64 x 32 (LaBSE's 501k vocabulary) as each lever of the
training step is added, each in a fresh process, round-robin over `--rounds`
(the fastest round of each kept, the machine's speed drifts): Keras' AdamW on a
dense table gradient through the Keras call (the step before them), then
`FusedAdamW`, the table's gradient kept sparse, the fused forward (with Keras'
Philox dropout), the hash-mask dropout, the fused layer kernels of
`lealla_tf.models.kernels` (attention, bias + GELU, bias + dropout + residual + layer
norm, each with its gradient), the table's AdamW in one pass from its sparse
gradient (today's float32 step), bfloat16 (the Keras Embedding call casting the
whole table), and the rows looked up before the cast (today's bfloat16 step).
The "before" levers are rebuilt here by putting the old pieces back in the child.

`benchmarks/results/train_throughput.json` keeps the current result of each of
these kinds under `variants` (`throughput`, `speedups`, `levers`), with the
command that wrote it under `commands`.
"""

import argparse
import json
import os
import sys
import tempfile
import time

from benchmarks.common import machine, write_result

VOCABULARY_SIZE = 501_153


def synthetic_vocabulary(path, size=VOCABULARY_SIZE):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [f"t{i}" for i in range(size - len(tokens))]
    with open(path, "w") as f:
        f.write("\n".join(tokens) + "\n")
    return path


def build_step(preset, vocab, batch_size, length, mixed_precision, model_dir,
               vocabulary_size=VOCABULARY_SIZE, jit_compile=False):
    """The real train step of `lealla_tf.train.trainer.Trainer` and one batch of random
    ids (`batch_size` pairs x `length` tokens a side, 768-d teacher vectors):
    (step function, batch, task). Ids do not change the speed."""
    import keras
    import numpy as np
    import tensorflow as tf

    from lealla_tf.configs import (
        LossConfig,
        OptimizerConfig,
        TokenizerConfig,
        TrainConfig,
        resolve_train_config,
    )
    from lealla_tf.models.presets import get_preset
    from lealla_tf.tokenizers.tokenizer import Tokenizer
    from lealla_tf.train.distribution import make_strategy
    from lealla_tf.train.task import DistillationTask
    from lealla_tf.train.teacher_sources import PrecomputedTeacher
    from lealla_tf.train.trainer import Trainer

    keras.mixed_precision.set_dtype_policy("mixed_bfloat16" if mixed_precision else "float32")
    config = resolve_train_config(TrainConfig(
        preset=preset, encoder=get_preset(preset).encoder,
        tokenizer=TokenizerConfig(max_seq_length=length), loss=LossConfig(objective="lealla"),
        optimizer=OptimizerConfig(), global_batch_size=batch_size, train_steps=10_000,
        mixed_precision=mixed_precision), vocabulary_size, 768)
    strategy = make_strategy("default")
    task = DistillationTask(config, strategy, Tokenizer(vocab, length),
                            PrecomputedTeacher(768, True))
    trainer = Trainer(task, model_dir, progress=False)
    rng = np.random.default_rng(0)

    def side():
        ids = rng.integers(5, vocabulary_size, size=(batch_size, length)).astype("int32")
        ids[:, 0], ids[:, -1] = 2, 3
        return {"input_word_ids": tf.constant(ids),
                "input_mask": tf.ones((batch_size, length), tf.int32),
                "input_type_ids": tf.zeros((batch_size, length), tf.int32)}

    batch = {"source": side(), "target": side(),
             "teacher_source": tf.constant(rng.normal(size=(batch_size, 768)), tf.float32),
             "teacher_target": tf.constant(rng.normal(size=(batch_size, 768)), tf.float32)}
    step = tf.function(lambda b: trainer.strategy.run(trainer.replica_step, args=(b,)),
                       jit_compile=jit_compile)
    return step, batch, task


def measure(preset, vocab, batch_size, length, warmup, steps, mixed_precision,
            vocabulary_size=VOCABULARY_SIZE, jit_compile=False):
    import numpy as np

    with tempfile.TemporaryDirectory() as model_dir:
        step, batch, task = build_step(preset, vocab, batch_size, length, mixed_precision,
                                       model_dir, vocabulary_size, jit_compile)
        for _ in range(warmup):
            float(step(batch)["total"])
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            float(step(batch)["total"])
            times.append(time.perf_counter() - start)
        # The median step: one step slowed by another tenant does not move it.
        seconds = float(np.median(times))
        parameters = task.student.encoder.count_params()
    return {"preset": preset, "mixed_precision": mixed_precision, "parameters": parameters,
            "seconds_per_step": seconds, "pairs_per_second": batch_size / seconds,
            "mean_seconds_per_step": float(np.mean(times)),
            "warmup_steps": warmup, "timed_steps": steps}


def padding(task, batches):
    """Fraction of padded positions in the first `batches` batches of the task."""
    real = padded = 0
    for batch in task.dataset().take(batches):
        for side in ("source", "target"):
            mask = batch[side]["input_mask"]
            real += int(mask.numpy().sum())
            padded += int(mask.shape[0] * mask.shape[1])
    return 1.0 - real / padded


def measure_real_data(train_data, vocab, buckets, steps, batch_size, length):
    """Pairs/s of the whole training loop (first step's tracing excluded) on real data."""
    import shutil

    from lealla_tf.configs import DataConfig, LossConfig, TokenizerConfig, TrainConfig
    from lealla_tf.models.presets import get_preset
    from lealla_tf.train.run import build_trainer

    config = TrainConfig(
        encoder=get_preset("lealla_small").encoder.replace(pooling="mean"),
        tokenizer=TokenizerConfig(max_seq_length=length),
        data=DataConfig(train_data=[train_data], length_buckets=buckets),
        loss=LossConfig(objective="lealla", weights={"fd": 1.0, "ld": 1e4}),
        global_batch_size=batch_size, train_steps=steps, checkpoint_every=steps,
        log_every=1)
    model_dir = tempfile.mkdtemp()
    try:
        trainer = build_trainer(config, model_dir, vocab, progress=False)
        waste = padding(trainer.task, 50)
        summary = trainer.train()
        rows = [json.loads(line) for line in open(os.path.join(model_dir, "train_log.jsonl"))]
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    seconds = summary.get("train_seconds", summary["seconds"])
    # The first step traces the graph (about a minute): timed apart.
    first = rows[0]["train_seconds"]
    return {"length_buckets": buckets, "steps": steps, "train_seconds": seconds,
            "first_step_seconds": first,
            "pairs_per_second": (steps - 1) * batch_size / max(seconds - first, 1e-9),
            "pairs_per_second_with_first_step": steps * batch_size / seconds,
            "padding_waste": waste,
            "final_loss": rows[-1].get("total") if rows else None}


# Each lever adds one piece to the step; the child puts back the old piece of
# every lever not yet added (what the step did before it). The float32 levers
# come first, then bfloat16 and what only it needs.
LEVERS = ["keras_adamw_dense_keras_call", "fused_adamw", "sparse_table_gradient",
          "fused_forward", "hash_dropout", "fused_layers", "sparse_adamw_kernel",
          "bfloat16", "row_lookup"]
FLOAT32_STEP, BFLOAT16_STEP = "sparse_adamw_kernel", "row_lookup"


def restore_old_pieces(levers: int) -> None:
    """In this child process: the training step as it was before LEVERS[1:levers]."""
    import types

    import keras
    import tensorflow as tf

    import lealla_tf.models.encoder as encoder_module
    import lealla_tf.train.optimizers as optimizers_module
    import lealla_tf.train.students as students_module
    import lealla_tf.train.task as task_module
    import lealla_tf.train.trainer as trainer_module

    def added(name):
        return LEVERS.index(name) < levers

    never = types.SimpleNamespace(usable=lambda strategy=None: False)
    if not added("fused_adamw"):
        trainer_module.FusedAdamW = keras.optimizers.AdamW
    if not added("sparse_table_gradient"):
        task_module.unique_rows = tf.convert_to_tensor
    if not added("fused_forward"):
        encoder_module.LeallaEncoder.forward_batches = (
            lambda self, batches, training=False, fused_kernels=False:
            [self(inputs, training=training) for inputs in batches])
    if not added("hash_dropout"):  # Keras' own dropout: Philox floats, compare, select
        encoder_module.hash_dropout = type("KerasDropout", (), {"dropout": staticmethod(
            lambda x, rate, seed: tf.nn.experimental.stateless_dropout(x, rate, seed))})
    if not added("fused_layers"):  # attention, GELU, layer norms op by op
        students_module.kernels = never
    if not added("sparse_adamw_kernel"):  # densify, decay, then TensorFlow's fused Adam
        optimizers_module.kernels = never
    if not added("row_lookup"):  # the Keras Embedding call (casts the whole table)
        encoder_module.LeallaEncoder._token_rows = (
            lambda self, ids, compute: self.token_embedding(ids))


def child(spec: dict) -> dict:
    """One measurement of `--speedups` or `--levers`, in this (fresh) process."""
    if "levers" in spec:
        restore_old_pieces(spec["levers"])
        with tempfile.TemporaryDirectory() as tmp:
            vocab = synthetic_vocabulary(os.path.join(tmp, "vocab.txt"))
            return measure("lealla_small", vocab, spec["batch_size"], spec["length"],
                           spec["warmup"], spec["steps"],
                           spec["levers"] > LEVERS.index("bfloat16"))
    if not spec["lean_input"]:
        import lealla_tf.train.data

        lealla_tf.train.data.FEW_CORES = 0  # tf.data's defaults: autotuned, on the shared pool
    if spec["kind"] == "step":
        with tempfile.TemporaryDirectory() as tmp:
            vocab = synthetic_vocabulary(os.path.join(tmp, "vocab.txt"), spec["vocabulary_size"])
            return measure("lealla_small", vocab, spec["batch_size"], spec["length"],
                           spec["warmup"], spec["steps"], False, spec["vocabulary_size"],
                           spec.get("jit_compile", False))
    return measure_real_data(spec["train_data"], spec["vocab"], 4, spec["steps"],
                             spec["batch_size"], spec["length"])


def run_child(spec: dict, environment=None) -> dict:
    """`child(spec)` in a fresh process; its result with the spec."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "benchmarks.train_throughput", "--child",
                           json.dumps(spec), "--output_json", "-"],
                          env=environment or dict(os.environ),
                          capture_output=True, text=True)
    if done.returncode != 0:  # the child's own error, not only its exit status
        raise RuntimeError(f"the measurement {spec} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), **spec}


def levers(args) -> dict:
    """The step as each lever is added, each in a fresh process, `--rounds` rounds."""
    rounds = {name: [] for name in LEVERS}
    for round_index in range(args.rounds):
        for count, name in enumerate(LEVERS, start=1):
            result = run_child({"levers": count, "batch_size": args.batch_size,
                                "length": args.length, "warmup": args.warmup,
                                "steps": args.steps})
            rounds[name].append(result)
            print(f"round {round_index + 1}, + {name}: {result['seconds_per_step']:.3f} s/step, "
                  f"{result['pairs_per_second']:.1f} pairs/s", flush=True)
    rows = []
    for name in LEVERS:
        best = min(rounds[name], key=lambda r: r["seconds_per_step"])
        rows.append({"lever": name, "pairs_per_second": best["pairs_per_second"],
                     "seconds_per_step": best["seconds_per_step"],
                     "mixed_precision": best["mixed_precision"],
                     "rounds_pairs_per_second": [r["pairs_per_second"] for r in rounds[name]]})
    for previous, row in zip(rows, rows[1:]):
        row["over_previous"] = row["pairs_per_second"] / previous["pairs_per_second"]
    return {"benchmark": "train_levers", "machine": machine(), "preset": "lealla_small",
            "objective": "ams+fd+ld", "batch_size": args.batch_size, "length": args.length,
            "vocabulary_size": VOCABULARY_SIZE, "timed_steps": args.steps,
            "rounds": args.rounds, "levers": rows,
            "after_over_before_float32": rows[LEVERS.index(FLOAT32_STEP)]["pairs_per_second"]
            / rows[0]["pairs_per_second"],
            "after_over_before_bfloat16": rows[LEVERS.index(BFLOAT16_STEP)]["pairs_per_second"]
            / rows[0]["pairs_per_second"]}


def speedups(args) -> dict:
    """Every speed-up of the training loop, each measured in a fresh process."""
    def run(spec, onednn):
        result = run_child(spec, {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1" if onednn else "0"})
        result["onednn"] = onednn
        print(json.dumps({k: result[k] for k in ("kind", "onednn", "lean_input", "jit_compile",
                                                  "pairs_per_second")
                          if k in result}), flush=True)
        return result

    base = {"batch_size": args.batch_size, "length": args.length}
    step = {**base, "kind": "step", "lean_input": True, "warmup": args.warmup,
            "steps": args.steps}
    groups = args.speedup_groups.split(",")
    rows = []
    if "step" in groups:
        for size in (38_401, VOCABULARY_SIZE):
            for onednn in (False, True):
                rows.append(run({**step, "vocabulary_size": size}, onednn))
    if "xla" in groups:  # the step compiled with XLA (jit_compile), oneDNN on for the rest
        rows.append(run({**step, "vocabulary_size": 38_401, "jit_compile": True}, True))
    if args.train_data and "real_data" in groups:
        real = {**base, "kind": "real_data", "train_data": args.train_data,
                "vocab": args.vocab, "steps": args.real_steps}
        rows.append(run({**real, "lean_input": False}, False))
        rows.append(run({**real, "lean_input": False}, True))
        rows.append(run({**real, "lean_input": True}, True))
    return {"benchmark": "train_speedups", "machine": machine(), "objective": "ams+fd+ld",
            "preset": "lealla_small", "results": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--presets", default="lealla_small,labse")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mixed_precision", action="store_true",
                        help="also measure bfloat16 compute")
    parser.add_argument("--train_data", default="",
                        help="real pairs with teacher vectors: measure the whole loop instead")
    parser.add_argument("--vocab", default="", help="the student's vocabulary (--train_data)")
    parser.add_argument("--buckets", default="0,4", help="--length_buckets values to compare")
    parser.add_argument("--speedups", action="store_true",
                        help="measure each speed-up of the loop, each in a fresh process")
    parser.add_argument("--real_steps", type=int, default=40,
                        help="--speedups: steps of the whole loop on real pairs")
    parser.add_argument("--speedup_groups", default="step,xla,real_data",
                        help="--speedups: which of step,xla,real_data to measure")
    parser.add_argument("--levers", action="store_true",
                        help="measure the step as each lever is added, each in a fresh process")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--levers: rounds over the list (the fastest of each kept)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.batch_size, args.length, args.steps, args.rounds, args.real_steps) < 1 or (
            args.warmup < 0):
        parser.error("--batch_size, --length, --steps, --rounds and --real_steps must be at "
                     "least 1 and --warmup at least 0")
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.levers:
        write_result(args.output_json, levers(args))
        return
    if args.speedups:
        write_result(args.output_json, speedups(args))
        return
    if args.train_data:
        results = []
        for buckets in [int(b) for b in args.buckets.split(",")]:
            result = measure_real_data(args.train_data, args.vocab, buckets, args.steps,
                                       args.batch_size, args.length)
            print(f"length_buckets={buckets}: {result['pairs_per_second']:.1f} pairs/s, "
                  f"padding {100 * result['padding_waste']:.1f} %", flush=True)
            results.append(result)
        output = {"benchmark": "train_throughput_real_data", "machine": machine(),
                  "train_data": args.train_data, "vocab": args.vocab,
                  "batch_size": args.batch_size, "length": args.length,
                  "objective": "ams+fd+ld", "results": results}
        with open(args.output_json, "w") as f:
            json.dump(output, f, indent=2)
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        vocab = synthetic_vocabulary(os.path.join(tmp, "vocab.txt"))
        for preset in args.presets.split(","):
            for mixed in ([False, True] if args.mixed_precision else [False]):
                result = measure(preset, vocab, args.batch_size, args.length, args.warmup,
                                 args.steps, mixed)
                print(f"{preset} ({'bf16' if mixed else 'fp32'}): "
                      f"{result['seconds_per_step']:.2f} s/step, "
                      f"{result['pairs_per_second']:.1f} pairs/s")
                results.append(result)
    output = {"benchmark": "train_throughput", "machine": machine(),
              "batch_size": args.batch_size, "length": args.length,
              "vocabulary_size": VOCABULARY_SIZE, "objective": "ams+fd+ld", "results": results}
    speeds = {(r["preset"], r["mixed_precision"]): r["pairs_per_second"] for r in results}
    if ("lealla_small", False) in speeds and ("labse", False) in speeds:
        output["lealla_small_over_labse"] = speeds[("lealla_small", False)] / speeds[("labse", False)]
        print(f"lealla_small trains {output['lealla_small_over_labse']:.2f}x faster than labse")
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(output, f, indent=2)


if __name__ == "__main__":
    main()
