"""Finding, naming and reading parallel and Tatoeba files."""

import pytest
from conftest import write_pairs

from lealla_tf.parallel_corpus import (
    find_parallel_files,
    find_tatoeba_languages,
    language_of,
    read_pairs,
    read_tatoeba,
)


@pytest.mark.parametrize("path,language", [
    ("parallel/ntrex/aze-Latn-eng.tsv.gz", "aze"),
    ("parallel/tico19/pt-BR-eng.tsv.gz", "por"),
    ("parallel/tico19/ti_ER-eng.tsv.gz", "tir"),
    ("parallel/tatoeba_challenge/ber_Latn-eng.tsv.gz", "ber"),
    ("parallel/ebible/deu-deu1912-eng.tsv.gz", "deu"),
    ("x/zh-eng.tsv", "zho"),
    ("tatoeba_dev/tatoeba.afr-eng.afr", "afr"),
    ("tatoeba_dev/tatoeba.cmn-eng.eng", "cmn"),
])
def test_language_of(path, language):
    assert language_of(path) == language


def test_find_files_in_directories_skips_non_pair_files(tiny_parallel_dir):
    files = find_parallel_files([tiny_parallel_dir])
    assert sorted(f.language for f in files) == ["cmn", "deu", "fra", "rus"]
    assert all(f.path.endswith("-eng.tsv.gz") for f in files)


def test_missing_inputs_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        find_parallel_files([str(tmp_path / "nothing-here*.tsv")])


def test_read_pairs_counts_malformed_lines(tmp_path):
    path = write_pairs(tmp_path, "deu", [("a", "b")], gz=False)
    with open(path, "a", encoding="utf-8") as f:
        f.write("no tab here\n\tempty source\nempty target\t\nc\td\n")
    with open(path, "ab") as f:
        f.write(b"\xff bad bytes\tstill english\n")
    stats = {}
    pairs = list(read_pairs(path, stats))
    # Bytes that are not UTF-8 were replaced by U+FFFD and the pair kept; skipped now.
    assert pairs == [("a", "b"), ("c", "d")]
    assert stats == {"pairs": 2, "malformed": 4}


def test_tatoeba_reading(tiny_tatoeba_dir, tmp_path):
    assert find_tatoeba_languages(tiny_tatoeba_dir) == ["cmn", "deu", "fra", "rus"]
    source, english = read_tatoeba(tiny_tatoeba_dir, "deu")
    assert source[0] == "Der Hund ist nett." and english[0] == "The dog is nice."
    with pytest.raises(FileNotFoundError):
        find_tatoeba_languages(str(tmp_path))
    (tmp_path / "tatoeba.xyz-eng.xyz").write_text("a\nb\n")
    (tmp_path / "tatoeba.xyz-eng.eng").write_text("a\n")
    with pytest.raises(ValueError, match="2 source lines but 1 English"):
        read_tatoeba(str(tmp_path), "xyz")


def test_sample_pairs_balances_and_excludes(tmp_path):
    from lealla_tf.parallel_corpus import sample_pairs

    write_pairs(tmp_path / "in", "deu", [(f"de {i}", f"en {i}") for i in range(900)])
    write_pairs(tmp_path / "in", "xho", [(f"xh {i}", f"en x{i}") for i in range(100)])
    files = find_parallel_files([str(tmp_path / "in")])
    counts = sample_pairs(files, 200, str(tmp_path / "out"), alpha=0.0, exclude={"xh 3"})
    assert counts == {"deu": 100, "xho": 99}  # uniform shares; xho is capped by what it has
    pairs = list(read_pairs(str(tmp_path / "out" / "xho-eng.tsv.gz")))
    assert len(pairs) == 99 and ("xh 3", "en x3") not in pairs
    assert len(set(pairs)) == 99


# === Issue 51, item 4: no line of a user's corpus vanishes without a count ===

def write_lines(path, raw: bytes, gz: bool = False):
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return str(path)


def test_every_line_skipped_is_counted_by_kind_per_file(tmp_path):
    """Lines with no tab vanished, a third column rode into the English side and
    bytes that are not UTF-8 became U+FFFD, all without a count."""
    from lealla_tf.parallel_corpus import LineCounts

    path = write_lines(tmp_path / "deu-eng.tsv",
                       b"a\tb\nno tab here\n\tempty source\n\nx\ty\tz\n"
                       b"\xff bad bytes\tstill english\nc\td\r\n")
    counts = LineCounts(path)
    assert list(read_pairs(path, counts=counts)) == [("a", "b"), ("c", "d")]
    assert counts.as_dict() == {"pairs": 2, "no_tab": 1, "extra_columns": 1,
                                "empty_side": 1, "not_utf8": 1, "blank": 1}
    assert counts.skipped == 5 and counts.first_line["not_utf8"] == 6
    assert counts.describe() == ("5 lines skipped: 1 with no tab (line 2), 1 with more than "
                                 "two columns (line 5), 1 with an empty side (line 3), 1 not "
                                 "UTF-8 (line 6), 1 blank (line 4)")


def test_a_third_column_is_not_carried_into_the_pair(tmp_path):
    path = write_lines(tmp_path / "fra-eng.tsv.gz", b"chat\tcat\nchien\tdog\t0.93\n", gz=True)
    assert list(read_pairs(path)) == [("chat", "cat")]


def test_bytes_that_are_not_utf8_are_skipped_not_replaced(tmp_path):
    path = write_lines(tmp_path / "fra-eng.tsv", b"chat\tcat\nch\xe9ri\tdarling\n")
    stats = {}
    assert list(read_pairs(path, stats)) == [("chat", "cat")]
    assert stats == {"pairs": 1, "malformed": 1}


