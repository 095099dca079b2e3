r"""Benchmark: how anisotropic the teacher's vectors are, raw and centred.

    python -m benchmarks.teacher_anisotropy --train_data=runs/recipe/pairs_teacher \
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
import sys

import numpy as np

from benchmarks.common import machine, write_result


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
    from lealla_tf.train.data import (
        TFRECORD_SUFFIXES,
        _record_pairs,
        find_training_files,
        precomputed_teacher_layout,
    )
    from lealla_tf.train.teacher_sources import CenteredTeacher, PrecomputedTeacher

    files = find_training_files([args.train_data])
    layout = precomputed_teacher_layout(files)
    if layout is None or not layout[1]:
        sys.exit(f"{args.train_data}: no teacher vectors of both sides (write them with "
                 "beam_pipelines/embed_corpus.py --pairs)")
    paths = [f.path for f in files if f.path.endswith(TFRECORD_SUFFIXES)]
    # The vectors the trainer sees: unit rows, then centred by `--teacher_center`
    # (here with the mean of every pair, not of the first 2,048).
    raw = PrecomputedTeacher(layout[0], has_source=True)
    batches = [raw.batch_features(b) for b in _record_pairs(paths, layout[0]).batch(4096)]
    centred = CenteredTeacher(raw)
    estimate = centred.estimate_mean(batches)
    permutation = np.random.default_rng(0).permutation(estimate["pairs"])
    result = {"benchmark": "teacher_anisotropy", "machine": machine(),
              "train_data": args.train_data, "pairs": estimate["pairs"],
              "mean_norm": estimate["mean_norm"]}
    for name, teacher in (("raw", raw), ("centred", centred)):
        vectors = [teacher.vectors(b) for b in batches]
        source = np.concatenate([v[0].numpy() for v in vectors])
        target = np.concatenate([v[1].numpy() for v in vectors])
        result[name] = statistics(source, target, permutation, args.retrieval_pairs)
    write_result(args.output_json, result)


if __name__ == "__main__":
    main()
