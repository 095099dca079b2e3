r"""Benchmark: the student's encoder compiled with XLA (`jit_compile`) against the plain graph.

    python -m benchmarks.compiled_encoder --model_dir=runs/recipe/student \\
        --output_json=benchmarks/results/compiled_encoder.json

Same trained encoder, same sentences (drawn evenly across tatoeba_dev), same
length-sorted batches of 64 in one process. Token ids are padded to a
multiple of 8 so XLA compiles a handful of shapes; every shape is compiled
(and the plain graph traced) in an untimed pass first. Reports sentences/s of
each with oneDNN as this process has it, and the largest difference between
their embeddings.
"""

import argparse
import time

import lealla_tf  # noqa: F401  (oneDNN default before TensorFlow loads)
from benchmarks.common import machine, write_result


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--num_sentences", type=int, default=4000)
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args()

    import os

    import numpy as np
    import tensorflow as tf

    from benchmarks.common import tatoeba_sentences
    from lealla_tf.inference.export import JIT_LENGTH_MULTIPLE, pad_to_multiple
    from lealla_tf.models.model_dir import load_encoder, load_tokenizer
    from lealla_tf.recipe.config import find_data_dir
    from lealla_tf.train.data import trim_to_longest

    sentences = tatoeba_sentences(find_data_dir(args.data_dir), args.num_sentences)
    encoder, tokenizer = load_encoder(args.model_dir), load_tokenizer(args.model_dir)
    batches = []
    inputs = tokenizer(tf.constant(sentences))
    lengths = inputs["input_mask"].numpy().sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), args.batch_size):
        rows = order[start:start + args.batch_size]
        batch = trim_to_longest({k: tf.gather(v, rows) for k, v in inputs.items()})
        batches.append(pad_to_multiple(batch, JIT_LENGTH_MULTIPLE, tokenizer.pad_id,
                                       limit=encoder.max_sequence_length))

    def embed(batch):
        return encoder(batch, training=False)["sentence_embedding"]

    result = {"benchmark": "compiled_encoder", "machine": machine(), "model_dir": args.model_dir,
              "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "sentences": len(sentences),
              "shapes": len({tuple(b["input_word_ids"].shape) for b in batches}), "variants": {}}
    outputs = {}
    for name, jit in (("graph", False), ("xla_jit_compile", True)):
        function = tf.function(embed, jit_compile=jit)
        start = time.perf_counter()
        for batch in batches:  # compiles / traces every shape
            function(batch)
        compile_seconds = time.perf_counter() - start
        start = time.perf_counter()
        outputs[name] = np.concatenate([function(batch).numpy() for batch in batches])
        seconds = time.perf_counter() - start
        result["variants"][name] = {"seconds": seconds, "first_pass_seconds": compile_seconds,
                                    "sentences_per_second": len(sentences) / seconds}
        print(f"{name}: {len(sentences) / seconds:.1f} sentences/s", flush=True)
    result["max_abs_difference"] = float(np.abs(outputs["graph"]
                                                - outputs["xla_jit_compile"]).max())
    result["xla_over_graph"] = (result["variants"]["xla_jit_compile"]["sentences_per_second"]
                                / result["variants"]["graph"]["sentences_per_second"])
    write_result(args.output_json, result)


if __name__ == "__main__":
    main()
