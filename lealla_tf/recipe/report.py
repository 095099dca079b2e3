"""The main job's report, built in one place: report.json from every stage's
result (`build_report`), its figures and files in <work_dir>/report
(`write_report`: report.json, summary.md and the plots), the one-screen
summary (`format_summary`) and the headline figures (`headline`)."""

import dataclasses
import json
import os

from lealla_tf.evaluation.bucc import (
    BUCC_AVERAGE_F1,
    BUCC_GOLD_PAIRS,
    FEW_GOLD_PAIRS,
    gold_pairs_note,
)
from lealla_tf.evaluation.news import NEWS_PRIMARY_METRIC, length_band_names
from lealla_tf.evaluation.plots import plot_per_language, plot_training
from lealla_tf.evaluation.tatoeba import (
    TATOEBA_MARGIN_METRIC,
    TATOEBA_PRIMARY_METRIC,
    best_and_worst,
    per_language,
)
from lealla_tf.machine import describe, machine
from lealla_tf.parallel_corpus import describe_corpus_counts
from lealla_tf.recipe.settings import (
    COMPARISON,
    STUDENT,
    STUDENT_ON_TEACHER_PAIRS,
    TEACHER,
    RecipeConfig,
)

# === Report ===

def build_report(config: RecipeConfig, data_dir, results: dict[str, dict],
                 students: dict[str, dict], timing: dict) -> dict:
    """report.json of a finished job: its flags and machine, each stage's result
    (`results`, by stage name: `lealla_tf.recipe.job.STAGES`), the students'
    (`students`: {name: {"loss_weights", "learning_rate" (as trained),
    "precision"}} of each student the job trains), the stages' times (`timing`:
    `Stages.summary()`) and the headline figures. The teacher's Tatoeba and
    news results join the students'; with a comparison, the distillation's gain."""
    training = {name: results[f"train_{name}"] for name in students}
    evaluation = results["teacher_evaluation"]
    tatoeba = {**results["evaluate"], TEACHER: evaluation["tatoeba"]}
    distillation = None
    if COMPARISON in training:
        full = tatoeba[STUDENT][TATOEBA_PRIMARY_METRIC]
        alone = tatoeba[COMPARISON][TATOEBA_PRIMARY_METRIC]
        distillation = {"objective": config.objective,
                        "loss_weights": students[STUDENT]["loss_weights"],
                        "comparison_objective": config.comparison_objective,
                        "learning_rates": {"full": students[STUDENT]["learning_rate"],
                                           "comparison": students[COMPARISON]["learning_rate"]},
                        "default_learning_rates": (
                            config.learning_rate == RecipeConfig.learning_rate
                            and config.comparison_learning_rate
                            == RecipeConfig.comparison_learning_rate
                            # the objective COMPARISON_LEARNING_RATE was measured for
                            and config.comparison_objective == "ams"),
                        "steps": training[STUDENT]["final_step"],
                        "comparison_steps": training[COMPARISON]["final_step"],
                        "full": full, "comparison": alone, "gain_points": 100 * (full - alone),
                        "minutes_full": training[STUDENT]["seconds"] / 60,
                        "minutes_comparison": training[COMPARISON]["seconds"] / 60,
                        "curve_full": training[STUDENT]["evaluations"],
                        "curve_comparison": training[COMPARISON]["evaluations"]}
    report = {"data_dir": str(data_dir), "work_dir": config.work_dir,
              "report_dir": os.path.join(config.work_dir, "report"),
              "machine": machine(),
              "config": dataclasses.asdict(config), "teacher": results["teacher"],
              "vocabulary": results["vocabulary"],
              "sample": {k: v for k, v in results["sample"].items() if k != "per_language"},
              "teacher_vectors": {k: results["teacher_vectors"].get(k) for k in (
                  "counts", "backend", "sentences_per_second")},
              "plan": training[STUDENT]["plan"], "training": training,
              "export": results["export"], "tatoeba": tatoeba,
              "news_set": results["news_set"], "news": {**results["news"], **evaluation["news"]},
              "precision": {name: student["precision"] for name, student in students.items()},
              "teacher_precision": evaluation.get("precision", "float32"),
              "distillation": distillation, "mining": results["mine"], **timing}
    report["headline"] = headline(report)
    return report


