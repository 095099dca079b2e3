"""Benchmark: how anisotropic the teacher's vectors are, raw and centred.

    python benchmarks/teacher_anisotropy.py --train_data=runs/recipe/pairs_teacher \
        --output_json=benchmarks/results/teacher_anisotropy.json

Reads the training pairs' precomputed teacher vectors (both sides, as the main
job writes them) and reports, for the raw unit vectors and for the centred ones
that `--teacher_center` distils from ((v - mu) / |v - mu|, mu the mean of both
sides): the norm of the mean, the average cosine of translations and of
unrelated pairs (a fixed random permutation), and P@1 of retrieving the
translation among the first --retrieval_pairs pairs. This is why the raw
targets of FD (squared distance) and LD (cosine matrix) mostly measure one
shared direction.
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.vocab_build import machine, write_result  # noqa: E402


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def statistics(source, target, permutation, retrieval_pairs) -> dict:
    n = min(retrieval_pairs, len(source))
    scores = source[:n] @ target[:n].T
    return {"translation_cosine": float(np.mean(np.sum(source * target, axis=1))),
            "unrelated_cosine": float(np.mean(np.sum(source * target[permutation], axis=1))),
            "retrieval_pairs": n,
            "p_at_1": float(np.mean(scores.argmax(axis=1) == np.arange(n)))}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train_data", default="runs/recipe/pairs_teacher")
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--retrieval_pairs", type=int, default=2000)
    args = parser.parse_args()
    import tensorflow as tf

    from lealla_tf.data import find_training_files
    from lealla_tf.embedding_io import PAIR_TEACHER_SOURCE, PAIR_TEACHER_TARGET

    files = [f.path for f in find_training_files([args.train_data])]
    if not files:
        sys.exit(f"no training files under {args.train_data}")
    source, target = [], []
    records = [tf.data.TFRecordDataset(path, "GZIP" if path.endswith(".gz") else "")
               for path in files]
    for record in (r for dataset in records for r in dataset):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        if PAIR_TEACHER_SOURCE not in feature:
            sys.exit(f"{args.train_data}: no teacher vectors of the source side "
                     f"({PAIR_TEACHER_SOURCE})")
        source.append(feature[PAIR_TEACHER_SOURCE].float_list.value)
        target.append(feature[PAIR_TEACHER_TARGET].float_list.value)
    source, target = unit(np.array(source)), unit(np.array(target))
    permutation = np.random.default_rng(0).permutation(len(source))
    mean = np.concatenate([source, target]).mean(axis=0)
    result = {"benchmark": "teacher_anisotropy", "machine": machine(),
              "train_data": args.train_data, "pairs": len(source),
              "mean_norm": float(np.linalg.norm(mean)),
              "raw": statistics(source, target, permutation, args.retrieval_pairs),
              "centred": statistics(unit(source - mean), unit(target - mean), permutation,
                                    args.retrieval_pairs)}
    write_result(args.output_json, result)


if __name__ == "__main__":
    main()
