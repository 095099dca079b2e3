"""The main job's stages after training: the export, reloaded in a fresh
process and compared with the in-memory student (`export_stage`), and the
evaluations, each of every model it is given: Tatoeba dev (`evaluate_stage`),
the held-out news set (`news_stage`) and BUCC-style mining on pairs the sample
left out (`mine_stage`)."""

import os
import pathlib
import shutil
import time

import numpy as np
import tensorflow as tf

from lealla_tf.evaluation.bucc import (
    BUCC_AVERAGE_F1,
    build_bucc_like_split,
    evaluate_bucc,
    read_bucc_split,
    write_bucc_split,
)
from lealla_tf.evaluation.news import NEWS_PRIMARY_METRIC, evaluate_news
from lealla_tf.evaluation.retrieval import embed_sentences
from lealla_tf.evaluation.tatoeba import (
    TATOEBA_MARGIN_METRIC,
    TATOEBA_PRIMARY_METRIC,
    embed_tatoeba,
    first_pairs,
    tatoeba_metrics_with_margin,
)
from lealla_tf.inference.formats import export_model_dir
from lealla_tf.inference.reload_check import reload_in_fresh_process
from lealla_tf.mining.margins import mine
from lealla_tf.models.model_dir import load_encoder, load_tokenizer
from lealla_tf.parallel_corpus import find_parallel_files, read_pairs, read_tatoeba
from lealla_tf.recipe.settings import STUDENT, RecipeConfig
from lealla_tf.recipe.stages import Models
from lealla_tf.tokenizers.tokenizer import Tokenizer


def check_sentences(tatoeba_dir: str) -> list[str]:
    """The sentences the export is checked on: the first of a few Tatoeba dev
    languages of different scripts (those present), or two fixed sentences."""
    sentences = []
    for language in ("deu", "rus", "cmn", "kab", "fra"):
        try:
            source, english = read_tatoeba(tatoeba_dir, language)
            sentences += source[:20] + english[:4]
        except FileNotFoundError:
            continue
    return sentences or ["The dog is nice.", "Der Hund ist nett."]


def export_stage(model_dir: str, export_path: str, sentences, models: Models) -> dict:
    """Exports the LEALLA format, reloads it with hub.KerasLayer in a fresh process,
    and compares with the in-memory encoder (restored once, for both)."""
    if os.path.exists(export_path):
        shutil.rmtree(export_path)
    encoder, tokenizer = load_encoder(model_dir), load_tokenizer(model_dir)
    summary = export_model_dir(model_dir, export_path, "lealla", encoder=encoder,
                               tokenizer=tokenizer)
    reloaded = reload_in_fresh_process(export_path, sentences, "hub_keras_layer",
                                       only_batch=True)["batch"]
    expected = encoder(tokenizer(tf.constant(sentences)))["sentence_embedding"].numpy()
    summary["reload_max_abs_difference"] = float(np.abs(reloaded - expected).max())
    summary["reload_sentences"] = len(sentences)
    if summary.get("collapse_warning"):
        print(summary["collapse_warning"])
    print(f"exported {summary['bytes']['model'] / 1e6:.1f} MB; hub.KerasLayer reload in a fresh "
          f"process matches the in-memory model to {summary['reload_max_abs_difference']:.1e} "
          f"on {len(sentences)} sentences")
    return summary


def evaluate_stage(models: dict[str, tuple[str, int]], tatoeba_dir: str,
                   loaded: Models) -> dict:
    """Tatoeba dev evaluation of each {name: (model, max pairs a language, 0: all)};
    also sentences/s. A model evaluated on all pairs is embedded once: its entries
    on the first pairs are cut from that pass (with its sentences/s)."""
    passes = {}  # model -> (all pairs embedded, seconds, sentences/s)
    order = sorted(models, key=lambda n: models[n][1] != 0)  # all-pairs passes first
    results = {}
    for name in order:
        path, max_pairs = models[name]
        if max_pairs and path in passes:
            embedded, seconds, speed = passes[path]
            metrics = tatoeba_metrics_with_margin(first_pairs(embedded, max_pairs), seconds)
            metrics["tatoeba/sentences_per_second"] = speed  # the pass's, not the slice's
        else:
            start = time.time()
            embedded = embed_tatoeba(loaded.get(path), tatoeba_dir, max_pairs=max_pairs or None,
                                     progress=True)
            seconds = time.time() - start
            metrics = tatoeba_metrics_with_margin(embedded, seconds)
            if not max_pairs:
                passes[path] = embedded, seconds, metrics["tatoeba/sentences_per_second"]
        metrics["sentences_per_second"] = metrics["tatoeba/sentences_per_second"]
        metrics["max_pairs"] = max_pairs
        results[name] = metrics
        print(f"{name}: Tatoeba P@1 {100 * metrics[TATOEBA_PRIMARY_METRIC]:.2f} "
              f"(margin {100 * metrics[TATOEBA_MARGIN_METRIC]:.2f}), "
              f"{metrics['sentences_per_second']:.0f} sentences/s")
    return {name: results[name] for name in models}


