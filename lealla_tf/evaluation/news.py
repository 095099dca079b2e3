"""A news-length evaluation held out of training: BUCC-protocol mining and P@1 by
length band on NTREX-128 (news, 1,997 sentences translated into 128 languages).

NTREX's English side is the same in every language, so a sentence is held out
by its English text: `is_held_out(english)` picks a fixed slice of them by a
hash (the same slice on every machine and for every language). The main job
drops every pair whose English side is held out, and every translation of one,
from its training sample (`held_out_sentences`), so neither side of a test pair
is ever trained on, in any language.

Two evaluations read the held-out pairs:
- **mining** (`write_news_set`, then `lealla_tf.evaluation.bucc.evaluate_bucc`): for
  each language, the held-out pairs are split by a second hash into a
  `training` half (where the margin threshold is chosen, as BUCC's training
  gold is used) and a `test` half; in each half, gold pairs are hidden among
  sentences whose translation is not on the other side, as in BUCC 2018;
- **P@1 by length band** (`p_at_1_by_length`): each held-out pair's source
  retrieves among all held-out English sentences of its language, and back;
  pairs are grouped by the longer side's token count.

Importing it loads no TensorFlow: `NEWS_LANGUAGES` is a default of
`lealla-recipe`'s flags, whose --help answers before TensorFlow loads
(tests/cli/test_scripts.py).
"""

import hashlib
import os
from collections.abc import Callable, Sequence

import numpy as np

from lealla_tf.evaluation.bucc import (
    BUCC_AVERAGE_F1,
    build_bucc_like_split,
    evaluate_bucc,
    write_bucc_split,
)
from lealla_tf.mining.neighbours import normalize_rows
from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

# The held-out news set's mining languages (NTREX codes): BUCC 2018's four and four
# more scripts and families.
NEWS_LANGUAGES = ("deu", "fra", "rus", "zho-CN", "arb", "hin", "jpn", "tur")
# One English sentence in HELD_OUT_SHARE is held out (about 400 of NTREX's 1,997).
HELD_OUT_SHARE = 5
# Token-count bands (the longer side's tokens; upper bounds exclusive).
LENGTH_BANDS = ((1, 16), (16, 32), (32, 48), (48, 64), (64, 80), (80, 10 ** 9))
NEWS_PRIMARY_METRIC = "news/average_f1"


def _hash(text: str, salt: str) -> int:
    return int.from_bytes(hashlib.sha256((salt + text).encode("utf-8")).digest()[:8], "big")


def is_held_out(english: str) -> bool:
    """Whether this NTREX English sentence (and every translation of it) is held out."""
    return _hash(english.strip(), "lealla_tf.news") % HELD_OUT_SHARE == 0


def split_of(english: str) -> str:
    """`training` (threshold selection) or `test`, for a held-out sentence."""
    return "training" if _hash(english.strip(), "lealla_tf.news.split") % 2 else "test"


def band_name(band: tuple[int, int]) -> str:
    low, high = band
    return f"{low}+" if high >= 10 ** 9 else f"{low}-{high - 1}"


def ntrex_files(ntrex_dir: str) -> dict[str, str]:
    """{code: path} of NTREX's `<code>-eng.tsv.gz` files, by the file's own code
    (`zho-CN` and `zho-TW`, `fra` and `fra-CA` are different sets)."""
    return {os.path.basename(f.path).split("-eng.")[0]: f.path
            for f in find_parallel_files([ntrex_dir])}


def held_out_pairs(path: str) -> list[tuple[str, str]]:
    """The held-out (source, English) pairs of one NTREX file, in file order."""
    return [(s, e) for s, e in read_pairs(path) if is_held_out(e)]


def held_out_sentences(ntrex_dir: str) -> set:
    """Both sides of every held-out pair in every NTREX language: what a
    training sample must not contain."""
    sentences = set()
    for path in ntrex_files(ntrex_dir).values():
        for pair in held_out_pairs(path):
            sentences.update(pair)
    return sentences


def write_news_set(ntrex_dir: str, output_dir: str, languages: Sequence[str] = NEWS_LANGUAGES,
                   seed: int = 0) -> dict:
    """Writes the mining splits (BUCC format, `lealla_tf.evaluation.bucc.write_bucc_split`)
    and the held-out pairs (`<lang>.pairs.tsv`) of each language.

    Each half holds its pairs' gold half plus a quarter of distractors a side.
    Returns {"languages": [...], "pairs": {lang: n}, "gold": {lang: {split: n}},
    "missing": [languages with no NTREX file]}.
    """
    files = ntrex_files(ntrex_dir)
    missing = [language for language in languages if language not in files]
    summary = {"languages": [], "pairs": {}, "gold": {}, "missing": missing}
    os.makedirs(output_dir, exist_ok=True)
    for language in languages:
        if language in missing:
            continue
        pairs = held_out_pairs(files[language])
        with open(os.path.join(output_dir, f"{language}.pairs.tsv"), "w",
                  encoding="utf-8") as f:
            f.writelines(f"{s}\t{e}\n" for s, e in pairs)
        gold = {}
        for index, split in enumerate(("training", "test")):
            half = [p for p in pairs if split_of(p[1]) == split]
            distractors = len(half) // 4
            rows = build_bucc_like_split(half, len(half) - 2 * distractors - len(half) % 2,
                                         distractors, seed + index)
            write_bucc_split(output_dir, language, split, *rows)
            gold[split] = len(rows[2])
        summary["languages"].append(language)
        summary["pairs"][language] = len(pairs)
        summary["gold"][language] = gold
    return summary


