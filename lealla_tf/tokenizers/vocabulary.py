"""Learning a multilingual vocabulary from parallel corpora (the library behind
`lealla-vocab`).

`build_vocabulary(inputs, vocab_size, output)` learns a cased WordPiece
vocabulary in the format of LaBSE's `cased_vocab.txt` (or, with
`sentencepiece=True`, a SentencePiece model) for users who do not have LaBSE's
501,153-token vocabulary.

How:
1. Words are counted per language with tensorflow-text's BERT basic tokenizer
   (the same whitespace / punctuation / CJK splitting that `FastBertTokenizer`
   applies before WordPiece). Each English sentence is counted once, however
   many languages it is paired with.
2. Languages are balanced by temperature sampling (as mBERT and XLM-R do):
   language l, with n_l sentences, gets probability q_l ∝ n_l^alpha, and its
   word counts are scaled by q_l / p_l (p_l = n_l / N). alpha=1 keeps the
   corpus as it is; alpha=0 gives every language the same weight; 0.3 is the
   default, so small languages are not starved of pieces.
3. Pieces are learned by BPE (as LaBSE's vocabulary was) with SentencePiece
   over the weighted word counts, and written as WordPiece: a word-initial
   piece as itself, a continuation piece with `##`. Every character kept
   appears in both forms, so no covered word falls back to [UNK].
"""

import collections
import os
import re
import tempfile
import time
import zlib
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm  # not `sentencepiece`: build_vocabulary has a flag of that name
import tensorflow as tf

from lealla_tf.parallel_corpus import (
    find_parallel_files,
    find_tatoeba_languages,
    language_sampling_probabilities,
    open_text,
    read_pairs,
    read_tatoeba,
)
from lealla_tf.progress import progress_bar

RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_SENTENCEPIECE_WORD_START = "\u2581"


def count_words(files, batch_size: int = 16384, progress: bool = True):
    """Per-language word counts of parallel files.

    Args:
        files: `ParallelFile`s (see `find_parallel_files`).
        batch_size: sentences per tokenizer call.
        progress: show a progress bar over files.

    Returns:
        (counts, sentences, stats): `counts[language]` is a Counter of UTF-8
        word bytes, `sentences[language]` the number of sentences seen (English
        de-duplicated), `stats` the pairs read and malformed lines skipped.
    """
    from lealla_tf.tokenizers.tensorflow_adapter import (  # noqa: PLC0415 - heavy
        basic_tokenizer,
    )

    splitter = basic_tokenizer(lower_case=False)
    counts = collections.defaultdict(collections.Counter)
    sentences = collections.Counter()
    seen_english = set()
    stats = {}

    def add(language, batch):
        for start in range(0, len(batch), batch_size):
            words = splitter.tokenize(tf.constant(batch[start:start + batch_size]))
            counts[language].update(words.flat_values.numpy().tolist())
        sentences[language] += len(batch)

    for parallel_file in progress_bar(files, desc="counting words", unit="file",
                                      disable=not progress):
        source, english = [], []
        for src, eng in read_pairs(parallel_file.path, stats):
            source.append(src)
            key = hash(eng)
            if key not in seen_english:
                seen_english.add(key)
                english.append(eng)
        add(parallel_file.language, source)
        add("eng", english)
    return counts, sentences, stats


def language_weights(sentences: dict[str, int], alpha: float) -> dict[str, float]:
    """Factor by which each language's counts are scaled: q_l / p_l.

    q_l = n_l^alpha / sum_k n_k^alpha, p_l = n_l / N.
    """
    total = sum(sentences.values())
    shares = language_sampling_probabilities(sentences, alpha)
    return {lang: share / (sentences[lang] / total) for lang, share in shares.items()}


