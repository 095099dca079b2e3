"""Finding and reading parallel-text files (`xx<TAB>en` TSV, optionally gzip'd).

A file's language comes from its name, as in ../shared/data/parallel:
`<code>-eng.tsv.gz`, where the code may carry a script, region or translation
suffix (`aze-Latn`, `ber_Latn`, `deu-deu1912`, `pt-BR`). Two-letter ISO 639-1
codes are mapped to ISO 639-3 so that one language from two corpora is one
language for sampling and reports; a name that gives no code is refused.

No line is lost or mended without a word: `read_pairs` yields the well-formed
pairs and counts every other line by kind, per file (`LineCounts`; over many
files `CorpusCounts`, which `sample_pairs` fills for the main job's summary), and
refuses a file with no well-formed pair (`check_pair_file` tells without reading
it all). What a well-formed line is, is defined once here (`parse_line`); the
training stream keeps the same rule. Faults in a user's file are
`DataFileError`s (a ValueError) naming the file.

Importing it loads no TensorFlow (`_gfile`): `lealla_tf.recipe.settings` and
the evaluation sets import it, and `lealla-recipe --help` must answer before
TensorFlow loads (tests/cli/test_scripts.py).

May import: nothing else of lealla_tf.
"""

import collections
import dataclasses
import gzip
import io
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

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
# A language code as a file name gives it: ISO 639 (2 or 3 letters), or a longer
# name such as `toki`; a letter first, ASCII letters and digits only.
_LANGUAGE_CODE = re.compile(r"^[a-z][a-z0-9]{1,7}$")
# Inside a directory only files named like pair files are taken, so that a
# COUNTS.tsv or README beside them is not read as sentence pairs.
_PAIR_FILE_SUFFIXES = ("-eng.tsv.gz", "-eng.tsv", "_eng.tsv.gz", "_eng.tsv")


def _gfile():
    """TensorFlow's file system (local, gs://, s3://), loaded on first use."""
    import tensorflow as tf  # noqa: PLC0415 - heavy; importing this module stays light

    return tf.io.gfile


class DataFileError(ValueError):
    """A user's data file that cannot be used as it is. The message names the
    file (and the line, where one is at fault); `path` and `line` say the same."""

    def __init__(self, message: str, path: str, line: int | None = None):
        super().__init__(message)
        self.path, self.line = path, line


# === What a corpus line is: the one definition every reader of pair files keeps ===
# A line is the bytes up to a line feed, every carriage return in them dropped (as
# TensorFlow's TextLineDataset, the training stream's reader, drops them all). It is
# a pair when it is UTF-8, holds exactly one tab, and neither side is whitespace
# alone; any other line is skipped as the first kind of `LINE_CHECKS` it is.
# `parse_line` is the rule in Python (`read_pairs`: the pair counts, the main job's
# sample); `lealla_tf.train.data.parse_lines` is it in TensorFlow ops (the stream).

# The kinds of line skipped, in the order they are reported, and how.
SKIPPED_KINDS = {"no_tab": "with no tab", "extra_columns": "with more than two columns",
                 "empty_side": "with an empty side", "not_utf8": "not UTF-8",
                 "blank": "blank"}
# The same kinds in the order a line is checked: its kind is the first that holds.
LINE_CHECKS = ("not_utf8", "blank", "no_tab", "extra_columns", "empty_side")
SEPARATOR = "\t"
# What `str.strip()` strips (every `str.isspace()` character; none lies beyond the
# Basic Multilingual Plane): a side of these alone is empty.
WHITESPACE = "".join(chr(code) for code in range(0x10000) if chr(code).isspace())


class Line(NamedTuple):
    """A line read (`parse_line`): `kind` None for a pair, else its kind, sides empty."""

    kind: str | None
    source: str = ""
    english: str = ""


