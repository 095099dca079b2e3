r"""`lealla-evaluate`: evaluate a model on Tatoeba (and optionally BUCC-format sets).

    lealla-evaluate --model=exports/small --tatoeba_dir=../shared/data/tatoeba_dev \
        --output_json=reports/small_tatoeba.json [--plot=reports/small_tatoeba.png] \
        [--bucc_dir=DIR --bucc_languages=deu,fra]

--model is a LEALLA-format SavedModel, a LaBSE/2-format directory (preprocessor/ +
encoder/), a training model directory, or a TF-Hub handle. The JSON holds flat
metrics; the average Tatoeba P@1 (the LASER / LaBSE protocol: cosine nearest
neighbour both ways, averaged over directions, then languages) is under the key
`tatoeba/average_p_at_1`, the margin-based variant under
`tatoeba_margin/average_p_at_1`.

Inputs are checked before the model is loaded: a Tatoeba language with one file
of its two, or a BUCC split whose `.gold` file is missing, empty or names ids
that are in neither sentence file, or a BUCC file that holds one id twice, exits 2
naming the file (and the line and id); such a fault would otherwise change the
average, the recall or the F1 without a word. Each BUCC F1 is printed with the
gold pairs behind it (`bucc/<lang>/gold_pairs` in the JSON), with a caveat under
100.
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import json
import os
import sys
import time

from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.inference.batching import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS


def check_writable(path: str, flag: str) -> None:
    """ValueError now, before a long evaluation, when `path` cannot be written."""
    if os.path.isdir(path):
        raise ValueError(f"{flag}={path} is a directory; pass a file path")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{flag}={path}: cannot create {directory} ({error.strerror})") from None
    if not os.access(directory, os.W_OK):
        raise ValueError(f"{flag}={path}: {directory} is not writable")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="lealla-evaluate", description=__doc__,
                            formatter_class=HelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tatoeba_dir", required=True)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--plot", default=None, help="PNG path (default: next to the JSON)")
    parser.add_argument("--max_pairs", type=int, default=0, help="pairs per language (0: all)")
    parser.add_argument("--batch_size", type=int, default=PIPELINE_BATCH_SIZE,
                        help="sentences per call, at most (each call also holds at most "
                             f"{PIPELINE_MAX_TOKENS} padded tokens where the model's tokens "
                             "are known)")
    parser.add_argument("--bucc_dir", default=None, help="BUCC-format directory")
    parser.add_argument("--bucc_languages", default="", help="comma-separated, e.g. deu,fra")
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)

    from lealla_tf.evaluation.bucc import evaluate_bucc, gold_pairs_note, read_bucc_split
    from lealla_tf.evaluation.plots import plot_per_language
    from lealla_tf.evaluation.tatoeba import (
        TATOEBA_MEAN_COSINE,
        TATOEBA_PRIMARY_METRIC,
        format_tatoeba_table,
        per_language,
        tatoeba_with_margin,
    )
    from lealla_tf.inference.collapse import collapse_warning
    from lealla_tf.inference.loaders import load_embedder
    from lealla_tf.parallel_corpus import find_tatoeba_languages

    plot = args.plot or os.path.splitext(args.output_json)[0] + ".png"
    languages = [code for code in args.bucc_languages.split(",") if code]
    try:
        if args.max_pairs < 0:
            raise ValueError(f"--max_pairs must be >= 0 (0: all pairs), got {args.max_pairs}")
        if args.batch_size < 1:
            raise ValueError(f"--batch_size must be at least 1, got {args.batch_size}")
        if args.bucc_dir and not languages:
            raise ValueError("--bucc_dir needs --bucc_languages")
        check_writable(args.output_json, "--output_json")
        check_writable(plot, "--plot")
        # The inputs before the model: an incomplete Tatoeba language or a BUCC
        # gold fault is named now, not after loading and embedding.
        find_tatoeba_languages(args.tatoeba_dir)
        for language in languages if args.bucc_dir else []:
            for split in ("training", "test"):
                read_bucc_split(args.bucc_dir, language, split)
        start = time.time()
        embedder = load_embedder(args.model)
        metrics = tatoeba_with_margin(embedder, args.tatoeba_dir, args.max_pairs or None,
                                      progress=not args.no_progress,
                                      batch_size=args.batch_size)
        if args.bucc_dir:
            metrics.update(evaluate_bucc(embedder, args.bucc_dir, languages))
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    metrics["seconds"] = time.time() - start
    result = {"model": args.model, "primary_metric": TATOEBA_PRIMARY_METRIC,
              "embedding_dim": embedder.dimension, "metrics": metrics}
    # A model that maps every sentence to one point is named, not just scored.
    collapsed = collapse_warning(metrics.get(TATOEBA_MEAN_COSINE, float("nan")),
                                 f"the model {args.model}")
    if collapsed:
        result["collapse_warning"] = collapsed
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    average = 100 * metrics[TATOEBA_PRIMARY_METRIC]
    plot_per_language({os.path.basename(os.path.normpath(args.model)): per_language(metrics)},
                      plot, f"Tatoeba P@1 — average {average:.2f}%")
    print(format_tatoeba_table(metrics))
    for language in languages if args.bucc_dir else []:
        print(f"BUCC {language}: P {100 * metrics[f'bucc/{language}/precision']:.1f} "
              f"R {100 * metrics[f'bucc/{language}/recall']:.1f} "
              f"F1 {100 * metrics[f'bucc/{language}/f1']:.1f} "
              f"({gold_pairs_note(metrics[f'bucc/{language}/gold_pairs'])})")
    print(f"{TATOEBA_PRIMARY_METRIC} = {metrics[TATOEBA_PRIMARY_METRIC]:.4f}  -> "
          f"{args.output_json}, {plot}")
    if collapsed:
        print(collapsed, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