def read_news_pairs(news_dir: str, language: str) -> list[tuple[str, str]]:
    with open(os.path.join(news_dir, f"{language}.pairs.tsv"), encoding="utf-8") as f:
        return [tuple(line.rstrip("\n").split("\t", 1)) for line in f]


class CachedEmbedder:
    """Embeds each distinct sentence once (NTREX's English side repeats in every
    language); `encode` as `Embedder.encode`, and the wrapped model's
    `token_lengths`."""

    def __init__(self, embedder):
        self.embedder = embedder
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, strings):
        return self.encode([s.decode("utf-8") if isinstance(s, bytes) else s
                            for s in np.asarray(strings).tolist()])

    def encode(self, sentences: Sequence[str], *args, **kwargs) -> np.ndarray:
        """Rows for `sentences`, embedding (in one length-sorted pass, with the
        pipelines' batching, `Embedder.encode`'s default) only those not seen before."""
        new = sorted({s for s in sentences if s not in self.cache})
        if new:
            for sentence, row in zip(new, self.embedder.encode(new)):
                self.cache[sentence] = row
        if not sentences:
            return np.zeros((0, self.embedder.dimension), np.float32)
        return np.stack([self.cache[s] for s in sentences])


def p_at_1_by_length(embed, news_dir: str, languages: Sequence[str],
                     count_tokens: Callable[[list[str]], np.ndarray]) -> dict[str, float]:
    """P@1 (both directions, averaged) of every held-out pair, by the longer
    side's token count (`count_tokens`, one tokenizer for every model compared,
    so each model is scored on the same pairs in each band).

    Returns flat metrics `news_length/<band>/p_at_1` and `.../pairs` over all
    languages, `news_length/<lang>/p_at_1`, and `news_length/average_p_at_1`
    (the languages' average).
    """
    hits, lengths, metrics = [], [], {}
    for language in languages:
        pairs = read_news_pairs(news_dir, language)
        source = normalize_rows(embed.encode([s for s, _ in pairs]))
        english = normalize_rows(embed.encode([e for _, e in pairs]))
        similarities = source @ english.T
        truth = np.arange(len(pairs))
        correct = ((similarities.argmax(axis=1) == truth).astype(np.float64)
                   + (similarities.argmax(axis=0) == truth)) / 2
        metrics[f"news_length/{language}/p_at_1"] = float(correct.mean())
        hits.append(correct)
        lengths.append(np.maximum(count_tokens([s for s, _ in pairs]),
                                  count_tokens([e for _, e in pairs])))
    hits, lengths = np.concatenate(hits), np.concatenate(lengths)
    for band in LENGTH_BANDS:
        inside = (lengths >= band[0]) & (lengths < band[1])
        metrics[f"news_length/{band_name(band)}/pairs"] = int(inside.sum())
        metrics[f"news_length/{band_name(band)}/p_at_1"] = (
            float(hits[inside].mean()) if inside.any() else None)
    metrics["news_length/average_p_at_1"] = float(np.mean(
        [metrics[f"news_length/{language}/p_at_1"] for language in languages]))
    return metrics


def evaluate_news(embedder, news_dir: str, languages: Sequence[str],
                  count_tokens: Callable[[list[str]], np.ndarray]) -> dict[str, float]:
    """Both news evaluations of one model: `news/<lang>/{precision,recall,f1,
    threshold}` and `news/average_f1` (BUCC protocol, ratio margin, threshold
    from the training half) with the gold pairs behind them (`news/<lang>/gold_pairs`,
    `news/gold_pairs`: the test halves'), and `news_length/...` (see
    `p_at_1_by_length`)."""
    cached = CachedEmbedder(embedder)
    everything = []  # embedded in one pass, then looked up by both evaluations
    for language in languages:
        everything += [s for pair in read_news_pairs(news_dir, language) for s in pair]
    cached.encode(everything)
    mining = evaluate_bucc(cached, news_dir, languages)
    metrics = {"news/" + key[len("bucc/"):]: value for key, value in mining.items()
               if key != BUCC_AVERAGE_F1}
    metrics[NEWS_PRIMARY_METRIC] = mining[BUCC_AVERAGE_F1]
    metrics.update(p_at_1_by_length(cached, news_dir, languages, count_tokens))
    metrics["news/sentences"] = len(cached.cache)
    return metrics


def length_band_names() -> list[str]:
    return [band_name(band) for band in LENGTH_BANDS]