def news_stage(models: dict[str, str], news_dir: str, languages, vocab_file: str,
               loaded: Models) -> dict:
    """The news evaluations (`lealla_tf.evaluation.news.evaluate_news`) of each
    {name: model}, length bands counted with the students' tokenizer."""
    tokenizer = Tokenizer(vocab_file)

    def count_tokens(sentences):
        return tokenizer.tokenize(sentences).row_lengths().numpy() + 2  # [CLS], [SEP]

    results = {}
    for name, path in models.items():
        if not languages:
            continue
        start = time.time()
        results[name] = evaluate_news(loaded.get(path), news_dir, languages, count_tokens)
        results[name]["news/seconds"] = time.time() - start
        print(f"{name}: news mining F1 {100 * results[name][NEWS_PRIMARY_METRIC]:.1f}, P@1 "
              f"{100 * results[name]['news_length/average_p_at_1']:.1f} "
              f"({time.time() - start:.0f} s)")
    return results


def mine_stage(config: RecipeConfig, data_dir, sample_dir: str, bucc_dir: str,
               models: dict[str, str], report_dir: str, loaded: Models) -> dict:
    """BUCC-style evaluation on pairs NOT in the training sample."""
    used = set()
    for path in pathlib.Path(sample_dir).glob("*.tsv.gz"):
        used.update(read_pairs(str(path)))
    files = find_parallel_files([str(data_dir / "parallel")])
    available = []
    for language in config.bucc_languages:
        in_data = [p for f in files if f.language == language for p in read_pairs(f.path)]
        if not in_data:
            print(f"skipping {language}: no {language}-eng pairs in {data_dir / 'parallel'}")
            continue
        pairs = [p for p in in_data if p not in used]
        try:
            for split, split_seed in (("training", config.seed), ("test", config.seed + 1)):
                rows = build_bucc_like_split(pairs, config.bucc_gold, config.bucc_distractors,
                                             split_seed)
                write_bucc_split(bucc_dir, language, split, *rows)
            available.append(language)
        except ValueError as error:
            print(f"skipping {language}: {error}")
    results = {}
    for name, path in models.items():
        if not available:
            break
        results[name] = evaluate_bucc(loaded.get(path), bucc_dir, available)
        print(f"{name}: " + ", ".join(
            f"{lang} F1 {100 * results[name][f'bucc/{lang}/f1']:.1f}" for lang in available)
            + f"; average {100 * results[name][BUCC_AVERAGE_F1]:.1f}")
    # A file a person can read: the student's best mined pairs of the first language.
    if available:
        student = loaded.get(models[STUDENT])
        source, english, gold = read_bucc_split(bucc_dir, available[0], "test")
        mined = mine(embed_sentences(student, [t for _, t in source]),
                     embed_sentences(student, [t for _, t in english]))
        with open(os.path.join(report_dir, "mined_examples.tsv"), "w", encoding="utf-8") as f:
            f.write("score\tgold\tsource\tenglish\n")
            for score, i, j in list(zip(mined["score"], mined["source"], mined["target"]))[:100]:
                is_gold = (source[i][0], english[j][0]) in gold
                f.write(f"{score:.4f}\t{int(is_gold)}\t{source[i][1]}\t{english[j][1]}\n")
    return {"languages": available, "gold_pairs": config.bucc_gold,
            "distractors_per_side": config.bucc_distractors, "results": results}
