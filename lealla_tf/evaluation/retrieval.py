"""Evaluations of the paper: Tatoeba P@1 (and, see below, BUCC and UN-style retrieval).

Evaluators return flat, name-prefixed metric dicts with a declared primary
metric: `tatoeba/average_p_at_1` for Tatoeba.
"""

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from lealla_tf.inference.embedder import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS
from lealla_tf.mining.margins import mean_cosine
from lealla_tf.parallel_corpus import find_tatoeba_languages, read_tatoeba

# The metric names, spelled here and nowhere else.
TATOEBA_PRIMARY_METRIC = "tatoeba/average_p_at_1"
TATOEBA_MARGIN_METRIC = "tatoeba_margin/average_p_at_1"
TATOEBA_SENTENCES = "tatoeba/sentences"
TATOEBA_MEAN_COSINE = "tatoeba/mean_cosine"  # between different English sentences
BUCC_AVERAGE_F1 = "bucc/average_f1"
BUCC_GOLD_PAIRS = "bucc/gold_pairs"  # the test gold pairs behind the average F1
UN_AVERAGE_P_AT_1 = "un/average_p_at_1"


def embed_sentences(embed: Callable, sentences: Sequence, batch_size: int = PIPELINE_BATCH_SIZE,
                    progress: bool = False, description: str = "embedding",
                    max_tokens: Optional[int] = PIPELINE_MAX_TOKENS) -> np.ndarray:
    """Embeds `sentences` in batches of similar length; rows in input order.

    Sorting by length before batching means little padding (each batch is
    padded to its longest sentence), which on CPU is most of the cost.

    Args:
        embed: an `Embedder` (its `encode` sorts by token length), or any
            callable taking a tf.string tensor `[b]` to `[b, d]` embeddings.
        sentences: str or bytes. No sentences give `[0, d]` from an
            `Embedder`; from a plain callable, whose width is unknown until it
            runs, they raise ValueError.
        batch_size: sentences per call (at most).
        max_tokens: padded tokens per call (at most; `Embedder`s only, which
            know token lengths; a plain callable, whose sentences may be long,
            gets at most `PLAIN_BATCH_SIZE` sentences per call instead).
    """
    from lealla_tf.inference.embedder import Embedder, encode_in_length_order

    if isinstance(embed, Embedder):
        return embed.encode(sentences, batch_size, progress, description, max_tokens)
    import tensorflow as tf

    embeddings, _ = encode_in_length_order(lambda batch: embed(tf.constant(batch)), sentences,
                                           batch_size, show_progress_bar=progress,
                                           description=description, max_tokens=max_tokens)
    return embeddings


