"""Benchmark: SavedModel size of each main preset, and exported lealla_small vs labse speed.

    python -m benchmarks.export_size_speed --output_json=benchmarks/results/export_size_speed.json

Every preset gets LaBSE's vocabulary size (501,153 tokens): a WordPiece vocabulary
learned from ../shared/data/parallel (32k) extended with unique private-use-area
filler tokens that never match text, so the embedding tables and the asset have
the released models' sizes. Weights are random (speed does not depend on them).
Throughput is measured on the same sentences from tatoeba_dev (both sides), in
corpus order, same batch size, one process, after one warm-up batch.
"""

import argparse
import json
import os
import shutil
import tempfile
import time

from benchmarks.common import (
    LABSE_VOCABULARY_SIZE,
    labse_sized_vocabulary,
    machine,
    tatoeba_sentences,
)
from lealla_tf.recipe.config import find_data_dir


def throughput(model, sentences, batch_size):
    import tensorflow as tf

    model(tf.constant(sentences[:batch_size]))  # warm-up (traces nothing new: SavedModel)
    start = time.perf_counter()
    for i in range(0, len(sentences), batch_size):
        model(tf.constant(sentences[i:i + batch_size])).numpy()
    seconds = time.perf_counter() - start
    return {"sentences": len(sentences), "seconds": seconds,
            "sentences_per_second": len(sentences) / seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--presets", default="lealla_small,lealla_base,lealla_large,labse")
    parser.add_argument("--speed_presets", default="lealla_small,labse")
    parser.add_argument("--num_sentences", type=int, default=10000)
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args()

    import gc

    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from lealla_tf.inference.export import export_lealla_model, saved_model_size
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.models.presets import count_parameters, get_preset
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    data_dir = find_data_dir(args.data_dir)
    sentences = tatoeba_sentences(data_dir, args.num_sentences)
    work = tempfile.mkdtemp(prefix="export_bench_")
    result = {"benchmark": "export_size_speed", "machine": machine(),
              "vocabulary_size": LABSE_VOCABULARY_SIZE, "batch_size": args.batch_size,
              "presets": {}}
    try:
        vocab = labse_sized_vocabulary(data_dir, os.path.join(work, "vocab.txt"))
        tokenizer = Tokenizer(vocab)
        for name in args.presets.split(","):
            config = get_preset(name).encoder
            encoder = build_encoder(config)
            path = os.path.join(work, name)
            start = time.time()
            export_lealla_model(encoder, tokenizer, path)
            entry = {"parameters": count_parameters(config), "embedding_dim": config.hidden_dim,
                     "saved_model_bytes": saved_model_size(path),
                     "export_seconds": time.time() - start}
            del encoder
            gc.collect()
            if name in args.speed_presets.split(","):
                entry["throughput"] = throughput(tf.saved_model.load(path), sentences,
                                                 args.batch_size)
                print(f"{name}: {entry['throughput']['sentences_per_second']:.1f} sentences/s")
            print(f"{name}: {entry['saved_model_bytes'] / 1e6:.1f} MB")
            result["presets"][name] = entry
            shutil.rmtree(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    speeds = {n: e["throughput"]["sentences_per_second"]
              for n, e in result["presets"].items() if "throughput" in e}
    if "lealla_small" in speeds and "labse" in speeds:
        result["lealla_small_over_labse_speed"] = speeds["lealla_small"] / speeds["labse"]
        result["labse_over_lealla_small_size"] = (
            result["presets"]["labse"]["saved_model_bytes"]
            / result["presets"]["lealla_small"]["saved_model_bytes"])
        print(f"lealla_small is {result['lealla_small_over_labse_speed']:.2f}x faster and "
              f"{result['labse_over_lealla_small_size']:.2f}x smaller than labse")
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
