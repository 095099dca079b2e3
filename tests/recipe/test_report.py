"""The main job's report: built from each stage's result and written with its
summary and plots; every F1 states the gold pairs behind it, the corpus lines the
reader skipped are in the summary."""

import json

import pytest

from lealla_tf.recipe.report import build_report, format_summary, headline, write_report
from lealla_tf.recipe.settings import RecipeConfig


def tatoeba_metrics(p_at_1):
    return {"tatoeba/average_p_at_1": p_at_1, "tatoeba_margin/average_p_at_1": p_at_1,
            "tatoeba/deu/p_at_1": p_at_1, "sentences_per_second": 100.0,
            "tatoeba/sentences_per_second": 100.0, "max_pairs": 0}


def news_metrics(f1, gold=None):
    from lealla_tf.evaluation.news import length_band_names

    metrics = {"news/average_f1": f1, "news/deu/f1": f1, "news_length/average_p_at_1": 0.5,
               "news/seconds": 10.0}
    metrics.update({f"news_length/{band}/p_at_1": 0.5 for band in length_band_names()})
    if gold is not None:
        metrics.update({"news/gold_pairs": gold, "news/deu/gold_pairs": gold})
    return metrics


def tiny_report(news_gold=2, bucc_gold=3, with_metric_counts=True, sample=None):
    """A report as `lealla_tf.recipe.job.run_recipe` assembles it, of a tiny job."""
    gold = news_gold if with_metric_counts else None
    bucc = {"bucc/deu/f1": 0.6, "bucc/average_f1": 0.6}
    if with_metric_counts:
        bucc.update({"bucc/deu/gold_pairs": bucc_gold, "bucc/gold_pairs": bucc_gold})
    return {
        "stage_seconds": {"sample": 1.0}, "total_seconds": 60.0, "reused": [],
        "config": {"eval_max_pairs": 0},
        "sample": sample or {"pairs": 40, "languages": 2},
        "tatoeba": {"student": tatoeba_metrics(0.4), "teacher": tatoeba_metrics(0.6)},
        "distillation": None, "training": {},
        "export": {"parameters": 1000, "embedding_dim": 8, "bytes": {"model": 1e6},
                   "reload_max_abs_difference": 0.0},
        "news_set": {"languages": ["deu"], "gold": {"deu": {"training": 2,
                                                            "test": news_gold}}},
        "news": {"student": news_metrics(0.6, gold), "teacher": news_metrics(0.4, gold)},
        "mining": {"languages": ["deu"], "gold_pairs": bucc_gold,
                   "distractors_per_side": 5, "results": {"student": bucc}},
        "report_dir": "/tmp/report"}


@pytest.mark.parametrize("with_metric_counts", [True, False])
def test_a_headline_f1_states_its_gold_pairs_and_few_carry_a_caveat(with_metric_counts):
    """A tiny job's headline news F1 (1.50x the teacher's) came from 2 gold pairs,
    with no word of it. A report written before the metrics counted their gold
    takes the count from the news set."""
    figures = headline(tiny_report(news_gold=2, with_metric_counts=with_metric_counts))
    assert figures["news_mining_f1"] == {"student": 60.0, "teacher": 40.0}
    assert figures["news_mining_gold_pairs"] == 2
    assert "2 gold pairs" in figures["news_mining_caveat"]
    assert "under 100" in figures["news_mining_caveat"]
    many = headline(tiny_report(news_gold=400, with_metric_counts=with_metric_counts))
    assert many["news_mining_gold_pairs"] == 400 and "news_mining_caveat" not in many


def test_the_speed_basis_names_the_precision_each_model_ran_in():
    """The job evaluates the student's float32 export at the teacher's precision;
    the headline says so, and a report from before says float32."""
    report = tiny_report()
    report["teacher_precision"] = "bfloat16"
    report["tatoeba"]["student"]["precision"] = "bfloat16"
    assert ("the student's float32 export run in bfloat16, the teacher in bfloat16"
            in headline(report)["basis"])
    del report["tatoeba"]["student"]["precision"]
    assert "export run in float32, the teacher in bfloat16" in headline(report)["basis"]


def test_every_f1_in_the_summary_states_its_gold_pairs():
    summary = format_summary(tiny_report(news_gold=2, bucc_gold=3))
    news = [line for line in summary.splitlines() if line.startswith("news mining F1")]
    assert len(news) == 1 and "1.50x" in news[0]
    assert "over 2 gold pairs" in news[0] and "under 100" in news[0]
    bucc = [line for line in summary.splitlines() if line.startswith("BUCC-style")]
    assert len(bucc) == 1 and "over 3 gold pairs" in bucc[0] and "under 100" in bucc[0]
    summary = format_summary(tiny_report(news_gold=400, bucc_gold=3, with_metric_counts=False))
    news = [line for line in summary.splitlines() if line.startswith("news mining F1")][0]
    assert "over 400 gold pairs" in news and "under 100" not in news
    assert "over 3 gold pairs" in summary  # from the mining stage's own count


