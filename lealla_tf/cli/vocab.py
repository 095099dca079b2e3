"""`lealla-vocab --input=<TSV files or dirs> --vocab_size=N --output=vocab.txt`

Learns a cased WordPiece vocabulary in the format of LaBSE's `cased_vocab.txt`
(or, with `--sentencepiece`, a SentencePiece model) for users who do not have
LaBSE's 501,153-token vocabulary. The command line only: the method is in
`lealla_tf.tokenizers.vocabulary`.
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import json
import os
import sys
import time

from lealla_tf.cli.evaluate import check_writable
from lealla_tf.flags import ArgumentParser, HelpFormatter


def main(argv=None) -> int:
    parser = ArgumentParser(
        prog="lealla-vocab", formatter_class=HelpFormatter,
        description="Learn a multilingual WordPiece vocabulary (or SentencePiece model) "
                    "from parallel TSV files.")
    parser.add_argument("--input", required=True, action="append",
                        help="TSV file, directory or glob (xx<TAB>en, .tsv or .tsv.gz); "
                             "repeat or comma-separate for several")
    parser.add_argument("--vocab_size", type=int, required=True)
    parser.add_argument("--output", required=True,
                        help="vocabulary file to write (a .model file with --sentencepiece)")
    parser.add_argument("--sentencepiece", action="store_true",
                        help="learn a SentencePiece (unigram) model instead of WordPiece")
    parser.add_argument("--alpha", type=float, default=0.3,
                        help="language sampling exponent: 1 = corpus proportions, 0 = uniform")
    parser.add_argument("--max_words", type=int, default=2_000_000,
                        help="most frequent (balanced) words given to the WordPiece learner")
    parser.add_argument("--character_coverage", type=float, default=0.9999)
    parser.add_argument("--tatoeba_dir", default=None,
                        help="report [UNK] rate and tokens/sentence on this Tatoeba directory")
    parser.add_argument("--report_json", default=None,
                        help="where to write the JSON summary (default: next to --output)")
    args = parser.parse_args(argv)
    # The vocabulary's tools load TensorFlow: after the flags, so that --help and a
    # bad flag answer before it (tests/cli/test_scripts.py).
    from lealla_tf.tokenizers.vocabulary import (
        RESERVED_TOKENS,
        build_vocabulary,
        check_output,
        format_report,
        vocabulary_report,
    )

    if args.vocab_size <= len(RESERVED_TOKENS):
        parser.error(f"--vocab_size must exceed {len(RESERVED_TOKENS)}")
    inputs = [p for value in args.input for p in value.split(",") if p]
    try:
        # Both outputs checked before the vocabulary is learned (minutes), not after.
        check_output(args.output, args.sentencepiece)
        written = args.output
        if args.sentencepiece and not written.endswith(".model"):
            written += ".model"
        report_json = args.report_json or os.path.splitext(written)[0] + ".report.json"
        check_writable(written, "--output")
        check_writable(report_json, "--report_json")
        summary = build_vocabulary(inputs, args.vocab_size, args.output,
                                   sentencepiece=args.sentencepiece, alpha=args.alpha,
                                   max_words=args.max_words,
                                   character_coverage=args.character_coverage)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Learned a {summary['kind']} vocabulary of {summary['vocab_size']:,} tokens from "
          f"{summary['pairs']:,} pairs in {summary['files']} files ({summary['languages']} "
          f"languages; {summary['malformed_lines_skipped']} malformed lines skipped) "
          f"in {summary['seconds']:.1f} s -> {summary['output']}")
    if args.tatoeba_dir:
        report_start = time.time()
        report = vocabulary_report(summary["output"], args.tatoeba_dir)
        print(format_report(report))
        summary["tatoeba"] = report
        summary["report_seconds"] = time.time() - report_start
    with open(report_json, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    print(f"summary written to {report_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
