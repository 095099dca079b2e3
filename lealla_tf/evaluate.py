"""Evaluate a model on Tatoeba (and optionally BUCC-format sets): `python -m lealla_tf.evaluate`.

    python -m lealla_tf.evaluate --model=exports/small --tatoeba_dir=../shared/data/tatoeba_dev \
        --output_json=reports/small_tatoeba.json [--plot=reports/small_tatoeba.png] \
        [--bucc_dir=DIR --bucc_languages=deu,fra]

--model is a LEALLA-format SavedModel, a LaBSE/2-format directory (preprocessor/ +
encoder/), a training model directory, or a TF-Hub handle. The JSON holds flat
metrics; the average Tatoeba P@1 (the LASER / LaBSE protocol: cosine nearest
neighbour both ways, averaged over directions, then languages) is under the key
`tatoeba/average_p_at_1`, the margin-based variant under
`tatoeba_margin/average_p_at_1`.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

PRIMARY_METRIC = "tatoeba/average_p_at_1"


def tatoeba_with_margin(embedder, tatoeba_dir, max_pairs=None, progress=True):
    """Cosine and margin Tatoeba metrics from ONE embedding pass."""
    from lealla_tf.evaluation import embed_tatoeba, evaluate_tatoeba_margin, tatoeba_metrics

    embedded = embed_tatoeba(embedder, tatoeba_dir, max_pairs=max_pairs, progress=progress)
    metrics = tatoeba_metrics(embedded)
    metrics["tatoeba/sentences"] = 2 * sum(len(s) for s, _ in embedded.values())
    metrics.update(evaluate_tatoeba_margin({l: s for l, (s, _) in embedded.items()},
                                           {l: e for l, (_, e) in embedded.items()}))
    return metrics


def format_table(metrics: dict) -> str:
    """Per-language Tatoeba table (P@1 in %, both directions and margin)."""
    from lealla_tf.evaluation import per_language

    p_at_1 = per_language(metrics)
    lines = [f"{'language':<9}{'pairs':>7}{'xx->en':>9}{'en->xx':>9}{'P@1':>8}{'margin':>9}"]
    for language in sorted(p_at_1):
        lines.append(
            f"{language:<9}{int(metrics.get(f'tatoeba/{language}/pairs', 0)):>7}"
            f"{100 * metrics[f'tatoeba/{language}/xx_to_en']:>9.1f}"
            f"{100 * metrics[f'tatoeba/{language}/en_to_xx']:>9.1f}"
            f"{100 * p_at_1[language]:>8.1f}"
            f"{100 * metrics.get(f'tatoeba_margin/{language}/p_at_1', float('nan')):>9.1f}")
    lines.append(f"{'average':<9}{'':>7}{'':>9}{'':>9}{100 * metrics[PRIMARY_METRIC]:>8.2f}"
                 f"{100 * metrics.get('tatoeba_margin/average_p_at_1', float('nan')):>9.2f}")
    return "\n".join(lines)


def plot_per_language(series: dict, path: str, title: str) -> str:
    """A bar chart of per-language P@1, one bar group per series {name: {lang: value}}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(series)
    languages = sorted(series[names[0]], key=lambda lang: -series[names[0]][lang])
    width = 0.8 / len(names)
    figure, axis = plt.subplots(figsize=(max(8, 0.28 * len(languages) * len(names)), 4.5))
    positions = np.arange(len(languages))
    for i, name in enumerate(names):
        axis.bar(positions + i * width, [100 * series[name].get(lang, 0) for lang in languages],
                 width, label=name)
    axis.set_xticks(positions + width * (len(names) - 1) / 2)
    axis.set_xticklabels(languages, rotation=90, fontsize=7)
    axis.set_ylabel("Tatoeba P@1 (%)")
    axis.set_ylim(0, 100)
    axis.set_title(title)
    if len(names) > 1:
        axis.legend()
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lealla_tf.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tatoeba_dir", required=True)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--plot", default=None, help="PNG path (default: next to the JSON)")
    parser.add_argument("--max_pairs", type=int, default=0, help="pairs per language (0: all)")
    parser.add_argument("--bucc_dir", default=None, help="BUCC-format directory")
    parser.add_argument("--bucc_languages", default="", help="comma-separated, e.g. deu,fra")
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)

    from lealla_tf.embedder import load_embedder
    from lealla_tf.evaluation import evaluate_bucc, per_language

    try:
        start = time.time()
        embedder = load_embedder(args.model)
        metrics = tatoeba_with_margin(embedder, args.tatoeba_dir, args.max_pairs or None,
                                      progress=not args.no_progress)
        if args.bucc_dir:
            languages = [l for l in args.bucc_languages.split(",") if l]
            if not languages:
                raise ValueError("--bucc_dir needs --bucc_languages")
            metrics.update(evaluate_bucc(embedder, args.bucc_dir, languages))
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    metrics["seconds"] = time.time() - start
    result = {"model": args.model, "primary_metric": PRIMARY_METRIC,
              "embedding_dim": embedder.dimension, "metrics": metrics}
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    plot = args.plot or os.path.splitext(args.output_json)[0] + ".png"
    plot_per_language({os.path.basename(os.path.normpath(args.model)): per_language(metrics)},
                      plot, f"Tatoeba P@1 — average {100 * metrics[PRIMARY_METRIC]:.2f}%")
    print(format_table(metrics))
    if args.bucc_dir:
        for language in [l for l in args.bucc_languages.split(",") if l]:
            print(f"BUCC {language}: P {100 * metrics[f'bucc/{language}/precision']:.1f} "
                  f"R {100 * metrics[f'bucc/{language}/recall']:.1f} "
                  f"F1 {100 * metrics[f'bucc/{language}/f1']:.1f}")
    print(f"{PRIMARY_METRIC} = {metrics[PRIMARY_METRIC]:.4f}  -> {args.output_json}, {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
