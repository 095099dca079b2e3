"""Finding and reading parallel-text files (`xx<TAB>en` TSV, optionally gzip'd).

A file's language comes from its name, as in ../shared/data/parallel:
`<code>-eng.tsv.gz`, where the code may carry a script, region or translation
suffix (`aze-Latn`, `ber_Latn`, `deu-deu1912`, `pt-BR`). Two-letter ISO 639-1
codes are mapped to ISO 639-3 so that one language from two corpora is one
language for sampling and reports.

May import: nothing else of lealla_tf.
"""

import dataclasses
import gzip
import io
import os
import re
from typing import Dict, Iterator, List, Sequence, Tuple

import tensorflow as tf

# ISO 639-1 -> 639-3 for the two-letter codes TICO-19 and others use.
ISO_639_1_TO_3 = {
    "af": "afr", "am": "amh", "ar": "ara", "az": "aze", "be": "bel", "bg": "bul",
    "bn": "ben", "bs": "bos", "ca": "cat", "cs": "ces", "cy": "cym", "da": "dan",
    "de": "deu", "el": "ell", "en": "eng", "eo": "epo", "es": "spa", "et": "est",
    "eu": "eus", "fa": "fas", "fi": "fin", "fr": "fra", "ga": "gle", "gl": "glg",
    "gu": "guj", "ha": "hau", "he": "heb", "hi": "hin", "hr": "hrv", "hu": "hun",
    "hy": "hye", "id": "ind", "is": "isl", "it": "ita", "ja": "jpn", "jv": "jav",
    "ka": "kat", "kk": "kaz", "km": "khm", "kn": "kan", "ko": "kor", "kr": "kau",
    "ku": "kur", "ky": "kir", "lg": "lug", "ln": "lin", "lo": "lao", "lt": "lit",
    "lv": "lav", "mg": "mlg", "mk": "mkd", "ml": "mal", "mn": "mon", "mr": "mar",
    "ms": "msa", "mt": "mlt", "my": "mya", "ne": "nep", "nl": "nld", "no": "nor",
    "om": "orm", "pa": "pan", "pl": "pol", "ps": "pus", "pt": "por", "ro": "ron",
    "ru": "rus", "rw": "kin", "si": "sin", "sk": "slk", "sl": "slv", "so": "som",
    "sq": "sqi", "sr": "srp", "sv": "swe", "sw": "swa", "ta": "tam", "te": "tel",
    "tg": "tgk", "th": "tha", "ti": "tir", "tl": "tgl", "tr": "tur", "uk": "ukr",
    "ur": "urd", "uz": "uzb", "vi": "vie", "xh": "xho", "yo": "yor", "zh": "zho",
    "zu": "zul",
}

_TSV_SUFFIXES = (".tsv.gz", ".tsv")
# Inside a directory only files named like pair files are taken, so that a
# COUNTS.tsv or README beside them is not read as sentence pairs.
_PAIR_FILE_SUFFIXES = ("-eng.tsv.gz", "-eng.tsv", "_eng.tsv.gz", "_eng.tsv")


@dataclasses.dataclass(frozen=True)
class ParallelFile:
    """One TSV file of pairs and the language of its first column."""

    path: str
    language: str


def language_of(path: str) -> str:
    """Language code of a parallel or Tatoeba file, from its name.

    `ntrex/aze-Latn-eng.tsv.gz` -> "aze", `tico19/pt-BR-eng.tsv.gz` -> "por",
    `tatoeba.afr-eng.afr` -> "afr".
    """
    name = os.path.basename(path)
    match = re.match(r"^tatoeba\.([^.]+)-eng\.", name)
    if match:
        code = match.group(1)
    else:
        for suffix in _TSV_SUFFIXES + (".gz",):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        if name.endswith("-eng") or name.endswith("_eng"):
            name = name[:-4]
        code = re.split(r"[-_.]", name)[0]
    code = code.lower()
    return ISO_639_1_TO_3.get(code, code)


def find_parallel_files(patterns: Sequence[str]) -> List[ParallelFile]:
    """Expands files, directories (searched recursively) and globs to TSV files.

    In a directory, the files named `<code>-eng.tsv[.gz]` are taken; a file or
    glob given explicitly is taken whatever its name.

    Raises FileNotFoundError naming each pattern that matched nothing.
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p]
    found, empty = [], []
    for pattern in patterns:
        if tf.io.gfile.isdir(pattern):
            matches = [os.path.join(root, name)
                       for root, _, names in tf.io.gfile.walk(pattern)
                       for name in names if name.endswith(_PAIR_FILE_SUFFIXES)]
        else:
            matches = tf.io.gfile.glob(pattern)
        if not matches:
            empty.append(pattern)
        found.extend(matches)
    if empty:
        raise FileNotFoundError(f"no TSV files found for: {', '.join(empty)}")
    return [ParallelFile(path, language_of(path)) for path in sorted(set(found))]


def open_text(path: str):
    """A text reader for a plain or gzip'd UTF-8 file (undecodable bytes replaced)."""
    if "://" in path:
        # Remote file systems (gs://, s3://) through TensorFlow; GFile is not an
        # io.RawIOBase, so read it whole (parallel files are shards of MBs).
        with tf.io.gfile.GFile(path, "rb") as f:
            raw = io.BytesIO(f.read())
    else:
        raw = open(path, "rb")
    if path.endswith(".gz"):
        raw = gzip.GzipFile(fileobj=raw)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n")


