"""The held-out news set: which sentences are held out, the mining splits, and P@1
by token band."""

import numpy as np
import pytest
from conftest import write_pairs

from lealla_tf.evaluation import news as news_set


def news_dir(tmp_path, languages=("deu", "fra"), count=200):
    """NTREX-like files: one English side shared by every language."""
    for language in languages:
        write_pairs(tmp_path / "ntrex", language,
                    [(f"{language} sentence {i} " + "x" * (i % 7 * 20), f"English sentence {i}")
                     for i in range(count)])
    return str(tmp_path / "ntrex")


def test_a_fifth_of_the_english_side_is_held_out_in_every_language(tmp_path):
    ntrex = news_dir(tmp_path)
    english = [f"English sentence {i}" for i in range(200)]
    held = [e for e in english if news_set.is_held_out(e)]
    assert 25 < len(held) < 55  # one in HELD_OUT_SHARE, by a hash
    assert news_set.is_held_out(" " + held[0] + " ")  # the same sentence, whatever spacing
    sentences = news_set.held_out_sentences(ntrex)
    # Both sides of every held-out pair, in every language, and nothing else.
    expected = set(held) | {f"{lang} sentence {english.index(e)} " + "x" * (
        english.index(e) % 7 * 20) for lang in ("deu", "fra") for e in held}
    assert sentences == expected
    assert {news_set.split_of(e) for e in held} == {"training", "test"}


def test_the_mining_splits_hide_gold_pairs_among_unpaired_sentences(tmp_path):
    from lealla_tf.evaluation.bucc import read_bucc_split

    summary = news_set.write_news_set(news_dir(tmp_path), str(tmp_path / "out"),
                                      ["deu", "fra", "xho"])
    assert summary["languages"] == ["deu", "fra"] and summary["missing"] == ["xho"]
    for language in ("deu", "fra"):
        pairs = news_set.read_news_pairs(str(tmp_path / "out"), language)
        assert len(pairs) == summary["pairs"][language]
        for split in ("training", "test"):
            source, english, gold = read_bucc_split(str(tmp_path / "out"), language, split)
            assert len(gold) == summary["gold"][language][split] > 0
            assert len(source) > len(gold) and len(english) > len(gold)  # distractors
            texts = dict(source)
            assert all(texts[s].startswith(language) for s, _ in gold)


def test_p_at_1_by_band_counts_every_pair_once_on_the_same_pairs(tmp_path):
    news_set.write_news_set(news_dir(tmp_path), str(tmp_path / "out"), ["deu", "fra"])

    class Exact:  # a sentence's number as a one-hot vector: every pair found
        dimension = 256

        def encode(self, sentences):
            rows = np.zeros((len(sentences), self.dimension), np.float32)
            for row, sentence in zip(rows, sentences):
                row[int(sentence.split()[2])] = 1.0
            return rows

    def count_tokens(sentences):
        return np.array([len(s.split()) for s in sentences])

    metrics = news_set.p_at_1_by_length(Exact(), str(tmp_path / "out"), ["deu", "fra"],
                                        count_tokens)
    pairs = sum(len(news_set.read_news_pairs(str(tmp_path / "out"), lang))
                for lang in ("deu", "fra"))
    bands = news_set.length_band_names()
    assert sum(metrics[f"news_length/{band}/pairs"] for band in bands) == pairs
    assert metrics["news_length/average_p_at_1"] == 1.0
    assert all(metrics[f"news_length/{b}/p_at_1"] in (1.0, None) for b in bands)
    assert metrics["news_length/1-15/pairs"] == pairs  # 3-4 words each here


class Counting:
    """A sentence's number as one-hot on a positive floor (margins need positive
    neighbours): every pair found; `calls` holds every sentence embedded."""

    dimension = 256

    def __init__(self):
        self.calls = []

    def encode(self, sentences, *args, **kwargs):
        self.calls.extend(sentences)
        rows = np.full((len(sentences), self.dimension), 0.05, np.float32)
        for row, sentence in zip(rows, sentences):
            row[int(sentence.split()[2])] = 1.0
        return rows


def count_words(sentences):
    return np.array([len(s.split()) for s in sentences])


def test_the_news_evaluation_embeds_each_distinct_sentence_once(tmp_path):
    news_set.write_news_set(news_dir(tmp_path), str(tmp_path / "out"), ["deu", "fra"])
    embedder = Counting()
    metrics = news_set.evaluate_news(embedder, str(tmp_path / "out"), ["deu", "fra"], count_words)
    calls = embedder.calls
    assert len(calls) == len(set(calls)) == metrics["news/sentences"]
    assert metrics[news_set.NEWS_PRIMARY_METRIC] == pytest.approx(1.0)


def test_the_news_f1_states_the_gold_pairs_behind_it(tmp_path):
    """A tiny job's news F1 (and its ratio to the teacher's) came from 2 gold
    pairs, and nothing said so."""
    summary = news_set.write_news_set(news_dir(tmp_path), str(tmp_path / "out"), ["deu", "fra"])
    metrics = news_set.evaluate_news(Counting(), str(tmp_path / "out"), ["deu", "fra"],
                                     count_words)
    for language in ("deu", "fra"):
        assert metrics[f"news/{language}/gold_pairs"] == summary["gold"][language]["test"]
    assert metrics["news/gold_pairs"] == sum(g["test"] for g in summary["gold"].values())
