"""Finding, naming and reading parallel and Tatoeba files."""

import pytest

from lealla_tf.parallel_corpus import (find_parallel_files, find_tatoeba_languages,
                                       language_of, read_pairs, read_tatoeba)
from conftest import write_pairs


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
    assert pairs == [("a", "b"), ("c", "d"), ("\ufffd bad bytes", "still english")]
    assert stats == {"pairs": 3, "malformed": 3}


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