def parse_line(raw: bytes) -> Line:
    """The corpus line `raw` (its bytes, with or without the line feed) as a pair,
    or the kind of line it is: the rule above, checked in `LINE_CHECKS` order."""
    try:
        line = raw.replace(b"\r", b"").rstrip(b"\n").decode("utf-8")
    except UnicodeDecodeError:
        return Line("not_utf8")
    if not line.strip():
        return Line("blank")
    columns = line.split(SEPARATOR)
    if len(columns) == 1:
        return Line("no_tab")
    if len(columns) > 2:
        return Line("extra_columns")
    if not columns[0].strip() or not columns[1].strip():
        return Line("empty_side")
    return Line(None, columns[0], columns[1])


@dataclasses.dataclass
class LineCounts:
    """What `read_pairs` did with the lines of one file: pairs read, and each kind
    of line skipped (`SKIPPED_KINDS`) with the number of its first line."""

    path: str
    pairs: int = 0
    skipped_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    first_line: dict[str, int] = dataclasses.field(default_factory=dict)

    def skip(self, kind: str, line: int) -> None:
        self.skipped_by_kind[kind] = self.skipped_by_kind.get(kind, 0) + 1
        self.first_line.setdefault(kind, line)

    @property
    def skipped(self) -> int:
        return sum(self.skipped_by_kind.values())

    def as_dict(self) -> dict[str, int]:
        """{"pairs": n, kind: n for each kind skipped at least once}."""
        return {"pairs": self.pairs, **{kind: self.skipped_by_kind[kind]
                                        for kind in SKIPPED_KINDS if kind in self.skipped_by_kind}}

    def describe(self) -> str:
        """"3 lines skipped: 2 with no tab (line 1), 1 blank (line 4)", or "no line skipped"."""
        if not self.skipped:
            return "no line skipped"
        return (f"{_lines(self.skipped)} skipped: "
                + ", ".join(f"{self.skipped_by_kind[kind]} {SKIPPED_KINDS[kind]} "
                            f"(line {self.first_line[kind]})"
                            for kind in SKIPPED_KINDS if kind in self.skipped_by_kind))


class CorpusCounts:
    """`LineCounts` of each file of one read over many files (`sample_pairs`'s
    `line_counts`): `files` {path: LineCounts}, totals, and `as_dict()` for a
    report (JSON), `describe()` for a log or summary line."""

    def __init__(self):
        self.files: dict[str, LineCounts] = {}

    def file(self, path: str) -> LineCounts:
        """The counts of `path`, new (and kept) on first use."""
        return self.files.setdefault(path, LineCounts(path))

    @property
    def pairs(self) -> int:
        return sum(counts.pairs for counts in self.files.values())

    @property
    def skipped(self) -> int:
        return sum(counts.skipped for counts in self.files.values())

    def as_dict(self) -> dict:
        """{"files", "pairs", "skipped_lines", "skipped_by_kind": {kind: n},
        "files_with_skipped_lines": {path: {kind: n}}} (kinds skipped at least once)."""
        by_kind = {}
        for counts in self.files.values():
            for kind, number in counts.skipped_by_kind.items():
                by_kind[kind] = by_kind.get(kind, 0) + number
        return {"files": len(self.files), "pairs": self.pairs, "skipped_lines": self.skipped,
                "skipped_by_kind": {kind: by_kind[kind] for kind in SKIPPED_KINDS
                                    if kind in by_kind},
                "files_with_skipped_lines": {
                    path: {kind: number for kind, number in counts.as_dict().items()
                           if kind != "pairs"}
                    for path, counts in sorted(self.files.items()) if counts.skipped}}

    def describe(self) -> str:
        return describe_corpus_counts(self.as_dict())


def _lines(number: int) -> str:
    return f"{number:,} line{'' if number == 1 else 's'}"


