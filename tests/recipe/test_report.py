"""The main job's report: every F1 states the gold pairs behind it, the corpus
lines the reader skipped are in the summary."""

import pytest

from lealla_tf.recipe.report import format_summary, headline


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
