"""Tatoeba P@1, the LASER / LaBSE protocol: each sentence retrieves its translation
among the other side's sentences of its language, by cosine (`evaluate_tatoeba`)
or by margin (`evaluate_tatoeba_margin`), both from one embedding pass
(`tatoeba_with_margin`); and the tables reports print of them. Both score a
block of rows at a time (`lealla_tf.evaluation.retrieval.row_blocks`): memory
stays bounded whatever the number of a language's pairs, and the results are
the whole similarity matrix's, ties broken alike.

Evaluators return flat, name-prefixed metric dicts with a declared primary
metric: `tatoeba/average_p_at_1`.
"""

import time
from collections.abc import Callable

import numpy as np

from lealla_tf.evaluation.retrieval import (
    embed_sentences,
    merge_column_argmax,
    merge_column_top,
    row_blocks,
)
from lealla_tf.inference.batching import PIPELINE_BATCH_SIZE
from lealla_tf.inference.collapse import mean_cosine
from lealla_tf.mining.margins import margin_scores
from lealla_tf.parallel_corpus import find_tatoeba_languages, read_tatoeba

# The metric names, spelled here and nowhere else.
TATOEBA_PRIMARY_METRIC = "tatoeba/average_p_at_1"
TATOEBA_MARGIN_METRIC = "tatoeba_margin/average_p_at_1"
TATOEBA_SENTENCES = "tatoeba/sentences"
TATOEBA_MEAN_COSINE = "tatoeba/mean_cosine"  # between different English sentences