def _lines_naming(path: str, handle):
    """The lines of `handle`; a corrupt compressed file raises ValueError naming `path`."""
    import zlib

    try:
        yield from handle
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"{path}: unreadable or corrupt file ({error})") from None


def read_pairs(path: str, stats: dict = None) -> Iterator[Tuple[str, str]]:
    """Yields `(source, english)` for each well-formed line of a TSV file.

    A line without a tab or with an empty side is skipped and counted in
    `stats["malformed"]` (if `stats` is given), never silently lost.
    """
    with open_text(path) as f:
        for line in _lines_naming(path, f):
            source, tab, target = line.rstrip("\n").rstrip("\r").partition("\t")
            if not tab or not source.strip() or not target.strip():
                if stats is not None:
                    stats["malformed"] = stats.get("malformed", 0) + 1
                continue
            if stats is not None:
                stats["pairs"] = stats.get("pairs", 0) + 1
            yield source, target


def find_tatoeba_languages(tatoeba_dir: str) -> List[str]:
    """Languages with both `tatoeba.xxx-eng.xxx` and `.eng` files, sorted.

    A language with one file of the two is refused (ValueError naming the
    missing file), never dropped: the average over the others would change
    without a word.
    """
    found = {}
    for path in tf.io.gfile.glob(os.path.join(tatoeba_dir, "tatoeba.*-eng.*")):
        match = re.match(r"^tatoeba\.([^.]+)-eng\.([^.]+)$", os.path.basename(path))
        if match and match.group(2) in (match.group(1), "eng"):
            found.setdefault(match.group(1), set()).add(match.group(2))
    incomplete = [f"tatoeba.{code}-eng.{missing} is missing (tatoeba.{code}-eng.{present} "
                  "is there)"
                  for code, sides in sorted(found.items())
                  for missing in sorted({code, "eng"} - sides) for present in sides]
    if incomplete:
        more = f"; and {len(incomplete) - 5} more" if len(incomplete) > 5 else ""
        raise ValueError(f"incomplete Tatoeba languages in {tatoeba_dir}: "
                         + "; ".join(incomplete[:5]) + more
                         + " (add the missing files or remove the others)")
    if not found:
        raise FileNotFoundError(
            f"no Tatoeba files (tatoeba.<xxx>-eng.<xxx> and .eng) in {tatoeba_dir}")
    return sorted(found)


def read_tatoeba(tatoeba_dir: str, language: str) -> Tuple[List[str], List[str]]:
    """The line-aligned (xx sentences, English sentences) of one language."""
    def lines(path):
        with open_text(path) as f:
            return [line.rstrip("\n").rstrip("\r") for line in f]

    source = lines(os.path.join(tatoeba_dir, f"tatoeba.{language}-eng.{language}"))
    english = lines(os.path.join(tatoeba_dir, f"tatoeba.{language}-eng.eng"))
    if len(source) != len(english):
        raise ValueError(f"Tatoeba {language}: {len(source)} source lines but "
                         f"{len(english)} English lines")
    return source, english


def language_sampling_probabilities(sizes: Dict[str, int], alpha: float) -> Dict[str, float]:
    """q_l = n_l^alpha / sum_k n_k^alpha (XLM-R / mBERT temperature sampling).

    The one formula behind data mixing in training, the language balance of
    the vocabulary and the main job's sample. Languages with no data get none.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"language_alpha must be in [0, 1], got {alpha}")
    powered = {lang: n ** alpha for lang, n in sizes.items() if n > 0}
    total = sum(powered.values())
    if not total:
        raise ValueError("no language has any pairs")
    return {lang: p / total for lang, p in powered.items()}


def sample_pairs(files: Sequence[ParallelFile], num_pairs: int, output_dir: str,
                 alpha: float = 0.3, seed: int = 0, exclude: Sequence[str] = (),
                 min_per_language: int = 1) -> dict:
    """Writes a language-balanced sample of pairs as `<lang>-eng.tsv.gz` files.

    Languages get shares q_l ∝ n_l^alpha (temperature sampling), each at
    least `min_per_language` pairs and at most all it has; pairs are drawn
    without replacement. Pairs with a side in `exclude` (a set of sentences)
    are never drawn.

    Returns {language: pairs written}.
    """
    import collections
    import gzip as gzip_module
    import os as os_module

    import numpy as np

    excluded = set(exclude)
    by_language = collections.defaultdict(list)
    for parallel_file in files:
        for source, english in read_pairs(parallel_file.path):
            if source not in excluded and english not in excluded:
                by_language[parallel_file.language].append((source, english))
    sizes = {lang: len(pairs) for lang, pairs in by_language.items() if pairs}
    shares = language_sampling_probabilities(sizes, alpha)
    rng = np.random.default_rng(seed)
    os_module.makedirs(output_dir, exist_ok=True)
    written = {}
    for language in sorted(sizes):
        want = int(round(num_pairs * shares[language]))
        want = min(sizes[language], max(min_per_language, want))
        chosen = rng.choice(sizes[language], size=want, replace=False)
        lines = "".join(f"{by_language[language][i][0]}\t{by_language[language][i][1]}\n"
                        for i in sorted(chosen))
        with gzip_module.open(os_module.path.join(output_dir, f"{language}-eng.tsv.gz"),
                              "wt", encoding="utf-8") as f:
            f.write(lines)
        written[language] = want
    return written
