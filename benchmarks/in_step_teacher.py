r"""Benchmark: the teacher vectors the main job trains on, in the step vs through Beam.

    python -m benchmarks.in_step_teacher --work_dir=runs/recipe \
        --output_json=benchmarks/results/in_step_teacher.json

Since 5948dfd the main job takes the FD/LD targets from the teacher pass the hd
term runs in each step (`lealla_tf.train.teacher_sources.InStepTeacher`): the converted
teacher's encoder on the student's own tokens (the pruned vocabulary, cut at
--max_seq_length), without the module's "query: " prefix (`in_step`), or with
its pieces put after the start token (`in_step_prefix`, not what training
uses: it measures worse). The Beam stage embeds the text with the teacher
module (its own tokenizer, the prefix, the same cut, which there includes the
prefix). `in_step_teacher_vocabulary` and `in_step_teacher_vocabulary_prefix`
run the same pass on the teacher's full vocabulary instead of the student's
pruned one: what the pruning costs the targets. This compares them on the same
sentences, from a finished main job's work directory (its teacher/, vocab.model
and sample/):

- cosine between each in-step vector and the Beam one of each sentence of the
  first training pairs;
- Tatoeba dev P@1 of each on the first --max_pairs pairs of every language;
- sentences/s of each, one process, batches of --batch_size.
"""

import argparse
import os
import pathlib
import sys
import time

from benchmarks.common import machine, write_result
from lealla_tf.recipe.config import find_data_dir


def in_step_embedder(teacher_dir: str, vocab_file: str, max_seq_length: int,
                     hidden_dim: int = 128, num_layers: int = 24, prefix: str = ""):
    """strings -> the in-step teacher's unit vectors (the training step's x^t, y^t);
    the student's width and depth (lealla_small's by default) only pick hd's
    coordinates and layers, which the vectors do not use. `prefix`: as
    `TeacherLayers`' (none by default, as in training)."""
    import tensorflow as tf

    from lealla_tf.configs import TokenizerConfig
    from lealla_tf.models.model_dir import build_tokenizer
    from lealla_tf.train.heads import TeacherLayers
    from lealla_tf.train.initialization import student_pieces
    from lealla_tf.train.teacher_sources import InStepTeacher

    tokenizer = build_tokenizer(TokenizerConfig(max_seq_length=max_seq_length), vocab_file)
    teacher = InStepTeacher(TeacherLayers(teacher_dir, student_pieces(tokenizer), hidden_dim,
                                          num_layers, max_seq_length, prefix=prefix))

    @tf.function
    def embed(strings):
        tokens = tokenizer(strings)
        return teacher.vectors({"source": tokens, "target": tokens})[0]

    return lambda strings: embed(tf.convert_to_tensor(strings, tf.string)).numpy()


def main():
    import numpy as np

    from lealla_tf.evaluation.retrieval import embed_sentences, evaluate_tatoeba
    from lealla_tf.inference.embedder import load_embedder
    from lealla_tf.parallel_corpus import read_pairs
    from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE
    from lealla_tf.train.heads import teacher_prefix

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--work_dir", default="runs/recipe",
                        help="a finished main job's work directory")
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--sample_pairs", type=int, default=10,
                        help="first training pairs of each language compared")
    parser.add_argument("--max_pairs", type=int, default=100,
                        help="Tatoeba dev pairs a language (0: all)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--output_json", required=True)
    args = parser.parse_args()

    work = pathlib.Path(args.work_dir)
    teacher_dir, vocab_file = str(work / "teacher"), str(work / "vocab.model")
    for path in (teacher_dir, vocab_file, str(work / "sample")):
        if not os.path.exists(path):
            sys.exit(f"error: {path} is missing; run the main job (make main) first")
    tatoeba_dir = str(find_data_dir(args.data_dir) / "tatoeba_dev")
    full = os.path.join(teacher_dir, SENTENCEPIECE_FILE)
    prefix = teacher_prefix(teacher_dir)
    # Built one at a time in the loop below: each loads the 117M-parameter teacher.
    embedders = {
        "beam_module": lambda: load_embedder(teacher_dir, args.max_seq_length),
        "in_step": lambda: in_step_embedder(teacher_dir, vocab_file, args.max_seq_length),
        "in_step_prefix": lambda: in_step_embedder(teacher_dir, vocab_file, args.max_seq_length,
                                                   prefix=prefix),
        "in_step_teacher_vocabulary": lambda: in_step_embedder(teacher_dir, full,
                                                               args.max_seq_length),
        "in_step_teacher_vocabulary_prefix": lambda: in_step_embedder(
            teacher_dir, full, args.max_seq_length, prefix=prefix)}

    sentences = []
    for path in sorted((work / "sample").glob("*.tsv.gz")):
        sentences += [s for pair in list(read_pairs(str(path)))[:args.sample_pairs]
                      for s in pair]
    vectors, speed, tatoeba = {}, {}, {}
    for name, build in embedders.items():
        embed = build()
        embed(sentences[:8])  # warm-up
        start = time.time()
        vectors[name] = embed_sentences(embed, sentences, batch_size=args.batch_size)
        speed[name] = len(sentences) / (time.time() - start)
        metrics = evaluate_tatoeba(embed, tatoeba_dir, max_pairs=args.max_pairs or None,
                                   batch_size=args.batch_size)
        tatoeba[name] = metrics["tatoeba/average_p_at_1"]
        print(f"{name}: {speed[name]:.0f} sentences/s, Tatoeba P@1 {100 * tatoeba[name]:.2f}")
    unit = {k: v / np.linalg.norm(v, axis=1, keepdims=True) for k, v in vectors.items()}
    cosines = {name: np.sum(unit["beam_module"] * unit[name], axis=1)
               for name in embedders if name != "beam_module"}
    write_result(args.output_json, {
        "benchmark": "in_step_teacher", "machine": machine(), "work_dir": str(work),
        "max_seq_length": args.max_seq_length, "sample_sentences": len(sentences),
        "cosine_vs_beam": {name: {"mean": float(c.mean()), "min": float(c.min()),
                                  "p05": float(np.percentile(c, 5))}
                           for name, c in cosines.items()},
        "tatoeba_max_pairs": args.max_pairs, "tatoeba_p_at_1": tatoeba,
        "sentences_per_second": speed})


if __name__ == "__main__":
    main()
