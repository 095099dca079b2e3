r"""Benchmark: the int8 TFLite export against the float32 SavedModel of the same student.

    python -m benchmarks.int8_export --model_dir=runs/recipe/student \\
        --output_json=benchmarks/results/int8_export.json

Exports the trained model directory twice (LEALLA-format float32 SavedModel,
and `--format=int8_tflite`), then measures, in one process on the same
sentences: Tatoeba dev P@1 of each (all pairs, or the first `--max_pairs` of
each language), bytes on disk, and sentences/s through `Embedder.encode`
(length-aware batches of 64) on every sentence of the evaluation.
"""

import argparse
import os
import tempfile
import time

import lealla_tf  # noqa: F401  (oneDNN default before TensorFlow loads)
from benchmarks.common import machine, write_result


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", required=True, help="a trained model directory")
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--max_pairs", type=int, default=0,
                        help="first pairs of each language (0: all)")
    args = parser.parse_args()

    from lealla_tf.evaluation.retrieval import TATOEBA_PRIMARY_METRIC, evaluate_tatoeba
    from lealla_tf.inference.embedder import load_embedder
    from lealla_tf.inference.export import export_model_dir
    from lealla_tf.recipe.config import find_data_dir

    tatoeba = str(find_data_dir(args.data_dir) / "tatoeba_dev")
    result = {"benchmark": "int8_export", "machine": machine(), "model_dir": args.model_dir,
              "max_pairs": args.max_pairs or "all", "formats": {}}
    with tempfile.TemporaryDirectory(prefix="int8_bench_") as work:
        for export_format in ("lealla", "int8_tflite"):
            summary = export_model_dir(args.model_dir, os.path.join(work, export_format),
                                       export_format)
            embedder = load_embedder(summary["paths"]["model"])
            start = time.perf_counter()  # embedding both sides dominates; retrieval is a matmul
            metrics = evaluate_tatoeba(embedder, tatoeba, max_pairs=args.max_pairs or None,
                                       batch_size=64)
            seconds = time.perf_counter() - start
            sentences = 2 * sum(int(v) for k, v in metrics.items() if k.endswith("/pairs"))
            entry = {"p_at_1": 100 * metrics[TATOEBA_PRIMARY_METRIC],
                     "bytes": summary["bytes"]["model"], "sentences": sentences,
                     "seconds": seconds, "sentences_per_second": sentences / seconds}
            result["formats"][export_format] = entry
            print(f"{export_format}: P@1 {entry['p_at_1']:.2f}, "
                  f"{entry['bytes'] / 1e6:.1f} MB, "
                  f"{entry['sentences_per_second']:.1f} sentences/s", flush=True)
    fp32, int8 = result["formats"]["lealla"], result["formats"]["int8_tflite"]
    result["p_at_1_difference"] = int8["p_at_1"] - fp32["p_at_1"]
    result["size_ratio"] = fp32["bytes"] / int8["bytes"]
    result["speed_ratio"] = int8["sentences_per_second"] / fp32["sentences_per_second"]
    write_result(args.output_json, result)


if __name__ == "__main__":
    main()