def test_a_file_with_no_usable_line_is_refused_naming_it(tmp_path):
    """A main job on files whose lines had no tab exited 0, trained on the rest."""
    from lealla_tf.parallel_corpus import DataFileError, sample_pairs

    write_pairs(tmp_path / "in", "deu", [(f"de {i}", f"en {i}") for i in range(50)])
    bad = write_lines(tmp_path / "in" / "fra-eng.tsv.gz",
                      b"no tab\nstill none\nchien\tdog\t1\n", gz=True)
    with pytest.raises(DataFileError) as raised:
        list(read_pairs(bad))
    assert raised.value.path == bad
    assert str(raised.value) == (
        f"{bad}: no well-formed pairs (source<TAB>English, both non-empty): 3 lines "
        "skipped: 2 with no tab (line 1), 1 with more than two columns (line 3)")
    with pytest.raises(DataFileError, match="fra-eng.tsv.gz: no well-formed pairs"):
        sample_pairs(find_parallel_files([str(tmp_path / "in")]), 20, str(tmp_path / "out"))
    empty = write_lines(tmp_path / "empty" / "ita-eng.tsv", b"")
    with pytest.raises(DataFileError, match=f"{empty}: no well-formed pairs .*: the file is "
                                            "empty"):
        list(read_pairs(empty))


@pytest.mark.parametrize("name", ["..-eng.tsv.gz", "-eng.tsv", "_eng.tsv.gz", "12-eng.tsv",
                                  "x-eng.tsv"])
def test_a_file_whose_name_gives_no_language_is_refused_naming_it(tmp_path, name):
    """`..-eng.tsv.gz` became language "", sampled and reported as such."""
    from lealla_tf.parallel_corpus import DataFileError

    path = write_lines(tmp_path / "in" / name, b"a\tb\n")
    for pattern in (str(tmp_path / "in"), path):
        with pytest.raises(DataFileError, match="no language code") as raised:
            find_parallel_files([pattern])
        assert raised.value.path == path and name in str(raised.value)


def test_sample_pairs_counts_what_it_skipped_in_each_file(tmp_path):
    from lealla_tf.parallel_corpus import CorpusCounts, sample_pairs

    good = write_pairs(tmp_path / "in", "deu", [(f"de {i}", f"en {i}") for i in range(30)])
    odd = write_lines(tmp_path / "in" / "fra-eng.tsv",
                      "".join(f"fr {i}\ten {i}\n" for i in range(10)).encode()
                      + b"no tab\nfr x\ten x\textra\n\xfe\tbad\n")
    corpus = CorpusCounts()
    written = sample_pairs(find_parallel_files([str(tmp_path / "in")]), 20,
                           str(tmp_path / "out"), line_counts=corpus)
    assert sum(written.values()) >= 20
    assert corpus.pairs == 40 and corpus.skipped == 3
    assert corpus.files[good].skipped == 0 and corpus.files[odd].as_dict()["no_tab"] == 1
    record = corpus.as_dict()
    assert record == {"files": 2, "pairs": 40, "skipped_lines": 3,
                      "skipped_by_kind": {"no_tab": 1, "extra_columns": 1, "not_utf8": 1},
                      "files_with_skipped_lines": {odd: {"no_tab": 1, "extra_columns": 1,
                                                         "not_utf8": 1}}}
    assert corpus.describe() == (
        "corpus: 40 pairs from 2 files; 3 lines skipped in 1 file: 1 with no tab, 1 with more "
        "than two columns, 1 not UTF-8 (fra-eng.tsv: 3)")


# === Issue 62, item 2: one definition of a corpus line (the stream keeps it too:
# tests/train/test_data.py::test_the_stream_trains_on_exactly_the_pairs_the_corpus_reader_counts)

def test_a_line_is_read_one_way_whatever_its_line_ends_and_whitespace():
    """Every CR is dropped (TensorFlow's line reader drops them all), and a side of
    any whitespace `str.strip()` strips is empty, as the stream reads it."""
    import sys

    from lealla_tf.parallel_corpus import WHITESPACE, Line, parse_line

    assert set(WHITESPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert parse_line(b"Maus\r\tmouse\r\r\n") == Line(None, "Maus", "mouse")
    assert parse_line(b"\xe2\r\x82\xac\tEuro") == Line(None, "\u20ac", "Euro")
    assert parse_line("\u00a0\tno-break space\n".encode()) == Line("empty_side")
    assert parse_line(b"\x1c\t\n") == Line("blank")
    assert parse_line(b"a\tb\t\n") == Line("extra_columns")
    assert parse_line(b"\xff\tb\tc\n") == Line("not_utf8")


def test_a_file_is_checked_for_a_pair_up_to_its_first_one(tmp_path):
    """The main job checks every corpus file before it writes anything: a file with
    a pair passes having been read to it, one with none is refused naming it."""
    import gzip
    import os

    from lealla_tf.parallel_corpus import DataFileError, check_pair_file

    data = gzip.compress(b"chat\tcat\n" + os.urandom(1 << 20).hex().encode())
    cut = write_lines(tmp_path / "fra-eng.tsv.gz", data[:len(data) // 2])  # a cut stream
    check_pair_file(cut)
    with pytest.raises(DataFileError, match="unreadable or corrupt"):
        list(read_pairs(cut))
    bad = write_lines(tmp_path / "ita-eng.tsv", b"no tab\ncane\tdog\textra\n")
    with pytest.raises(DataFileError) as raised:
        check_pair_file(bad)
    assert raised.value.path == bad and "1 with no tab (line 1)" in str(raised.value)
