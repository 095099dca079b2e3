"""The BUCC 2018 protocol (LASER tasks/bucc): files in BUCC format (read, written,
or built from parallel pairs hidden among distractors), mining with margin
scores, and precision / recall / F1 against the gold pairs at the threshold that
scores best on the `training` split (`evaluate_bucc`).

Every F1 states the gold pairs behind it (`gold_pairs_note`).
"""

import collections
import os
from collections.abc import Callable, Sequence

import numpy as np

from lealla_tf.evaluation.retrieval import embed_sentences
from lealla_tf.inference.batching import PIPELINE_BATCH_SIZE
from lealla_tf.mining.margins import best_threshold, mine
from lealla_tf.parallel_corpus import DataFileError

# The metric names, spelled here and nowhere else.
BUCC_AVERAGE_F1 = "bucc/average_f1"
BUCC_GOLD_PAIRS = "bucc/gold_pairs"  # the test gold pairs behind the average F1


def write_bucc_split(directory: str, language: str, split: str, source, english, gold) -> None:
    """Writes one split in BUCC 2018 format.

    `{lang}-en.{split}.{lang}` and `{lang}-en.{split}.en` hold "id<TAB>sentence"
    lines; `{lang}-en.{split}.gold` holds "source id<TAB>English id" lines.
    """
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
    either counted for the gold pair, and F1 moved."""
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
    mined = mine(source_embeddings, english_embeddings, k=k, margin=margin, retrieval=retrieval)
    return (mined["score"], [source_ids[i] for i in mined["source"]],
            [english_ids[i] for i in mined["target"]])


def score_against_gold(scores, sources, englishes, gold, threshold: float) -> dict[str, float]:
    """Precision, recall and F1 of the candidates scoring >= threshold."""
    kept = [(s, e) for score, s, e in zip(scores, sources, englishes) if score >= threshold]
    hits = sum(1 for pair in kept if pair in gold)
    precision = hits / len(kept) if kept else 0.0
    recall = hits / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "mined": len(kept)}


def evaluate_bucc(embed: Callable, bucc_dir: str, languages: Sequence[str],
                  batch_size: int = PIPELINE_BATCH_SIZE,
                  progress: bool = False) -> dict[str, float]:
    """The BUCC 2018 protocol (LASER tasks/bucc): mine with ratio margin (k=4,
    retrieval max), choose the threshold with the best F1 on the `training`
    split's gold, report precision / recall / F1 on `test` at that threshold.

    Returns flat metrics `bucc/<lang>/{precision,recall,f1,threshold}`,
    `bucc/average_f1`, and the gold pairs behind each F1: `bucc/<lang>/gold_pairs`
    (test), `bucc/<lang>/training_gold_pairs` (where the threshold was chosen)
    and `bucc/gold_pairs` (every language's test gold: the average's).
    """
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