def describe_corpus_counts(record: dict, most_files: int = 5) -> str:
    """One line of `CorpusCounts.as_dict()`'s record: "corpus: 40 pairs from 2 files;
    3 lines skipped in 1 file: 2 with no tab, 1 not UTF-8 (fra-eng.tsv: 3)"."""
    files = record["files"]
    head = f"corpus: {record['pairs']:,} pairs from {files:,} file{'' if files == 1 else 's'}"
    if not record["skipped_lines"]:
        return head + "; no line skipped"
    named = record["files_with_skipped_lines"]
    worst = sorted(named, key=lambda path: (-sum(named[path].values()), path))
    listed = ", ".join(f"{os.path.basename(path)}: {sum(named[path].values()):,}"
                       for path in worst[:most_files])
    more = f", and {len(worst) - most_files} more" if len(worst) > most_files else ""
    return (f"{head}; {_lines(record['skipped_lines'])} skipped in {len(named):,} "
            f"file{'' if len(named) == 1 else 's'}: "
            + ", ".join(f"{number:,} {SKIPPED_KINDS.get(kind, kind)}"
                        for kind, number in record["skipped_by_kind"].items())
            + f" ({listed}{more})")


@dataclasses.dataclass(frozen=True)
class ParallelFile:
    """One TSV file of pairs and the language of its first column."""

    path: str
    language: str


def language_of(path: str) -> str:
    """Language code of a parallel or Tatoeba file, from its name.

    `ntrex/aze-Latn-eng.tsv.gz` -> "aze", `tico19/pt-BR-eng.tsv.gz` -> "por",
    `tatoeba.afr-eng.afr` -> "afr". A name that gives no code (`..-eng.tsv.gz`,
    `12-eng.tsv`) raises `DataFileError` naming the file.
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
    if not _LANGUAGE_CODE.match(code):
        raise DataFileError(
            f"{path}: the file name gives no language code ({code!r}): name a parallel file "
            "<code>-eng.tsv[.gz], <code> an ISO 639 code such as deu, fra or pt-BR", path)
    return ISO_639_1_TO_3.get(code, code)


def find_parallel_files(patterns: Sequence[str]) -> list[ParallelFile]:
    """Expands files, directories (searched recursively) and globs to TSV files.

    In a directory, the files named `<code>-eng.tsv[.gz]` are taken; a file or
    glob given explicitly is taken whatever its name.

    Raises FileNotFoundError naming each pattern that matched nothing, and
    DataFileError naming a file whose name gives no language code.
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p]
    found, empty = [], []
    for pattern in patterns:
        if _gfile().isdir(pattern):
            matches = [os.path.join(root, name)
                       for root, _, names in _gfile().walk(pattern)
                       for name in names if name.endswith(_PAIR_FILE_SUFFIXES)]
        else:
            matches = _gfile().glob(pattern)
        if not matches:
            empty.append(pattern)
        found.extend(matches)
    if empty:
        raise FileNotFoundError(f"no TSV files found for: {', '.join(empty)}")
    return [ParallelFile(path, language_of(path)) for path in sorted(set(found))]


def open_bytes(path: str):
    """A binary reader for a plain or gzip'd file, local or remote; closing it
    closes the file."""
    if "://" not in path:
        return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    # Remote file systems (gs://, s3://) through TensorFlow; GFile is not an
    # io.RawIOBase, so read it whole (parallel files are shards of MBs).
    with _gfile().GFile(path, "rb") as f:
        raw = io.BytesIO(f.read())
    return gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw


def open_text(path: str):
    """A text reader for a plain or gzip'd UTF-8 file (undecodable bytes replaced;
    `read_pairs` skips and counts such lines instead)."""
    return io.TextIOWrapper(open_bytes(path), encoding="utf-8", errors="replace",
                            newline="\n")


def _lines_naming(path: str, handle):
    """The lines of `handle`; a corrupt compressed file raises DataFileError naming `path`."""
    try:
        yield from handle
    except (OSError, EOFError, zlib.error) as error:
        raise DataFileError(f"{path}: unreadable or corrupt file ({error})", path) from None