def balanced_word_counts(counts, sentences, alpha: float, max_words: int) -> list[tuple]:
    """The `max_words` most frequent words after language balancing.

    Returns (word, weighted count) pairs, decoded, most frequent first.
    """
    weights = language_weights(sentences, alpha)
    total = collections.Counter()
    for language, counter in counts.items():
        weight = weights.get(language, 0.0)
        for word, count in counter.items():
            total[word] += count * weight
    words = []
    for word, count in total.most_common():
        text = word.decode("utf-8", "replace")
        if not text.strip() or "\t" in text or "\n" in text:
            continue
        words.append((text, count))
        if len(words) >= max_words:
            break
    return words


def _train_sentencepiece(**kwargs):
    """SentencePiece's trainer; its RuntimeError (a multi-line internal message)
    becomes a ValueError of one line, naming --vocab_size where it is too small."""
    try:
        spm.SentencePieceTrainer.train(minloglevel=2, **kwargs)
    except RuntimeError as error:
        too_small = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(error))
        if too_small:
            raise ValueError(
                f"--vocab_size={too_small.group(1)} is below the {too_small.group(2)} "
                "characters and special pieces the corpus needs at --character_coverage="
                f"{kwargs.get('character_coverage')}; raise --vocab_size or lower "
                "--character_coverage") from None
        message = " ".join(str(error).split())
        raise ValueError(f"SentencePiece could not learn the vocabulary: {message:.300}") from None


def learn_wordpiece(words: Sequence[tuple], vocab_size: int, character_coverage: float = 0.9999,
                    max_piece_length: int = 16, num_threads: int = 2) -> list[str]:
    """A WordPiece vocabulary of exactly `vocab_size` tokens (or all there are).

    BPE by SentencePiece over `words` (word, weight) with the pieces turned
    into WordPiece form; reserved tokens first, then every kept character in
    both forms (`c`, `##c`), then pieces in BPE merge order.
    """
    if vocab_size <= len(RESERVED_TOKENS):
        raise ValueError(f"vocab_size must exceed {len(RESERVED_TOKENS)}, got {vocab_size}")
    with tempfile.TemporaryDirectory() as tmp:
        tsv = os.path.join(tmp, "words.tsv")
        with open(tsv, "w", encoding="utf-8") as f:
            for word, weight in words:
                f.write(f"{word}\t{max(1, int(round(weight)))}\n")
        prefix = os.path.join(tmp, "bpe")
        _train_sentencepiece(
            input=tsv, input_format="tsv", model_prefix=prefix, model_type="bpe",
            vocab_size=vocab_size, hard_vocab_limit=False,
            character_coverage=character_coverage, normalization_rule_name="identity",
            max_sentencepiece_length=max_piece_length, split_digits=False,
            num_threads=num_threads, unk_id=0, bos_id=-1, eos_id=-1)
        processor = spm.SentencePieceProcessor(model_file=prefix + ".model")
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_unknown(i) or processor.is_control(i))]
    characters = sorted({p for p in pieces if len(p) == 1 and p != _SENTENCEPIECE_WORD_START})
    vocabulary = list(RESERVED_TOKENS)
    for character in characters:
        vocabulary += [character, "##" + character]
    if len(vocabulary) > vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} cannot hold the {len(characters)} characters kept at "
            f"character_coverage={character_coverage}; raise vocab_size or lower the coverage")
    seen = set(vocabulary)
    for piece in pieces:
        if piece.startswith(_SENTENCEPIECE_WORD_START):
            token = piece[1:]
        else:
            token = "##" + piece
        if not token or token in seen:
            continue
        seen.add(token)
        vocabulary.append(token)
        if len(vocabulary) == vocab_size:
            break
    return vocabulary


def read_sentences(files, progress: bool = True):
    """All sentences by language (English de-duplicated), for SentencePiece."""
    by_language = collections.defaultdict(list)
    seen_english = set()
    stats = {}
    for parallel_file in progress_bar(files, desc="reading", unit="file", disable=not progress):
        for source, english in read_pairs(parallel_file.path, stats):
            by_language[parallel_file.language].append(source)
            if hash(english) not in seen_english:
                seen_english.add(hash(english))
                by_language["eng"].append(english)
    return by_language, stats


