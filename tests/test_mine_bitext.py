"""beam_pipelines/mine_bitext.py end to end on two embedded 'languages'."""

import pathlib
import sys

import pytest

from lealla_tf.pipelines import embed_corpus  # noqa: E402
from lealla_tf.pipelines import mine_bitext  # noqa: E402

from test_embed_corpus import SENTENCES, model  # noqa: E402,F401  (fixture)


def test_mines_identical_sentences_back(model, tmp_path):  # noqa: F811
    path, _ = model
    (tmp_path / "src.txt").write_text("\n".join(SENTENCES) + "\n")
    (tmp_path / "tgt.txt").write_text("\n".join(reversed(SENTENCES)) + "\n")
    for side in ("src", "tgt"):
        embed_corpus.run([f"--input={tmp_path / f'{side}.txt'}", f"--model={path}",
                          f"--output={tmp_path / side}"])
    output = tmp_path / "mined.tsv"
    count = mine_bitext.run([f"--source={tmp_path / 'src'}", f"--target={tmp_path / 'tgt'}",
                             f"--output={output}", "--with_ids"])
    rows = [line.split("\t") for line in output.read_text().splitlines()]
    assert count == len(rows) == len(SENTENCES)
    assert all(row[1] == row[2] for row in rows), rows  # each sentence mined to itself
    scores = [float(row[0]) for row in rows]
    assert scores == sorted(scores, reverse=True)
    assert {row[3] for row in rows} == {f"src.txt:{i}" for i in range(1, len(SENTENCES) + 1)}


def test_unknown_embedding_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="MANIFEST"):
        mine_bitext.run([f"--source={tmp_path}", f"--target={tmp_path}",
                         f"--output={tmp_path / 'x.tsv'}"])