def read_pairs(path: str, stats: dict | None = None,
               counts: LineCounts | None = None) -> Iterator[tuple[str, str]]:
    """Yields `(source, english)` for each well-formed line of a TSV file:
    UTF-8, exactly one tab, neither side blank (`parse_line`: a line ends at a
    LF, and every CR in it is dropped).

    Every other line is skipped and counted by kind (`SKIPPED_KINDS`: no tab,
    more than two columns, an empty side, not UTF-8, blank) in `counts`, with
    its first line number; none is repaired. `stats` (a dict, kept across
    files) gets the totals `pairs` and `malformed`. A file with no well-formed
    pair raises `DataFileError` naming it and what its lines were.
    """
    counts = counts if counts is not None else LineCounts(path)
    before = counts.pairs, counts.skipped
    number = 0
    with open_bytes(path) as f:
        for number, raw in enumerate(_lines_naming(path, f), 1):
            line = parse_line(raw)
            if line.kind:
                counts.skip(line.kind, number)
                continue
            counts.pairs += 1
            yield line.source, line.english
    pairs, skipped = counts.pairs - before[0], counts.skipped - before[1]
    if stats is not None:
        stats["pairs"] = stats.get("pairs", 0) + pairs
        if skipped:
            stats["malformed"] = stats.get("malformed", 0) + skipped
    if not pairs:
        raise DataFileError(f"{path}: no well-formed pairs (source<TAB>English, both "
                            "non-empty): " + (counts.describe() if number else
                                              "the file is empty"), path)


def check_pair_file(path: str) -> None:
    """Raises `DataFileError` (naming `path` and what its lines were) unless the
    file holds a well-formed pair; reads it only up to its first one."""
    pairs = read_pairs(path)
    try:
        next(pairs)
    finally:
        pairs.close()


def find_tatoeba_languages(tatoeba_dir: str) -> list[str]:
    """Languages with both `tatoeba.xxx-eng.xxx` and `.eng` files, sorted.

    A language with one file of the two is refused (ValueError naming the
    missing file), never dropped: the average over the others would change
    without a word.
    """
    found = {}
    for path in _gfile().glob(os.path.join(tatoeba_dir, "tatoeba.*-eng.*")):
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


def read_tatoeba(tatoeba_dir: str, language: str) -> tuple[list[str], list[str]]:
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


def language_sampling_probabilities(sizes: dict[str, int], alpha: float) -> dict[str, float]:
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
                 min_per_language: int = 1,
                 line_counts: CorpusCounts | None = None) -> dict:
    """Writes a language-balanced sample of pairs as `<lang>-eng.tsv.gz` files.

    Languages get shares q_l ∝ n_l^alpha (temperature sampling), each at
    least `min_per_language` pairs and at most all it has; pairs are drawn
    without replacement. Pairs with a side in `exclude` (a set of sentences)
    are never drawn. Each file's lines are counted in `line_counts` (what was
    read and skipped, `CorpusCounts`); a file with no well-formed pair raises
    `DataFileError` naming it (`read_pairs`).

    Returns {language: pairs written}.
    """
    excluded = set(exclude)
    line_counts = line_counts if line_counts is not None else CorpusCounts()
    by_language = collections.defaultdict(list)
    for parallel_file in files:
        for source, english in read_pairs(parallel_file.path,
                                          counts=line_counts.file(parallel_file.path)):
            if source not in excluded and english not in excluded:
                by_language[parallel_file.language].append((source, english))
    sizes = {lang: len(pairs) for lang, pairs in by_language.items() if pairs}
    shares = language_sampling_probabilities(sizes, alpha)
    rng = np.random.default_rng(seed)
    os.makedirs(output_dir, exist_ok=True)
    written = {}
    for language in sorted(sizes):
        want = int(round(num_pairs * shares[language]))
        want = min(sizes[language], max(min_per_language, want))
        chosen = rng.choice(sizes[language], size=want, replace=False)
        lines = "".join(f"{by_language[language][i][0]}\t{by_language[language][i][1]}\n"
                        for i in sorted(chosen))
        with gzip.open(os.path.join(output_dir, f"{language}-eng.tsv.gz"), "wt",
                       encoding="utf-8") as f:
            f.write(lines)
        written[language] = want
    return written