def _unit_rows(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def nearest_candidates(queries: np.ndarray, candidates: np.ndarray,
                       block_rows: int | None = None) -> np.ndarray:
    """Each query row's nearest candidate by cosine (the first of ties, as
    np.argmax gives it), scored a block of query rows at a time (`row_blocks`)
    so that no matrix of every query and candidate is held."""
    queries, candidates = _unit_rows(queries), _unit_rows(candidates)
    nearest = [np.argmax(queries[rows] @ candidates.T, axis=1)
               for rows in row_blocks(len(queries), len(candidates), block_rows)]
    return np.concatenate(nearest) if nearest else np.zeros(0, np.intp)


def nearest_neighbor_accuracy(queries: np.ndarray, candidates: np.ndarray,
                              block_rows: int | None = None) -> float:
    """Fraction of rows i whose nearest candidate by cosine is candidate i."""
    return _fraction_on_the_diagonal(nearest_candidates(queries, candidates, block_rows))


def _fraction_on_the_diagonal(nearest: np.ndarray) -> float:
    return float(np.mean(nearest == np.arange(len(nearest))))


def tatoeba_accuracy(source: np.ndarray, english: np.ndarray,
                     block_rows: int | None = None) -> dict[str, float]:
    """P@1 of the LASER / LaBSE Tatoeba protocol for one language.

    Row i of `source` translates row i of `english`. Each sentence retrieves its
    nearest neighbour by cosine among the other side's sentences of this
    language, in both directions; the score is the mean of the two P@1.
    Scored in blocks of rows (`nearest_candidates`): memory stays bounded
    whatever the number of pairs.
    """
    if len(source) != len(english):
        raise ValueError(f"{len(source)} source rows but {len(english)} English rows")
    forward = nearest_neighbor_accuracy(source, english, block_rows)
    backward = nearest_neighbor_accuracy(english, source, block_rows)
    return {"xx_to_en": forward, "en_to_xx": backward, "p_at_1": (forward + backward) / 2}


class EmbeddedTatoeba(dict):
    """`embed_tatoeba`'s {language: (source embeddings, English embeddings)}, and
    `distinct_sentences`: how many different texts its pass embedded."""

    distinct_sentences: int = 0


def embed_tatoeba(embed: Callable, tatoeba_dir: str, languages: list[str] | None = None,
                  max_pairs: int | None = None, batch_size: int = PIPELINE_BATCH_SIZE,
                  progress: bool = False) -> EmbeddedTatoeba:
    """Embeds every Tatoeba language in one length-sorted pass, each different text
    once: English sides repeat across languages (and some sentences within one),
    and a model gives a text the same vector wherever it occurs.

    Returns {language: (source embeddings, English embeddings)}.
    """
    languages = languages or find_tatoeba_languages(tatoeba_dir)
    texts, spans = [], {}
    for language in languages:
        source, english = read_tatoeba(tatoeba_dir, language)
        if max_pairs is not None and max_pairs < 0:
            raise ValueError(f"max_pairs must be >= 0 (0 or None: all), got {max_pairs}")
        if max_pairs:
            source, english = source[:max_pairs], english[:max_pairs]
        if not source:
            raise ValueError(f"Tatoeba {language}: tatoeba.{language}-eng.{language} and "
                             f"tatoeba.{language}-eng.eng in {tatoeba_dir} hold no sentences")
        spans[language] = (len(texts), len(source))
        texts += source + english
    rows = {}  # text -> its row among the distinct texts
    at = np.array([rows.setdefault(text, len(rows)) for text in texts])
    embeddings = embed_sentences(embed, list(rows), batch_size=batch_size, progress=progress,
                                 description="tatoeba")[at]
    embedded = EmbeddedTatoeba({language: (embeddings[start:start + count],
                                           embeddings[start + count:start + 2 * count])
                                for language, (start, count) in spans.items()})
    embedded.distinct_sentences = len(rows)
    return embedded


def tatoeba_metrics(embedded) -> dict[str, float]:
    """Flat Tatoeba metrics of `embed_tatoeba`'s output: `tatoeba/<lang>/p_at_1`,
    `.../xx_to_en`, `.../en_to_xx`, `.../pairs`, `tatoeba/average_p_at_1`,
    `tatoeba/languages`, `tatoeba/sentences` (both sides)."""
    metrics = {}
    for language, (source, english) in embedded.items():
        for name, value in tatoeba_accuracy(source, english).items():
            metrics[f"tatoeba/{language}/{name}"] = value
        metrics[f"tatoeba/{language}/pairs"] = len(source)
    metrics[TATOEBA_PRIMARY_METRIC] = float(np.mean(
        [metrics[f"tatoeba/{lang}/p_at_1"] for lang in embedded]))
    metrics["tatoeba/languages"] = len(embedded)
    metrics[TATOEBA_SENTENCES] = 2 * sum(len(source) for source, _ in embedded.values())
    # How far apart different sentences are (near 1: a collapsed model).
    english = np.concatenate([english for _, english in embedded.values()])
    metrics[TATOEBA_MEAN_COSINE] = mean_cosine(
        english[::max(1, len(english) // 2000)])
    return metrics


def evaluate_tatoeba(embed: Callable, tatoeba_dir: str, languages: list[str] | None = None,
                     max_pairs: int | None = None, batch_size: int = PIPELINE_BATCH_SIZE,
                     progress: bool = False) -> dict[str, float]:
    """Tatoeba P@1 per language and averaged (the primary metric).

    Args:
        embed: strings -> embeddings.
        tatoeba_dir: LASER `data/tatoeba/v1` layout.
        languages: subset (default all found).
        max_pairs: first pairs per language only (a quicker dev signal; with
            fewer candidates P@1 is higher than with the full set).

    Returns:
        Flat dict (see `tatoeba_metrics`).
    """
    return tatoeba_metrics(embed_tatoeba(embed, tatoeba_dir, languages, max_pairs, batch_size,
                                         progress))


def per_language(metrics: dict[str, float], name: str = "p_at_1") -> dict[str, float]:
    """{language: value} of one per-language Tatoeba metric."""
    result = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "tatoeba" and parts[2] == name:
            result[parts[1]] = value
    return result


# === Tatoeba with margin scoring ===

def tatoeba_margin_accuracy(source: np.ndarray, english: np.ndarray, k: int = 4,
                            margin: str = "ratio",
                            block_rows: int | None = None) -> dict[str, float]:
    """Tatoeba P@1 where candidates are ranked by margin (Artetxe & Schwenk
    2019) instead of raw cosine: hubs that are close to everything lose.
    Scored in blocks of rows (`margin_nearest`)."""
    forward, backward = margin_nearest(source, english, k, margin, block_rows)
    forward, backward = _fraction_on_the_diagonal(forward), _fraction_on_the_diagonal(backward)
    return {"xx_to_en": forward, "en_to_xx": backward, "p_at_1": (forward + backward) / 2}


def neighbourhood_averages(source: np.ndarray, english: np.ndarray, k: int = 4,
                           block_rows: int | None = None):
    """(each source row's, each English row's) mean cosine to its `k` nearest on
    the other side, from blocks of source rows (`row_blocks`): the English
    side's k nearest are merged block by block (`merge_column_top`), in the
    order a sort of the whole matrix gives them, so the means are the same to
    the bit."""
    return _averages(_unit_rows(source), _unit_rows(english), k, block_rows)


def _averages(source, english, k, block_rows):
    k = min(k, len(english))
    source_averages, english_top = [], None
    for rows in row_blocks(len(source), len(english), block_rows):
        similarities = source[rows] @ english.T
        source_averages.append(-np.sort(-similarities, axis=1)[:, :k].mean(axis=1))
        english_top = merge_column_top(english_top, similarities, k)
    # Transposed, the top values are laid out as the whole matrix's sorted
    # columns were, so that the means add them in the same order.
    return np.concatenate(source_averages), english_top.T.mean(axis=1)


def margin_nearest(source: np.ndarray, english: np.ndarray, k: int = 4, margin: str = "ratio",
                   block_rows: int | None = None):
    """(each source row's, each English row's) nearest on the other side by
    `margin` (the first of ties, as np.argmax gives it), in two passes over
    blocks of source rows: the neighbourhood averages, then the scores, each
    block's similarities computed again rather than held."""
    source, english = _unit_rows(source), _unit_rows(english)
    source_average, english_average = _averages(source, english, k, block_rows)
    forward, backward = [], None
    for rows in row_blocks(len(source), len(english), block_rows):
        scores = margin_scores(source[rows] @ english.T, source_average[rows, None],
                               english_average[None, :], margin)
        forward.append(np.argmax(scores, axis=1))
        backward = merge_column_argmax(backward, scores, rows.start)
    return np.concatenate(forward), backward[1]


def evaluate_tatoeba_margin(source_by_language: dict[str, np.ndarray],
                            english_by_language: dict[str, np.ndarray],
                            margin: str = "ratio", k: int = 4) -> dict[str, float]:
    """Margin-based Tatoeba over precomputed embeddings, flat metrics under
    `tatoeba_margin/...` with `tatoeba_margin/average_p_at_1`."""
    metrics = {}
    for language in sorted(source_by_language):
        scores = tatoeba_margin_accuracy(source_by_language[language],
                                         english_by_language[language], k, margin)
        for name, value in scores.items():
            metrics[f"tatoeba_margin/{language}/{name}"] = value
    values = [metrics[f"tatoeba_margin/{lang}/p_at_1"] for lang in source_by_language]
    metrics[TATOEBA_MARGIN_METRIC] = float(np.mean(values))
    return metrics


# === Tatoeba in one pass, as reports use it ===

def tatoeba_with_margin(embed: Callable, tatoeba_dir: str, max_pairs: int | None = None,
                        progress: bool = True,
                        batch_size: int = PIPELINE_BATCH_SIZE) -> dict[str, float]:
    """Cosine and margin Tatoeba metrics from ONE embedding pass, plus the
    sentence count and sentences/s of that pass."""
    start = time.time()
    embedded = embed_tatoeba(embed, tatoeba_dir, max_pairs=max_pairs, batch_size=batch_size,
                             progress=progress)
    return tatoeba_metrics_with_margin(embedded, time.time() - start)


def first_pairs(embedded, count: int):
    """`embed_tatoeba`'s output cut to the first `count` pairs of each language: the
    metrics of `max_pairs=count` without embedding those sentences again."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    return {language: (source[:count], english[:count])
            for language, (source, english) in embedded.items()}


def tatoeba_metrics_with_margin(embedded, seconds: float) -> dict[str, float]:
    """Cosine and margin metrics of `embed_tatoeba`'s output, with the sentence
    count and the sentences/s of the pass that took `seconds` (the different
    texts it embedded; every sentence for a cut of a pass, `first_pairs`)."""
    metrics = tatoeba_metrics(embedded)
    embedded_texts = getattr(embedded, "distinct_sentences", 0) or metrics[TATOEBA_SENTENCES]
    metrics["tatoeba/sentences_per_second"] = embedded_texts / max(seconds, 1e-9)
    metrics.update(evaluate_tatoeba_margin(
        {language: source for language, (source, _) in embedded.items()},
        {language: english for language, (_, english) in embedded.items()}))
    return metrics


def format_tatoeba_table(metrics: dict) -> str:
    """Per-language Tatoeba table (P@1 in %, both directions and margin)."""
    p_at_1 = per_language(metrics)
    lines = [f"{'language':<9}{'pairs':>7}{'xx->en':>9}{'en->xx':>9}{'P@1':>8}{'margin':>9}"]
    for language in sorted(p_at_1):
        lines.append(
            f"{language:<9}{int(metrics.get(f'tatoeba/{language}/pairs', 0)):>7}"
            f"{100 * metrics[f'tatoeba/{language}/xx_to_en']:>9.1f}"
            f"{100 * metrics[f'tatoeba/{language}/en_to_xx']:>9.1f}"
            f"{100 * p_at_1[language]:>8.1f}"
            f"{100 * metrics.get(f'tatoeba_margin/{language}/p_at_1', float('nan')):>9.1f}")
    lines.append(f"{'average':<9}{'':>7}{'':>9}{'':>9}{100 * metrics[TATOEBA_PRIMARY_METRIC]:>8.2f}"
                 f"{100 * metrics.get(TATOEBA_MARGIN_METRIC, float('nan')):>9.2f}")
    return "\n".join(lines)


def best_and_worst(values: dict[str, float], count: int = 10):
    """(best `count`, worst `count`) languages of {language: value}, best first."""
    ranked = sorted(values, key=lambda language: (-values[language], language))
    return ranked[:count], ranked[-count:]
