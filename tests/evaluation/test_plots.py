"""Plots: the per-language bar chart sorted best on top with each series' average,
and the training curves of every loss term and the dev P@1."""

import json
import pathlib

import pytest

from lealla_tf.evaluation import plots
from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def kept_figures(monkeypatch):
    """pyplot whose `close` keeps the figure, so a test can read what was drawn."""
    plt = plots._pyplot()
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    yield figures
    for figure in figures:
        figure.clf()
    plt.close("all")


def test_languages_are_sorted_best_on_top_with_each_series_average(tmp_path, kept_figures):
    series = {"student": {"deu": 0.9, "fra": 0.5, "cmn": 0.7},
              "teacher": {"deu": 0.95, "fra": 0.8, "cmn": 0.6}}
    path = plots.plot_per_language(series, str(tmp_path / "sub" / "p.png"), "Tatoeba")
    assert pathlib.Path(path).read_bytes()[:8] == PNG_MAGIC
    (axis,) = kept_figures[0].axes
    # barh draws the first label at the bottom: the student's best ends on top.
    assert [t.get_text() for t in axis.get_yticklabels()] == ["fra", "cmn", "deu"]
    assert [t.get_text() for t in axis.get_legend().get_texts()] == [
        "student (average 70.0)", "teacher (average 78.3)"]
    student_bars = axis.containers[0]
    assert [round(bar.get_width(), 3) for bar in student_bars] == [50.0, 70.0, 90.0]
    assert axis.get_title() == "Tatoeba"


def test_training_curves_draw_every_term_unweighted_and_the_dev_p_at_1(tmp_path,
                                                                      kept_figures):
    student, alone = tmp_path / "student", tmp_path / "alone"
    for folder, terms in ((student, ("ams", "fd")), (alone, ("ams",))):
        folder.mkdir()
        rows = [{"step": step, "loss": 9.0, "learning_rate": 1e-3,
                 **{term: 1.0 / step for term in terms}} for step in (1, 2, 3)]
        (folder / "train_log.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows) + "\n")
    (student / "eval_log.jsonl").write_text(
        json.dumps({"step": 3, TATOEBA_PRIMARY_METRIC: 0.5}) + "\n")
    path = plots.plot_training({"student": str(student), "AMS alone": str(alone)},
                               str(tmp_path / "curves.png"), eval_pairs=50)
    assert pathlib.Path(path).read_bytes()[:8] == PNG_MAGIC
    loss_axis, p_axis = kept_figures[0].axes
    # the terms, not the total or the rate
    assert [line.get_label() for line in loss_axis.get_lines()] == [
        "student: ams", "student: fd", "AMS alone: ams"]
    assert [line.get_label() for line in p_axis.get_lines()] == ["student"]
    assert list(p_axis.get_lines()[0].get_ydata()) == [50.0]
    assert p_axis.get_ylabel() == "Tatoeba dev P@1 (%), first 50 pairs a language"


def test_a_missing_log_reads_as_no_rows(tmp_path):
    assert plots.read_jsonl(str(tmp_path / "none.jsonl")) == []