def _unit_rows(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def nearest_neighbor_accuracy(queries: np.ndarray, candidates: np.ndarray) -> float:
    """Fraction of rows i whose nearest candidate by cosine is candidate i."""
    similarities = _unit_rows(queries) @ _unit_rows(candidates).T
    return float(np.mean(np.argmax(similarities, axis=1) == np.arange(len(queries))))


def tatoeba_accuracy(source: np.ndarray, english: np.ndarray) -> Dict[str, float]:
    """P@1 of the LASER / LaBSE Tatoeba protocol for one language.

    Row i of `source` translates row i of `english`. Each sentence retrieves its
    nearest neighbour by cosine among the other side's sentences of this
    language, in both directions; the score is the mean of the two P@1.
    """
    if len(source) != len(english):
        raise ValueError(f"{len(source)} source rows but {len(english)} English rows")
    forward = nearest_neighbor_accuracy(source, english)
    backward = nearest_neighbor_accuracy(english, source)
    return {"xx_to_en": forward, "en_to_xx": backward, "p_at_1": (forward + backward) / 2}


def embed_tatoeba(embed: Callable, tatoeba_dir: str, languages: Optional[List[str]] = None,
                  max_pairs: Optional[int] = None, batch_size: int = PIPELINE_BATCH_SIZE,
                  progress: bool = False):
    """Embeds every Tatoeba language in one length-sorted pass.

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
    embeddings = embed_sentences(embed, texts, batch_size=batch_size, progress=progress,
                                 description="tatoeba")
    return {language: (embeddings[start:start + count],
                       embeddings[start + count:start + 2 * count])
            for language, (start, count) in spans.items()}


def tatoeba_metrics(embedded) -> Dict[str, float]:
    """Flat Tatoeba metrics of `embed_tatoeba`'s output: `tatoeba/<lang>/p_at_1`,
    `.../xx_to_en`, `.../en_to_xx`, `.../pairs`, `tatoeba/average_p_at_1`,
    `tatoeba/languages`."""
    metrics = {}
    for language, (source, english) in embedded.items():
        for name, value in tatoeba_accuracy(source, english).items():
            metrics[f"tatoeba/{language}/{name}"] = value
        metrics[f"tatoeba/{language}/pairs"] = len(source)
    metrics[TATOEBA_PRIMARY_METRIC] = float(np.mean(
        [metrics[f"tatoeba/{lang}/p_at_1"] for lang in embedded]))
    metrics["tatoeba/languages"] = len(embedded)
    # How far apart different sentences are (near 1: a collapsed model).
    english = np.concatenate([english for _, english in embedded.values()])
    metrics[TATOEBA_MEAN_COSINE] = mean_cosine(
        english[::max(1, len(english) // 2000)])
    return metrics


def evaluate_tatoeba(embed: Callable, tatoeba_dir: str, languages: Optional[List[str]] = None,
                     max_pairs: Optional[int] = None, batch_size: int = PIPELINE_BATCH_SIZE,
                     progress: bool = False) -> Dict[str, float]:
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


def per_language(metrics: Dict[str, float], name: str = "p_at_1") -> Dict[str, float]:
    """{language: value} of one per-language Tatoeba metric."""
    result = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "tatoeba" and parts[2] == name:
            result[parts[1]] = value
    return result


# === Tatoeba with margin scoring ===

def tatoeba_margin_accuracy(source: np.ndarray, english: np.ndarray, k: int = 4,
                            margin: str = "ratio") -> Dict[str, float]:
    """Tatoeba P@1 where candidates are ranked by margin (Artetxe & Schwenk
    2019) instead of raw cosine: hubs that are close to everything lose."""
    from lealla_tf.mining.margins import margin_scores

    similarities = _unit_rows(source) @ _unit_rows(english).T
    k = min(k, len(english))
    source_average = -np.sort(-similarities, axis=1)[:, :k].mean(axis=1)
    english_average = -np.sort(-similarities.T, axis=1)[:, :k].mean(axis=1)
    scores = margin_scores(similarities, source_average[:, None], english_average[None, :],
                           margin)
    rows = np.arange(len(source))
    forward = float(np.mean(np.argmax(scores, axis=1) == rows))
    backward = float(np.mean(np.argmax(scores, axis=0) == rows))
    return {"xx_to_en": forward, "en_to_xx": backward, "p_at_1": (forward + backward) / 2}


def evaluate_tatoeba_margin(source_by_language: Dict[str, np.ndarray],
                            english_by_language: Dict[str, np.ndarray],
                            margin: str = "ratio", k: int = 4) -> Dict[str, float]:
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


# === BUCC 2018 protocol ===

def write_bucc_split(directory: str, language: str, split: str, source, english, gold) -> None:
    """Writes one split in BUCC 2018 format.

    `{lang}-en.{split}.{lang}` and `{lang}-en.{split}.en` hold "id<TAB>sentence"
    lines; `{lang}-en.{split}.gold` holds "source id<TAB>English id" lines.
    """
    import os

    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, f"{language}-en.{split}")
    for suffix, rows in ((language, source), ("en", english)):
        with open(f"{prefix}.{suffix}", "w", encoding="utf-8") as f:
            f.writelines(f"{i}\t{s}\n" for i, s in rows)
    with open(f"{prefix}.gold", "w", encoding="utf-8") as f:
        f.writelines(f"{a}\t{b}\n" for a, b in gold)


def build_bucc_like_split(pairs, num_gold: int, num_distractors: int, seed: int = 0):
    """Hides `num_gold` parallel pairs among non-parallel sentences.

    From a list of (source, English) pairs: `num_gold` pairs stay aligned;
    `num_distractors` further sources and `num_distractors` further English
    sentences come from DIFFERENT pairs, so they have no translation on the
    other side. Ids are shuffled, as in BUCC's comparable corpora. Pairs whose
    source or English text occurs more than once are dropped first, so that
    every gold pair is unambiguous.

    Returns (source rows, English rows, gold id pairs).
    """
    import collections

    source_counts = collections.Counter(s for s, _ in pairs)
    english_counts = collections.Counter(e for _, e in pairs)
    pairs = [(s, e) for s, e in pairs if source_counts[s] == 1 and english_counts[e] == 1
             and s != e]
    rng = np.random.default_rng(seed)
    needed = num_gold + 2 * num_distractors
    if len(pairs) < needed:
        raise ValueError(f"need {needed} pairs for {num_gold} gold + {num_distractors} "
                         f"distractors a side, got {len(pairs)} with unique sides")
    chosen = [pairs[i] for i in rng.choice(len(pairs), size=needed, replace=False)]
    gold_pairs = chosen[:num_gold]
    source_only = [p[0] for p in chosen[num_gold:num_gold + num_distractors]]
    english_only = [p[1] for p in chosen[num_gold + num_distractors:]]
    sources = [(s, True, i) for i, (s, _) in enumerate(gold_pairs)] + [
        (s, False, None) for s in source_only]
    englishes = [(e, True, i) for i, (_, e) in enumerate(gold_pairs)] + [
        (e, False, None) for e in english_only]
    def shuffle_with_ids(items, prefix):
        rows, id_of_gold = [], {}
        for position, index in enumerate(rng.permutation(len(items))):
            text, is_gold, gold_index = items[index]
            identifier = f"{prefix}-{position:08d}"
            rows.append((identifier, text))
            if is_gold:
                id_of_gold[gold_index] = identifier
        return rows, id_of_gold

    source_rows, source_id_of_gold = shuffle_with_ids(sources, "src")
    english_rows, english_id_of_gold = shuffle_with_ids(englishes, "en")
    gold = [(source_id_of_gold[i], english_id_of_gold[i]) for i in range(num_gold)]
    return source_rows, english_rows, gold


def _bucc_lines(path: str, what: str):
    """(line number, text) of each line of a BUCC file; a line that is not UTF-8
    raises DataFileError naming the file and the line (it was replaced by U+FFFD)."""
    from lealla_tf.parallel_corpus import DataFileError

    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataFileError(f"{what} {path}: line {number} is not UTF-8", path,
                                    number) from None
            yield number, text.rstrip("\n").rstrip("\r")


def _bucc_sentences(path: str):
    """[(id, sentence)] of a BUCC sentence file. Blank lines are passed over; a line
    that is not id<TAB>sentence, or an id seen before, raises DataFileError naming
    the file, the line and the id: with one id on two sentences, a candidate of
    either counted for the gold pair, and F1 moved (60.0 to 72.7 in a probe)."""
    from lealla_tf.parallel_corpus import DataFileError

    what = "BUCC sentence file"
    rows, first = [], {}
    for number, line in _bucc_lines(path, what):
        if not line.strip():
            continue
        identifier, tab, sentence = line.partition("\t")
        if not tab or not identifier.strip():
            raise DataFileError(f"{what} {path}: line {number} is not id<TAB>sentence: "
                                f"{line!r:.60}", path, number)
        if identifier in first:
            raise DataFileError(f"{what} {path}: line {number}: id {identifier!r} again "
                                f"(first on line {first[identifier]}): each id names one "
                                "sentence", path, number)
        first[identifier] = number
        rows.append((identifier, sentence))
    return rows


def read_bucc_split(directory: str, language: str, split: str):
    """(source rows, English rows, gold set) of a BUCC-format split.

    Every file is checked, since a fault there changes the score without a word:
    a missing or empty `.gold` file scored 0; gold pairs naming ids that are in
    neither sentence file still counted in recall's denominator; an id twice in
    a sentence file let either sentence count for it; an id twice in the gold
    (one sentence, two translations) caps recall. `FileNotFoundError`, or
    `DataFileError` (a ValueError) naming the file, the line and the id, instead.
    """
    import os

    from lealla_tf.parallel_corpus import DataFileError

    prefix = os.path.join(directory, f"{language}-en.{split}")
    source, english = _bucc_sentences(f"{prefix}.{language}"), _bucc_sentences(f"{prefix}.en")
    gold_path = f"{prefix}.gold"
    if not os.path.exists(gold_path):
        raise FileNotFoundError(f"BUCC gold file {gold_path} not found (it lists the "
                                "translation pairs, source id<TAB>English id a line)")
    known = {"source": {i for i, _ in source}, "English": {i for i, _ in english}}
    paired = {"source": {}, "English": {}}  # id -> the gold line that pairs it
    gold, faults, first_fault = set(), [], None
    for number, line in _bucc_lines(gold_path, "BUCC gold file"):
        if not line.strip():
            continue
        before = len(faults)
        if line.count("\t") != 1:
            faults.append(f"line {number} is not source id<TAB>English id: {line!r:.60}")
        else:
            pair = tuple(line.split("\t"))
            for side, identifier in zip(known, pair):
                if identifier not in known[side]:
                    faults.append(f"line {number}: {side} id {identifier!r} unknown")
                elif identifier in paired[side]:
                    faults.append(f"line {number}: {side} id {identifier!r} again (first on "
                                  f"line {paired[side][identifier]})")
                else:
                    paired[side][identifier] = number
            gold.add(pair)
        if len(faults) > before and first_fault is None:
            first_fault = number
    if faults:
        more = f"; and {len(faults) - 5} more" if len(faults) > 5 else ""
        raise DataFileError(f"BUCC gold file {gold_path}: " + "; ".join(faults[:5]) + more
                            + f" (ids must be in {prefix}.{language} and {prefix}.en)",
                            gold_path, first_fault)
    if not gold:
        raise DataFileError(f"BUCC gold file {gold_path} holds no pairs: precision, recall "
                            "and F1 would all be 0", gold_path)
    return source, english, gold


def bucc_candidates(source_embeddings, english_embeddings, source_ids, english_ids,
                    k: int = 4, margin: str = "ratio", retrieval: str = "max"):
    """All mined (score, source id, English id) candidates, best first."""
    from lealla_tf.mining.margins import mine

    mined = mine(source_embeddings, english_embeddings, k=k, margin=margin, retrieval=retrieval)
    return (mined["score"], [source_ids[i] for i in mined["source"]],
            [english_ids[i] for i in mined["target"]])


def score_against_gold(scores, sources, englishes, gold, threshold: float) -> Dict[str, float]:
    """Precision, recall and F1 of the candidates scoring >= threshold."""
    kept = [(s, e) for score, s, e in zip(scores, sources, englishes) if score >= threshold]
    hits = sum(1 for pair in kept if pair in gold)
    precision = hits / len(kept) if kept else 0.0
    recall = hits / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "mined": len(kept)}


def evaluate_bucc(embed: Callable, bucc_dir: str, languages: Sequence[str],
                  batch_size: int = PIPELINE_BATCH_SIZE,
                  progress: bool = False) -> Dict[str, float]:
    """The BUCC 2018 protocol (LASER tasks/bucc): mine with ratio margin (k=4,
    retrieval max), choose the threshold with the best F1 on the `training`
    split's gold, report precision / recall / F1 on `test` at that threshold.

    Returns flat metrics `bucc/<lang>/{precision,recall,f1,threshold}`,
    `bucc/average_f1`, and the gold pairs behind each F1: `bucc/<lang>/gold_pairs`
    (test), `bucc/<lang>/training_gold_pairs` (where the threshold was chosen)
    and `bucc/gold_pairs` (every language's test gold: the average's).
    """
    from lealla_tf.mining.margins import best_threshold

    metrics = {}
    for language in languages:
        split_results = {}
        for split in ("training", "test"):
            source, english, gold = read_bucc_split(bucc_dir, language, split)
            source_embeddings = embed_sentences(embed, [t for _, t in source], batch_size,
                                                progress, f"bucc {language} {split}")
            english_embeddings = embed_sentences(embed, [t for _, t in english], batch_size,
                                                 progress, f"bucc {language} {split}")
            split_results[split] = (bucc_candidates(
                source_embeddings, english_embeddings, [i for i, _ in source],
                [i for i, _ in english]), gold)
        (scores, sources, englishes), gold = split_results["training"]
        correct = np.array([(s, e) in gold for s, e in zip(sources, englishes)])
        threshold = best_threshold(np.asarray(scores), correct, len(gold))["threshold"]
        (scores, sources, englishes), gold = split_results["test"]
        result = score_against_gold(scores, sources, englishes, gold, threshold)
        result.update(threshold=threshold, gold_pairs=len(gold),
                      training_gold_pairs=len(split_results["training"][1]))
        for name, value in result.items():
            metrics[f"bucc/{language}/{name}"] = value
    metrics[BUCC_AVERAGE_F1] = float(np.mean([metrics[f"bucc/{lang}/f1"] for lang in languages]))
    metrics[BUCC_GOLD_PAIRS] = sum(metrics[f"bucc/{lang}/gold_pairs"] for lang in languages)
    return metrics


# An F1 over fewer gold pairs than this is stated with a caveat: one pair moves it
# by about 100 / gold points.
FEW_GOLD_PAIRS = 100


def gold_pairs_note(gold_pairs: int) -> str:
    """How an F1 states its basis: "over 412 gold pairs", and under FEW_GOLD_PAIRS
    a caveat: "over 2 gold pairs, too few: under 100, one pair moves it by about
    50 points"."""
    note = f"over {gold_pairs:,} gold pair{'' if gold_pairs == 1 else 's'}"
    if gold_pairs < FEW_GOLD_PAIRS:
        note += (f", too few: under {FEW_GOLD_PAIRS}, one pair moves it by about "
                 f"{100 / max(gold_pairs, 1):.0f} points")
    return note


# === UN-style retrieval over a large pool ===

def retrieval_accuracy(queries: np.ndarray, pool: np.ndarray, gold: np.ndarray,
                       index_type: str = "flat", **index_options) -> float:
    """P@1: the fraction of queries whose nearest pool vector (faiss, inner
    product on unit vectors) is their gold pool index."""
    from lealla_tf.mining.margins import knn, normalize_rows

    _, indices = knn(normalize_rows(queries), normalize_rows(pool), 1, index_type,
                     **index_options)
    return float(np.mean(indices[:, 0] == np.asarray(gold)))


def evaluate_un_style(embed: Callable, pairs_by_language: Dict[str, list],
                      distractor_english: Sequence[str], batch_size: int = PIPELINE_BATCH_SIZE,
                      index_type: str = "flat", progress: bool = False) -> Dict[str, float]:
    """UN-style P@1 (LaBSE / LEALLA's UN task): each source sentence retrieves
    its translation among ALL English sentences of the pool (every language's
    gold English plus distractors); P@1 xx -> en.

    Returns `un/<lang>/p_at_1`, `un/average_p_at_1` and `un/pool_size`.
    """
    english_pool = list(distractor_english)
    gold_positions, sources = {}, {}
    for language, pairs in sorted(pairs_by_language.items()):
        gold_positions[language] = np.arange(len(english_pool), len(english_pool) + len(pairs))
        english_pool += [e for _, e in pairs]
        sources[language] = [s for s, _ in pairs]
    pool = embed_sentences(embed, english_pool, batch_size, progress, "un pool")
    metrics = {"un/pool_size": len(english_pool)}
    for language in sorted(pairs_by_language):
        queries = embed_sentences(embed, sources[language], batch_size, progress, f"un {language}")
        metrics[f"un/{language}/p_at_1"] = retrieval_accuracy(
            queries, pool, gold_positions[language], index_type)
    metrics[UN_AVERAGE_P_AT_1] = float(np.mean(
        [metrics[f"un/{lang}/p_at_1"] for lang in pairs_by_language]))
    return metrics


# === Tatoeba in one pass, as reports use it ===

def tatoeba_with_margin(embed: Callable, tatoeba_dir: str, max_pairs: Optional[int] = None,
                        progress: bool = True,
                        batch_size: int = PIPELINE_BATCH_SIZE) -> Dict[str, float]:
    """Cosine and margin Tatoeba metrics from ONE embedding pass, plus the
    sentence count and sentences/s of that pass."""
    import time

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


def tatoeba_metrics_with_margin(embedded, seconds: float) -> Dict[str, float]:
    """Cosine and margin metrics of `embed_tatoeba`'s output, with the sentence
    count and the sentences/s of the pass that took `seconds`."""
    metrics = tatoeba_metrics(embedded)
    metrics[TATOEBA_SENTENCES] = 2 * sum(len(s) for s, _ in embedded.values())
    metrics["tatoeba/sentences_per_second"] = metrics[TATOEBA_SENTENCES] / max(seconds, 1e-9)
    metrics.update(evaluate_tatoeba_margin({l: s for l, (s, _) in embedded.items()},
                                           {l: e for l, (_, e) in embedded.items()}))
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


def best_and_worst(values: Dict[str, float], count: int = 10):
    """(best `count`, worst `count`) languages of {language: value}, best first."""
    ranked = sorted(values, key=lambda language: (-values[language], language))
    return ranked[:count], ranked[-count:]