def write_report(report: dict, run_dirs: dict[str, str]) -> None:
    """<report_dir>: the training curves of the students (`run_dirs`: {name:
    model_dir}), Tatoeba dev per language (the student against the teacher, on
    the teacher's pairs), report.json and summary.md."""
    config, report_dir, tatoeba = report["config"], report["report_dir"], report["tatoeba"]
    os.makedirs(report_dir, exist_ok=True)
    objectives = {STUDENT: f"{config['objective']} (student)",
                  COMPARISON: f"{config['comparison_objective']} alone"}
    plot_training({objectives[name]: path for name, path in run_dirs.items()},
                  os.path.join(report_dir, "training_curve.png"), config["eval_max_pairs"])
    compared = {STUDENT: tatoeba.get(STUDENT_ON_TEACHER_PAIRS, tatoeba[STUDENT]),
                TEACHER: tatoeba[TEACHER]}
    subset = (f", first {config['teacher_eval_pairs']} pairs a language"
              if config["teacher_eval_pairs"] else ", all pairs")
    plot_per_language({name: per_language(metrics) for name, metrics in compared.items()},
                      os.path.join(report_dir, "tatoeba_languages.png"),
                      f"Tatoeba dev P@1 per language: student vs teacher{subset}")
    with open(os.path.join(report_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    with open(os.path.join(report_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write("# The main job\n\n```\n" + format_summary(report).strip("\n=") + "\n```\n")


def format_summary(report: dict) -> str:
    lines = ["", "=" * 78, "lealla_tf main job — summary", "=" * 78]
    stages = report["stage_seconds"]
    lines.append("wall time: " + ", ".join(f"{k} {v / 60:.1f}" for k, v in stages.items())
                 + f" (min); total {report['total_seconds'] / 60:.1f} min"
                 + (f" (reused: {', '.join(report['reused'])})" if report["reused"] else ""))
    if report.get("machine"):
        lines.append(f"machine: {describe(report['machine'])}")
    plan = report.get("plan") or {}
    if plan.get("planned"):
        lines.append(f"plan: {plan['train_steps']} steps a student to fit "
                     f"{plan['budget_seconds'] / 60:.0f} min on this machine (the student's "
                     f"step {plan['seconds_per_step']:.2f} s, {plan['pairs_per_second']:.0f}"
                     " pairs/s)" + (": SHORT, this machine is slow for the budget"
                                    if plan["short"] else ""))
    trained = (report.get("training") or {}).get(STUDENT)
    if trained:
        replanned = (f", re-planned at step {plan['replanned_at_step']} from "
                     f"{plan['planned_train_steps']}" if plan.get("replanned_at_step") else "")
        lines.append(f"student trained: {trained['final_step']} steps of "
                     f"{report['config']['global_batch_size']} pairs in "
                     f"{trained['seconds'] / 60:.1f} min{replanned}")
    corpus = (report.get("sample") or {}).get("lines")
    if corpus:  # what the reader skipped in the corpus, per kind and file
        lines.append(describe_corpus_counts(corpus))
    tatoeba = report["tatoeba"]
    for name in (STUDENT, COMPARISON, STUDENT_ON_TEACHER_PAIRS, TEACHER):
        if name in tatoeba:
            m = tatoeba[name]
            pairs = f"first {m['max_pairs']} pairs" if m.get("max_pairs") else "all pairs"
            lines.append(f"Tatoeba dev P@1 {name:<17} {100 * m[TATOEBA_PRIMARY_METRIC]:6.2f}%"
                         f"   ({pairs}; margin-based {100 * m[TATOEBA_MARGIN_METRIC]:.2f}%, "
                         f"{m['sentences_per_second']:.0f} sentences/s)")
    for name in (STUDENT, TEACHER):
        if name in tatoeba:
            values = per_language(tatoeba[name])
            best, worst = best_and_worst(values)
            lines.append(f"{name} best 10:  " + ", ".join(
                f"{code} {100 * values[code]:.1f}" for code in best))
            lines.append(f"{name} worst 10: " + ", ".join(
                f"{code} {100 * values[code]:.1f}" for code in worst))
    comparison = report["distillation"]
    if comparison:
        rates = comparison.get("learning_rates") or {}
        each = ""
        if rates.get("full") is not None and rates.get("comparison") is not None:
            each = f", peak rates {rates['full']:g} / {rates['comparison']:g}" + (
                ", each its objective's best" if comparison.get("default_learning_rates")
                else "")
        lines.append(f"distillation ({comparison['steps']} steps each, same data{each}): "
                     f"{comparison['comparison_objective']} alone "
                     f"{100 * comparison['comparison']:.2f}% vs {comparison['objective']} "
                     f"{100 * comparison['full']:.2f}% ({comparison['gain_points']:+.2f} points)")
    else:
        lines.append("distillation against AMS alone: not run here (--comparison_objective=ams "
                     "runs it in the job; benchmarks/recipe_sweep.py measures it at equal "
                     "steps, docs/benchmarks.md)")
    pairs = report["config"].get("eval_max_pairs")
    for name, run in report["training"].items():
        curve = " ".join(f"{e['step']}:{100 * e['p_at_1']:.1f}" for e in run["evaluations"])
        if curve:
            lines.append(f"dev P@1 along training, {name} (step:P@1, "
                         f"{f'first {pairs} pairs' if pairs else 'all pairs'} a language): "
                         f"{curve}")
    if report.get("precision"):
        lines.append("training precision: " + ", ".join(
            f"{name} {precision}" for name, precision in report["precision"].items())
            + " (the export is stored in float32 and evaluated in "
            + report["tatoeba"].get(STUDENT, {}).get("precision", "float32")
            + f", the teacher in {report.get('teacher_precision', 'float32')})")
    export = report["export"]
    if export.get("collapse_warning"):
        lines.append(export["collapse_warning"])
    lines.append(f"model: {export['parameters']:,} parameters, {export['embedding_dim']}-d, "
                 f"SavedModel {export['bytes']['model'] / 1e6:.1f} MB, hub.KerasLayer reload "
                 f"max |diff| {export['reload_max_abs_difference']:.1e}")
    news = report.get("news") or {}
    if STUDENT in news and TEACHER in news:
        student, teacher = news[STUDENT], news[TEACHER]
        languages = report["news_set"]["languages"]
        gold = news_gold_pairs(report)
        lines.append(f"news mining F1 (held-out NTREX, {len(languages)} languages): student "
                     f"{100 * student[NEWS_PRIMARY_METRIC]:.1f}, teacher "
                     f"{100 * teacher[NEWS_PRIMARY_METRIC]:.1f} "
                     f"({student[NEWS_PRIMARY_METRIC] / teacher[NEWS_PRIMARY_METRIC]:.2f}x)"
                     + (f", {gold_pairs_note(gold)}" if gold is not None else ""))
        bands = [(band, student[f"news_length/{band}/p_at_1"],
                  teacher[f"news_length/{band}/p_at_1"]) for band in length_band_names()]
        lines.append("news P@1 by tokens, student/teacher: " + ", ".join(
            f"{band} {100 * a:.1f}/{100 * b:.1f}" for band, a, b in bands if a is not None))
    mining = report.get("mining")
    if mining and mining["languages"]:
        for name, result in mining["results"].items():
            gold = result.get(BUCC_GOLD_PAIRS, mining["gold_pairs"] * len(mining["languages"]))
            lines.append(f"BUCC-style mining F1 {name:<10} " + ", ".join(
                f"{code} {100 * result[f'bucc/{code}/f1']:.1f}" for code in mining["languages"])
                + f"; average {100 * result[BUCC_AVERAGE_F1]:.1f} ({gold_pairs_note(gold)})")
    lines.append(f"report: {report['report_dir']}")
    lines.append("=" * 78)
    return "\n".join(lines)



def headline(report: dict) -> dict:
    """The report's figures a person quotes, in percent, each on its basis."""

    tatoeba = report["tatoeba"]
    figures = {"tatoeba_dev_all_pairs_p_at_1": {
        name: round(100 * tatoeba[name][TATOEBA_PRIMARY_METRIC], 2)
        for name in (STUDENT, COMPARISON, TEACHER)
        if name in tatoeba and not tatoeba[name].get("max_pairs")}}
    news = report.get("news") or {}
    if news:
        figures["news_mining_f1"] = {name: round(100 * m[NEWS_PRIMARY_METRIC], 2)
                                     for name, m in news.items()}
        gold = news_gold_pairs(report)
        if gold is not None:  # the test halves' gold pairs behind every model's F1
            figures["news_mining_gold_pairs"] = gold
            if gold < FEW_GOLD_PAIRS:
                figures["news_mining_caveat"] = (
                    f"the news mining F1 rests on {gold:,} gold pair{'' if gold == 1 else 's'}, "
                    f"under {FEW_GOLD_PAIRS}: one pair moves it by about "
                    f"{100 / max(gold, 1):.0f} points, so neither it nor its ratio to the "
                    "teacher's says much")
        figures["news_length_p_at_1"] = {name: round(100 * m["news_length/average_p_at_1"], 2)
                                         for name, m in news.items()}
    speed = {}
    if all(name in tatoeba and tatoeba[name].get("sentences_per_second")
           for name in (STUDENT, TEACHER)) and not tatoeba[TEACHER].get("max_pairs"):
        speed["tatoeba_dev"] = round(tatoeba[STUDENT]["sentences_per_second"]
                                     / tatoeba[TEACHER]["sentences_per_second"], 2)
    if all(news.get(name, {}).get("news/seconds") for name in (STUDENT, TEACHER)):
        speed["news"] = round(news[TEACHER]["news/seconds"] / news[STUDENT]["news/seconds"], 2)
    if speed:
        figures["speed_student_over_teacher"] = speed
    figures["basis"] = ("Tatoeba: all pairs of every tatoeba_dev language, each model; news: "
                        "the held-out NTREX set, every model on the same pairs (mining F1 over "
                        "news_mining_gold_pairs gold pairs); speed: sentences a second, "
                        "student over teacher, on the same sentences (the student's float32 "
                        f"export run in {tatoeba[STUDENT].get('precision', 'float32')}, the "
                        f"teacher in {report.get('teacher_precision', 'float32')})")
    return figures


def news_gold_pairs(report: dict):
    """The gold pairs behind the news mining F1 (every language's test half): from
    the metrics, or, in a report made before they counted it, the news set's
    summary; None when neither says."""
    for metrics in (report.get("news") or {}).values():
        if metrics.get("news/gold_pairs") is not None:
            return metrics["news/gold_pairs"]
    gold = (report.get("news_set") or {}).get("gold")
    return sum(split["test"] for split in gold.values()) if gold else None
