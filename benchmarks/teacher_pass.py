r"""Benchmark: the in-step teacher's pass (hd targets and FD/LD vectors), module against rebuilt network.

    python -m benchmarks.teacher_pass --work_dir=runs/recipe \\
        --output_json=benchmarks/results/teacher_pass.json

The main job's student runs the frozen teacher on both sides of every batch
(`lealla_tf.train.heads.TeacherLayers`). This times that pass, in one process, on the
same batches, three ways:

- `module_float32`: the converted teacher's `encoder/` SavedModel (what every
  teacher converted before its teacher.json recorded the architecture runs);
- `network_float32`: the same weights as a `LeallaEncoder` rebuilt in-process
  (`lealla_tf.train.heads.teacher_network`), with `lealla_tf.models.kernels`' fused layers;
- `network_bfloat16`: that network under the mixed_bfloat16 policy (what
  `--mixed_precision` and the main job on a CPU with native bfloat16 run).

Batches are the main job's: `--batches` batches of `--batch_size` pairs from its
sample (`--work_dir`/sample), tokenized with its student vocabulary and cut at
`--max_seq_length`, both sides of a pair in one timed call, as in the step. For
each way: the median seconds a batch (both sides), and how far its outputs are
from the module's (largest absolute difference of the last layer and of the
mean-pooled vector, and the vectors' smallest cosine).
"""

import argparse
import os
import sys
import time

from benchmarks.common import machine, write_result


def batches(work_dir: str, count: int, batch_size: int, max_seq_length: int) -> list:
    """`count` batches of `batch_size` pairs of the main job's sample (as many of
    each language), tokenized with its student vocabulary: ([(source, target)],
    the tokenizer)."""
    import tensorflow as tf

    from lealla_tf.configs import TokenizerConfig
    from lealla_tf.models.model_dir import build_tokenizer
    from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

    tokenizer = build_tokenizer(TokenizerConfig(max_seq_length=max_seq_length),
                                os.path.join(work_dir, "vocab.model"))
    files = find_parallel_files([os.path.join(work_dir, "sample")])
    per_file = -(-count * batch_size // max(len(files), 1))  # every language, in turn
    pairs = []
    for parallel_file in files:
        pairs += list(read_pairs(parallel_file.path))[:per_file]
    if len(pairs) < count * batch_size:
        raise ValueError(f"{work_dir}/sample has {len(pairs)} pairs; need "
                         f"{count * batch_size} (--batches x --batch_size)")
    result = []
    for start in range(0, count * batch_size, batch_size):
        chunk = pairs[start:start + batch_size]
        result.append(tuple(tokenizer(tf.constant([pair[side] for pair in chunk]))
                            for side in (0, 1)))
    return result, tokenizer


def teacher_layers(teacher_dir: str, tokenizer, max_seq_length: int, way: str):
    import keras

    import lealla_tf.train.heads as heads
    from lealla_tf.train.initialization import student_pieces

    keras.mixed_precision.set_dtype_policy("mixed_bfloat16" if way == "network_bfloat16"
                                           else "float32")
    rebuild = heads.teacher_network
    if way == "module_float32":  # as for a teacher.json without the architecture
        heads.teacher_network = lambda directory: None
    try:
        return heads.TeacherLayers(teacher_dir, student_pieces(tokenizer), 128, 24,
                                   max_seq_length)
    finally:
        heads.teacher_network = rebuild
        keras.mixed_precision.set_dtype_policy("float32")


def measure(layers, data, rounds: int) -> tuple:
    """(median seconds a batch, the outputs of the first batch's source side)."""
    import numpy as np
    import tensorflow as tf

    @tf.function
    def step(source, target):
        a, b = layers.outputs(source), layers.outputs(target)
        return a["encoder_outputs"][-1], a["default"], b["default"]

    for source, target in data[:1]:
        first = [t.numpy() for t in step(source, target)]
    times = []
    for _ in range(rounds):
        for source, target in data:
            start = time.perf_counter()
            [t.numpy() for t in step(source, target)]
            times.append(time.perf_counter() - start)
    return float(np.median(times)), first


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/recipe", help="a finished main job's")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output_json", required=True)
    args = parser.parse_args(argv)
    if min(args.batches, args.batch_size, args.max_seq_length, args.rounds) < 1:
        parser.error("--batches, --batch_size, --max_seq_length and --rounds must be at least 1")
    teacher_dir = os.path.join(args.work_dir, "teacher")
    for needed in (teacher_dir, os.path.join(args.work_dir, "vocab.model"),
                   os.path.join(args.work_dir, "sample")):
        if not os.path.exists(needed):
            parser.error(f"{needed} is missing: run the main job (make main) first")
    import numpy as np

    from lealla_tf.teachers.conversion import read_teacher_summary

    if not (read_teacher_summary(teacher_dir) or {}).get("encoder_config"):
        parser.error(f"{teacher_dir}/teacher.json records no architecture (converted before "
                     "it did): convert the teacher again (delete it and rerun make main)")
    data, tokenizer = batches(args.work_dir, args.batches, args.batch_size, args.max_seq_length)
    rows = {}
    reference = None
    for way in ("module_float32", "network_float32", "network_bfloat16"):
        layers = teacher_layers(teacher_dir, tokenizer, args.max_seq_length, way)
        seconds, first = measure(layers, data, args.rounds)
        reference = reference or first
        vectors = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in (first[1], reference[1])]
        rows[way] = {"seconds_per_batch": seconds,
                     "pairs_per_second": args.batch_size / seconds,
                     "last_layer_max_abs_difference": float(np.abs(first[0] - reference[0]).max()),
                     "vector_max_abs_difference": float(np.abs(first[1] - reference[1]).max()),
                     "vector_min_cosine": float(np.min(np.sum(vectors[0] * vectors[1], axis=1)))}
        print(f"{way}: {1e3 * seconds:.0f} ms a batch (both sides), last layer max |diff| "
              f"{rows[way]['last_layer_max_abs_difference']:.2e}, vector cosine >= "
              f"{rows[way]['vector_min_cosine']:.6f}", flush=True)
    module = rows["module_float32"]["seconds_per_batch"]
    write_result(args.output_json, {
        "benchmark": "teacher_pass", "machine": machine(), "work_dir": args.work_dir,
        "batches": args.batches, "batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length, "rounds": args.rounds, "ways": rows,
        "speedup_over_module": {way: module / row["seconds_per_batch"]
                                for way, row in rows.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