def sample_sentences(by_language, alpha: float, num_sentences: int, seed: int = 0) -> list[str]:
    """`num_sentences` sentences drawn with temperature sampling over languages."""
    sizes = {lang: len(s) for lang, s in by_language.items() if s}
    weights = language_weights(sizes, alpha)
    total = sum(sizes.values())
    rng = np.random.default_rng(seed)
    sample = []
    for language, size in sorted(sizes.items()):
        share = weights[language] * size / total  # = q_l
        want = max(1, int(round(share * num_sentences)))
        index = rng.choice(size, size=want, replace=want > size)
        sample.extend(by_language[language][i] for i in index)
    rng.shuffle(sample)
    return sample


def learn_sentencepiece(sentences: Sequence[str], vocab_size: int, output_prefix: str,
                        model_type: str = "unigram", character_coverage: float = 0.9999,
                        num_threads: int = 2) -> str:
    """Trains a SentencePiece model with [PAD]=0, [UNK]=1, [CLS], [SEP], [MASK].

    Returns the path of the `.model` file.
    """
    _train_sentencepiece(
        sentence_iterator=iter(sentences), model_prefix=output_prefix, model_type=model_type,
        vocab_size=vocab_size, hard_vocab_limit=False, character_coverage=character_coverage,
        # sentencepiece refuses a sample size of 100 or less; 0 reads them all
        input_sentence_size=len(sentences) if len(sentences) > 100 else 0,
        num_threads=num_threads,
        pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
        control_symbols=["[CLS]", "[SEP]", "[MASK]"], max_sentence_length=16384)
    return output_prefix + ".model"


def vocabulary_report(vocab_file: str, tatoeba_dir: str, lower_case: bool = False) -> dict:
    """[UNK] rate and tokens per sentence on a Tatoeba directory, per language.

    Counts the tokens between [CLS] and [SEP] without truncation, with the
    package's own in-graph `Tokenizer`, for each language's non-English side
    and for all English sides together ("eng").
    """
    from lealla_tf.tokenizers.tokenizer import (  # noqa: PLC0415 - imports tensorflow_text
        Tokenizer,
    )

    tokenizer = Tokenizer(vocab_file, lower_case=lower_case)

    def measure(sentences):
        ids = tokenizer.tokenize(tf.constant(sentences))
        lengths = ids.row_lengths().numpy()
        unknown = tf.reduce_sum(tf.cast(tf.equal(ids, tokenizer.unk_id), tf.int64)).numpy()
        rows_with_unknown = tf.reduce_sum(tf.cast(tf.reduce_any(
            tf.equal(ids, tokenizer.unk_id), axis=1), tf.int64)).numpy()
        tokens = int(lengths.sum())
        return {"sentences": len(sentences), "tokens": tokens,
                "tokens_per_sentence": tokens / max(1, len(sentences)),
                "unk_rate": float(unknown) / max(1, tokens),
                "sentences_with_unk": float(rows_with_unknown) / max(1, len(sentences))}

    per_language, english = {}, []
    for language in find_tatoeba_languages(tatoeba_dir):
        source, eng = read_tatoeba(tatoeba_dir, language)
        per_language[language] = measure(source)
        english.extend(eng)
    result = {"languages": per_language, "eng": measure(english)}
    rates = [m["unk_rate"] for m in per_language.values()]
    lengths = [m["tokens_per_sentence"] for m in per_language.values()]
    result["average"] = {"unk_rate": sum(rates) / len(rates),
                         "tokens_per_sentence": sum(lengths) / len(lengths)}
    return result


