"""`lealla-import-checkpoint` (`lealla_tf.cli.import_checkpoint`): flags passed to the
library, the summary printed, unused tensors warned of, faults in one line. The
checkpoint layouts themselves are tests/models/test_checkpoint_conversion.py's."""

from types import SimpleNamespace

import pytest
from conftest import assert_one_line_error

from lealla_tf.cli.import_checkpoint import main
from lealla_tf.models import checkpoint_conversion


class Calls(list):
    unused = []


@pytest.fixture()
def calls(monkeypatch):
    """The library's import_saved_model, recording its arguments; it reports the
    tensors in `made.unused` as unused."""
    made = Calls()

    def import_saved_model(saved_model, model_dir, vocab_file, num_heads=None,
                           max_seq_length=128):
        made.append((saved_model, model_dir, vocab_file, num_heads, max_seq_length))
        return {"layout": "labse", "checkpoint": f"{model_dir}/checkpoints/ckpt-0",
                "encoder": SimpleNamespace(num_layers=12, hidden_dim=768, num_heads=12,
                                           vocabulary_size=501153),
                "unused_tensors": made.unused}

    monkeypatch.setattr(checkpoint_conversion, "import_saved_model", import_saved_model)
    return made


def test_the_flags_reach_the_library_and_the_summary_is_printed(calls, capsys):
    assert main(["--saved_model=released/labse2", "--model_dir=runs/labse",
                 "--num_heads=12"]) == 0
    assert calls == [("released/labse2", "runs/labse", None, 12, 128)]
    captured = capsys.readouterr()
    assert captured.out.strip() == ("imported labse checkpoint: 12 layers, 768-d, 12 heads, "
                                    "vocabulary 501,153 -> runs/labse/checkpoints/ckpt-0")
    assert captured.err == ""


def test_unused_tensors_are_warned_of(calls, capsys):
    calls.unused = ["pooler/dense/kernel"]
    assert main(["--saved_model=s", "--model_dir=m", "--vocab_file=v.txt",
                 "--max_seq_length=64"]) == 0
    assert calls == [("s", "m", "v.txt", None, 64)]
    assert capsys.readouterr().err.strip() == "warning: unused tensors: ['pooler/dense/kernel']"


def test_a_saved_model_that_is_not_there_is_one_line(tmp_path, capsys):
    assert_one_line_error(capsys, main([f"--saved_model={tmp_path / 'absent'}",
                                        f"--model_dir={tmp_path / 'model'}"]))
    assert not (tmp_path / "model").exists()
