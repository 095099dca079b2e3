"""The vocabulary builder: balancing, WordPiece format, SentencePiece, report, CLI."""


import numpy as np
import pytest
import tensorflow as tf
from conftest import write_pairs

from lealla_tf.parallel_corpus import find_parallel_files
from lealla_tf.tokenizers.tokenizer import Tokenizer, read_wordpiece_vocabulary
from lealla_tf.tokenizers.vocabulary import (
    RESERVED_TOKENS,
    build_vocabulary,
    count_words,
    language_weights,
    sample_sentences,
    vocabulary_report,
)


def test_language_weights_follow_temperature_sampling():
    sizes = {"eng": 9000, "deu": 900, "xho": 100}
    # alpha = 1: corpus proportions, every factor 1.
    assert all(np.isclose(w, 1.0) for w in language_weights(sizes, 1.0).values())
    # alpha = 0: every language the same share q = 1/3.
    uniform = language_weights(sizes, 0.0)
    total = sum(sizes.values())
    shares = {lang: uniform[lang] * n / total for lang, n in sizes.items()}
    assert all(np.isclose(s, 1 / 3) for s in shares.values())
    # Reference transcription of q_l = n_l^a / sum n^a, weight = q_l / p_l.
    a = 0.3
    q = {code: n ** a / sum(m ** a for m in sizes.values()) for code, n in sizes.items()}
    expected = {code: q[code] / (n / total) for code, n in sizes.items()}
    got = language_weights(sizes, a)
    assert all(np.isclose(got[code], expected[code]) for code in sizes)
    assert got["xho"] > got["deu"] > got["eng"]
    with pytest.raises(ValueError):
        language_weights(sizes, 1.5)


def test_count_words_deduplicates_english(tiny_parallel_dir):
    counts, sentences, stats = count_words(find_parallel_files([tiny_parallel_dir]),
                                           progress=False)
    assert stats["pairs"] == 20 * 10
    # The same 3 English sentences are paired with every language, 20 times each.
    assert sentences["eng"] == 3
    assert counts["deu"][b"Hund"] == 20
    assert counts["eng"][b"dog"] == 1
    assert counts["cmn"][b"\xe7\x8b\x97"] == 20  # CJK characters are split off as words


def test_wordpiece_vocabulary_format_and_size(tiny_parallel_dir, tmp_path):
    output = str(tmp_path / "vocab.txt")
    summary = build_vocabulary([tiny_parallel_dir], vocab_size=150, output=output,
                               progress=False)
    vocabulary = read_wordpiece_vocabulary(output)
    assert summary["vocab_size"] == len(vocabulary) <= 150
    assert vocabulary[:len(RESERVED_TOKENS)] == list(RESERVED_TOKENS)
    assert len(set(vocabulary)) == len(vocabulary)
    characters = {t for t in vocabulary if len(t) == 1 and t not in RESERVED_TOKENS}
    assert {"H", "狗", "ш"} <= characters
    for character in characters:
        assert "##" + character in vocabulary
    # Everything in the training data tokenizes without [UNK].
    tokenizer = Tokenizer(output)
    sentences = [s for pairs in __import__("conftest").TINY_PAIRS.values()
                 for pair in pairs for s in pair]
    ids = tokenizer.tokenize(tf.constant(sentences)).flat_values.numpy()
    assert tokenizer.unk_id not in ids
    assert summary["languages"] == 5 and summary["malformed_lines_skipped"] == 0


def test_balancing_gives_small_languages_more_pieces(tmp_path):
    big = [(f"Großer Hund Nummer{i} läuft schnell", "x") for i in range(400)]
    small = [("isiXhosa inja enkulu iyabaleka ngokukhawuleza", "y")] * 4
    write_pairs(tmp_path / "data", "deu", big)
    write_pairs(tmp_path / "data", "xho", small)
    lengths = {}
    for alpha in (1.0, 0.0):
        output = str(tmp_path / f"vocab_{alpha}.txt")
        build_vocabulary([str(tmp_path / "data")], vocab_size=140, output=output, alpha=alpha,
                         progress=False)
        tokenizer = Tokenizer(output)
        lengths[alpha] = int(tokenizer.tokenize(tf.constant([small[0][0]])).row_lengths()[0])
    assert lengths[0.0] < lengths[1.0]


def test_sample_sentences_balances_languages():
    by_language = {"eng": [f"e{i}" for i in range(1000)], "xho": ["x0", "x1"]}
    sample = sample_sentences(by_language, alpha=0.0, num_sentences=200)
    assert abs(sum(s.startswith("x") for s in sample) - 100) <= 1


def test_vocabulary_report_counts_unknowns(tiny_vocab_file, tiny_tatoeba_dir):
    report = vocabulary_report(tiny_vocab_file, tiny_tatoeba_dir)
    assert set(report["languages"]) == {"cmn", "deu", "fra", "rus"}
    # The tiny vocabulary has no Cyrillic pieces except one word: Russian is mostly [UNK].
    assert report["languages"]["rus"]["unk_rate"] > 0.3
    assert report["languages"]["deu"]["unk_rate"] < report["languages"]["rus"]["unk_rate"]
    assert report["eng"]["sentences"] == 10
    assert report["languages"]["deu"]["tokens_per_sentence"] > 3


def test_sentencepiece_learns_from_a_hundred_sentences_or_fewer(tmp_path):
    """sentencepiece refuses a sample size of 100 or less; a small corpus is read
    whole instead, with the specials where the tokenizer expects them."""
    import sentencepiece

    from lealla_tf.tokenizers.vocabulary import learn_sentencepiece

    sentences = [f"{src} {eng}" for pairs in __import__("conftest").TINY_PAIRS.values()
                 for src, eng in pairs] * 5
    assert len(sentences) <= 100
    path = learn_sentencepiece(sentences, vocab_size=60, output_prefix=str(tmp_path / "small"))
    model = sentencepiece.SentencePieceProcessor(model_file=path)
    assert [model.id_to_piece(i) for i in range(2)] == ["[PAD]", "[UNK]"]
    assert model.piece_to_id("[CLS]") not in (0, 1)
    assert model.encode("The dog is nice.") and 1 not in model.encode("The dog is nice.")