def format_report(report: dict) -> str:
    """A per-language table of a `vocabulary_report`."""
    lines = [f"{'language':<10}{'sentences':>10}{'tokens/sent':>12}{'unk rate':>10}"
             f"{'sent w/ unk':>12}"]
    rows = sorted(report["languages"].items()) + [("eng", report["eng"])]
    for language, m in rows:
        lines.append(f"{language:<10}{m['sentences']:>10}{m['tokens_per_sentence']:>12.2f}"
                     f"{100 * m['unk_rate']:>9.2f}%{100 * m['sentences_with_unk']:>11.1f}%")
    avg = report["average"]
    lines.append(f"{'average':<10}{'':>10}{avg['tokens_per_sentence']:>12.2f}"
                 f"{100 * avg['unk_rate']:>9.2f}%")
    return "\n".join(lines)


def _require_pairs(stats: dict, files) -> None:
    if not stats.get("pairs"):
        raise ValueError("no well-formed pairs (source<TAB>English, both non-empty) in "
                         + ", ".join(f.path for f in files[:5])
                         + (f" and {len(files) - 5} more" if len(files) > 5 else "")
                         + f" ({stats.get('malformed', 0)} malformed lines)")


def _refuse_binary(files, probe_bytes: int = 1 << 16) -> None:
    """ValueError naming the first input whose first `probe_bytes` (decompressed)
    hold a NUL byte: a binary file, whose "pairs" would be garbage pieces."""
    for parallel_file in files:
        try:
            with open_text(parallel_file.path) as f:
                head = f.read(probe_bytes)
        except (OSError, EOFError, ValueError, zlib.error):
            continue  # a corrupt .gz: read_pairs names it when reading
        if "\0" in head:
            raise ValueError(f"--input {parallel_file.path} is a binary file, not text "
                             "(pairs are source<TAB>English lines, plain or .gz)")


def check_output(output: str, sentencepiece: bool = False) -> None:
    """ValueError naming --output now, before a vocabulary is learned, when the
    file it names is a directory."""
    written = output
    if sentencepiece and not output.endswith(".model"):
        written = output + ".model"
    for path in dict.fromkeys((output, written)):
        if os.path.isdir(path):
            raise ValueError(f"--output={output}: {path} is a directory; pass a file path")


def build_vocabulary(inputs, vocab_size: int, output: str, sentencepiece: bool = False,
                     alpha: float = 0.3, max_words: int = 2_000_000,
                     sentencepiece_sentences: int = 2_000_000,
                     character_coverage: float = 0.9999, progress: bool = True) -> dict:
    """Learns a vocabulary from parallel TSV files and writes it to `output`.

    Returns a summary dict (files, languages, pairs, malformed lines skipped,
    vocabulary size, seconds).
    """
    start = time.time()
    if vocab_size <= len(RESERVED_TOKENS):
        raise ValueError(f"--vocab_size must exceed {len(RESERVED_TOKENS)}, got {vocab_size}")
    check_output(output, sentencepiece)
    files = find_parallel_files(inputs)
    _refuse_binary(files)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    if sentencepiece:
        by_language, stats = read_sentences(files, progress)
        _require_pairs(stats, files)
        languages = len(by_language)
        sample = sample_sentences(by_language, alpha, sentencepiece_sentences)
        prefix = output[:-len(".model")] if output.endswith(".model") else output
        output = learn_sentencepiece(sample, vocab_size, prefix,
                                     character_coverage=character_coverage)
        size = spm.SentencePieceProcessor(model_file=output).get_piece_size()
    else:
        counts, sentences, stats = count_words(files, progress=progress)
        _require_pairs(stats, files)
        languages = len(sentences)
        words = balanced_word_counts(counts, sentences, alpha, max_words)
        vocabulary = learn_wordpiece(words, vocab_size, character_coverage)
        with open(output, "w", encoding="utf-8") as f:
            f.write("\n".join(vocabulary) + "\n")
        size = len(vocabulary)
    return {"output": output, "files": len(files), "languages": languages,
            "pairs": stats.get("pairs", 0), "malformed_lines_skipped": stats.get("malformed", 0),
            "vocab_size": size, "kind": "sentencepiece" if sentencepiece else "wordpiece",
            "alpha": alpha, "seconds": time.time() - start}