def test_the_summary_says_which_corpus_lines_were_skipped():
    sample = {"pairs": 40, "languages": 2, "lines": {
        "files": 2, "pairs": 40, "skipped_lines": 3,
        "skipped_by_kind": {"no_tab": 2, "not_utf8": 1},
        "files_with_skipped_lines": {"/data/parallel/x/fra-eng.tsv": {"no_tab": 2,
                                                                      "not_utf8": 1}}}}
    summary = format_summary(tiny_report(sample=sample))
    line = [row for row in summary.splitlines() if row.startswith("corpus:")]
    assert line == ["corpus: 40 pairs from 2 files; 3 lines skipped in 1 file: 2 with no tab, "
                    "1 not UTF-8 (fra-eng.tsv: 3)"]
    clean = dict(sample, lines=dict(sample["lines"], skipped_lines=0, skipped_by_kind={},
                                    files_with_skipped_lines={}))
    assert "corpus: 40 pairs from 2 files; no line skipped" in format_summary(
        tiny_report(sample=clean))


REPORT_KEYS = ["data_dir", "work_dir", "report_dir", "machine", "config", "teacher",
               "vocabulary", "sample", "teacher_vectors", "plan", "training", "export",
               "tatoeba", "news_set", "news", "precision", "teacher_precision", "distillation",
               "mining", "stage_seconds", "reused", "total_seconds", "headline"]


def test_the_report_is_built_from_each_stages_result_and_written_with_its_summary(tmp_path):
    """report.json's keys, in order; the teacher's results beside the students';
    the distillation's gain with a comparison; the files in the report folder."""
    tiny = tiny_report()
    trained = {"final_step": 4, "seconds": 60.0, "evaluations": [{"step": 4, "p_at_1": 0.4}],
               "plan": {"train_steps": 4, "planned": False}}
    results = {
        "teacher": {"teacher": "multilingual-e5-small", "multilingual": True},
        "vocabulary": {"output": "vocab.model"},
        "sample": {"pairs": 40, "languages": 2, "per_language": {"deu": 20, "fra": 20}},
        "news_set": tiny["news_set"],
        "teacher_evaluation": {"precision": "bfloat16", "tatoeba": tatoeba_metrics(0.6),
                               "news": {"teacher": news_metrics(0.4, 2)}},
        "teacher_vectors": {"backend": {"backend": "in_step", "model": "teacher"}},
        "train_student": trained, "train_student_ams_only": dict(trained, seconds=30.0),
        "export": tiny["export"],
        "evaluate": {"student": tatoeba_metrics(0.4), "student_ams_only": tatoeba_metrics(0.3)},
        "news": {"student": news_metrics(0.6, 2)}, "mine": tiny["mining"]}
    students = {"student": {"loss_weights": {"fd": 1.0}, "learning_rate": 1e-3,
                            "precision": "bfloat16"},
                "student_ams_only": {"loss_weights": {}, "learning_rate": 5e-4,
                                     "precision": "float32"}}
    config = RecipeConfig(work_dir=str(tmp_path / "work"), comparison_objective="ams")
    timing = {"stage_seconds": {"sample": 1.0}, "reused": [], "total_seconds": 60.0}
    report = build_report(config, tmp_path / "data", results, students, timing)
    assert list(report) == REPORT_KEYS
    assert report["report_dir"] == str(tmp_path / "work" / "report")
    assert set(report["tatoeba"]) == {"student", "student_ams_only", "teacher"}
    assert set(report["news"]) == {"student", "teacher"} and "per_language" not in report["sample"]
    assert report["teacher_vectors"] == {"counts": None, "sentences_per_second": None,
                                         "backend": {"backend": "in_step", "model": "teacher"}}
    assert report["precision"] == {"student": "bfloat16", "student_ams_only": "float32"}
    assert report["teacher_precision"] == "bfloat16"
    distillation = report["distillation"]
    assert distillation["gain_points"] == pytest.approx(10.0)
    assert distillation["learning_rates"] == {"full": 1e-3, "comparison": 5e-4}
    assert distillation["default_learning_rates"] and distillation["loss_weights"] == {"fd": 1.0}
    assert (distillation["minutes_full"], distillation["minutes_comparison"]) == (1.0, 0.5)
    alone = build_report(RecipeConfig(work_dir=str(tmp_path / "work")), tmp_path, results,
                         {"student": students["student"]}, timing)
    assert alone["distillation"] is None and set(alone["training"]) == {"student"}
    student = tmp_path / "work" / "student"
    student.mkdir(parents=True)
    (student / "train_log.jsonl").write_text('{"step": 4, "ams": 0.5}\n')
    (student / "eval_log.jsonl").write_text('{"step": 4, "tatoeba/average_p_at_1": 0.4}\n')
    write_report(report, {"student": str(student)})
    folder = tmp_path / "work" / "report"
    assert json.loads((folder / "report.json").read_text())["headline"] == report["headline"]
    assert (folder / "summary.md").read_text().startswith("# The main job\n\n```\n")
    assert "(+10.00 points)" in (folder / "summary.md").read_text()
    for plot in ("training_curve.png", "tatoeba_languages.png"):
        assert (folder / plot).stat().st_size > 100
