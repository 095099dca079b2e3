r"""Benchmark: Beam embedding throughput against the bare model, on the same sentences.

    python -m benchmarks.beam_throughput --vocab_file=runs/recipe/vocab.txt \
        --output_json=benchmarks/results/beam_throughput.json

An exported lealla_small (random weights: speed does not depend on them) embeds the
same --num_sentences sentences (Tatoeba dev, topped up from the parallel data)
(a) in-process, in length-sorted batches as the pipelines cut them (at most
1,024 sentences and 4,096 padded tokens a call), and (b) through
beam_pipelines/embed_corpus.py (its default batching, the same) on the FnApiRunner with
--workers worker processes (model loading and process start-up included: the
wall time a user sees).
"""

import argparse
import json
import os
import shutil
import tempfile
import time

from benchmarks.common import machine, tatoeba_sentences
from lealla_tf.recipe.config import find_data_dir


def benchmark_sentences(data_dir, count):
    """`count` non-empty sentences: Tatoeba dev across all languages, topped up
    (beyond its 90k sentences) with both sides of the parallel data, taken
    round-robin over languages."""
    from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

    sentences = [s for s in tatoeba_sentences(data_dir, count) if s.strip()]
    if len(sentences) < count:
        readers = [read_pairs(f.path) for f in find_parallel_files([str(data_dir / "parallel")])]
        while readers and len(sentences) < count:
            for reader in list(readers):
                pair = next(reader, None)
                if pair is None:
                    readers.remove(reader)
                    continue
                sentences += [s for s in pair if s.strip()]
    return sentences[:count]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab_file", required=True)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--num_sentences", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args()

    from lealla_tf.evaluation.retrieval import embed_sentences
    from lealla_tf.inference.embedder import load_embedder
    from lealla_tf.inference.export import export_lealla_model
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.models.presets import get_preset
    from lealla_tf.pipelines import embed_corpus
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    sentences = benchmark_sentences(find_data_dir(args.data_dir), args.num_sentences)
    work = tempfile.mkdtemp(prefix="beam_bench_")
    try:
        tokenizer = Tokenizer(args.vocab_file)
        encoder = build_encoder(get_preset("lealla_small").encoder.replace(
            vocabulary_size=tokenizer.vocab_size))
        model = export_lealla_model(encoder, tokenizer, os.path.join(work, "model"))
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("\n".join(sentences) + "\n")

        start = time.perf_counter()
        embedder = load_embedder(model)
        embed_sentences(embedder, sentences)  # the pipelines' batching, as the Beam job
        bare = time.perf_counter() - start

        start = time.perf_counter()
        manifest = embed_corpus.run([f"--input={corpus}", f"--model={model}",
                                     f"--output={os.path.join(work, 'out')}",
                                     f"--direct_num_workers={args.workers}",
                                     "--direct_running_mode=multi_processing"])
        beam = time.perf_counter() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"benchmark": "beam_throughput", "machine": machine(), "sentences": len(sentences),
              "bare_model": {"seconds": bare, "sentences_per_second": len(sentences) / bare},
              "beam": {"workers": args.workers, "seconds": beam,
                       "sentences_per_second": len(sentences) / beam,
                       "counts": manifest["counts"]}}
    result["beam_over_bare"] = result["beam"]["sentences_per_second"] / result["bare_model"][
        "sentences_per_second"]
    print(json.dumps(result, indent=2))
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
