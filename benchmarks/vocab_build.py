r"""Benchmark: learn a vocabulary from all of ../shared/data/parallel, report on tatoeba_dev.

    python -m benchmarks.vocab_build --vocab_size=32000 --output_json=runs/vocab_wordpiece_32k.json
    python -m benchmarks.vocab_build --vocab_size=32000 --sentencepiece \\
        --output_json=runs/vocab_sentencepiece_32k.json

Writes time, [UNK] rate and tokens per sentence per Tatoeba language, and the machine.
`benchmarks/results/vocab_build.json` keeps one such result for each kind of
vocabulary, under `variants` (wordpiece_32k, wordpiece_64k, sentencepiece_32k),
with the command that wrote it under `commands`.
"""

import argparse
import json
import os
import tempfile
import time

from benchmarks.common import machine
from lealla_tf.recipe.config import find_data_dir
from lealla_tf.tokenizers.vocabulary import build_vocabulary, format_report, vocabulary_report


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--sentencepiece", action="store_true")
    parser.add_argument("--output_json", required=True)
    args = parser.parse_args()
    data_dir = find_data_dir(args.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "vocab.model" if args.sentencepiece else "vocab.txt")
        summary = build_vocabulary([str(data_dir / "parallel")], args.vocab_size, output,
                                   sentencepiece=args.sentencepiece, progress=False)
        start = time.time()
        report = vocabulary_report(summary["output"], str(data_dir / "tatoeba_dev"))
        report_seconds = time.time() - start
    print(format_report(report))
    result = {"benchmark": "vocab_build", "machine": machine(), "build": summary,
              "report_seconds": report_seconds, "tatoeba_dev": report}
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(f"built in {summary['seconds']:.1f} s; average unk rate "
          f"{100 * report['average']['unk_rate']:.2f}%, "
          f"{report['average']['tokens_per_sentence']:.2f} tokens/sentence -> {args.output_json}")


if __name__ == "__main__":
    main()
