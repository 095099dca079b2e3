"""Plots a person would rather look at than read (matplotlib, PNG)."""

import json
import os

import numpy as np

from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC
from lealla_tf.losses.objectives import OBJECTIVES


def _pyplot():
    """pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib  # noqa: PLC0415 - heavy; loaded when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after the backend is chosen

    return plt


def plot_per_language(series: dict[str, dict[str, float]], path: str, title: str) -> str:
    """A sorted horizontal bar chart of per-language P@1, one bar per series.

    Languages are rows, sorted by the first series (best at the top), so 56+
    languages read at a glance; each series' average is in the legend.
    """
    plt = _pyplot()
    names = list(series)
    first = series[names[0]]
    languages = sorted(first, key=lambda lang: (first[lang], lang))  # best ends on top
    height = 0.8 / len(names)
    figure, axis = plt.subplots(figsize=(7.5, max(4.0, 0.19 * len(languages) * max(
        1, len(names) * 0.6) + 1.2)))
    positions = np.arange(len(languages))
    for i, name in enumerate(names):
        values = [100 * series[name].get(lang, 0.0) for lang in languages]
        average = 100 * float(np.mean(list(series[name].values())))
        axis.barh(positions + (len(names) - 1 - i) * height - 0.4 + height / 2, values, height,
                  label=f"{name} (average {average:.1f})")
    axis.set_yticks(positions)
    axis.set_yticklabels(languages, fontsize=8)
    axis.set_ylim(-0.6, len(languages) - 0.4)
    axis.set_xlim(0, 100)
    axis.set_xlabel("Tatoeba P@1 (%)")
    axis.grid(axis="x", alpha=0.3)
    axis.set_title(title, fontsize=10)
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def read_jsonl(path: str) -> list:
    """Rows of a JSON-lines file ([] when it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_training(runs: dict[str, str], path: str, eval_pairs: int = 0) -> str:
    """Each loss term and dev P@1 against step, for each {name: model_dir}.

    The loss panel draws every term of every run unweighted (a term is the same
    quantity in each run that has it, e.g. AMS in the student and in AMS alone),
    not the weighted totals of different objectives. `eval_pairs`: the dev
    evaluations' pairs a language (0: all), named on the axis."""
    plt = _pyplot()
    figure, (loss_axis, p_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for name, model_dir in runs.items():
        rows = read_jsonl(os.path.join(model_dir, "train_log.jsonl"))
        terms = [key for key in (rows[0] if rows else {}) if key in OBJECTIVES]
        for term in terms:
            loss_axis.plot([r["step"] for r in rows], [r[term] for r in rows],
                           label=f"{name}: {term}", linewidth=0.8)
        evals = read_jsonl(os.path.join(model_dir, "eval_log.jsonl"))
        if evals:
            p_axis.plot([e["step"] for e in evals],
                        [100 * e[TATOEBA_PRIMARY_METRIC] for e in evals], marker="o", label=name)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss term, unweighted (training batch)")
    loss_axis.set_yscale("log")
    loss_axis.legend(fontsize=7)
    p_axis.set_xlabel("step")
    basis = f"first {eval_pairs} pairs a language" if eval_pairs else "all pairs"
    p_axis.set_ylabel(f"Tatoeba dev P@1 (%), {basis}")
    p_axis.legend(fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
