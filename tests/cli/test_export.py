"""`lealla-export` (`lealla_tf.cli.export`): what it prints for the model it writes,
a collapsed model named, and its faults in one line."""

import json
import os
import subprocess
import sys

import pytest
from conftest import (
    REPO_ROOT,
    assert_one_line_stderr,
    collapse,
    multilingual_sentences,
    spread_encoder,
)

from lealla_tf.cli import export as export_command
from lealla_tf.inference import formats
from lealla_tf.models.model_dir import TokenizerConfig, save_encoder_checkpoint, write_model_config
from lealla_tf.tokenizers.tokenizer import Tokenizer


def test_the_formats_offered_are_the_library_s():
    """--help lists them without loading TensorFlow: the two lists must agree."""
    assert export_command.FORMATS == formats.FORMATS


def test_an_export_prints_its_summary_and_how_to_load_it(exported_model, tmp_path, capsys):
    path = tmp_path / "lealla"
    assert export_command.main([f"--model_dir={exported_model['model_dir']}",
                                f"--export_path={path}"]) == 0
    out = capsys.readouterr().out
    first, rest = out.split("\n", 1)
    assert first.startswith(f"exported lealla model: {path} (") and "8-d" in first
    summary = json.loads(rest[:rest.index("\n}\n") + 2])
    assert summary["format"] == "lealla" and summary["paths"] == {"model": str(path)}
    assert export_command.load_hint(str(path)) in out
    assert os.path.exists(path / "saved_model.pb")


def test_jit_compile_is_for_the_lealla_format_only(exported_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        export_command.main([f"--model_dir={exported_model['model_dir']}", "--format=labse",
                             f"--export_path={tmp_path / 'x'}", "--jit_compile"])
    assert exited.value.code == 2
    assert_one_line_stderr(2, capsys.readouterr().err, "--jit_compile applies to --format=lealla")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flags, message", [
    (["--format=labse", "--precision=bfloat16"], "--precision applies to --format=lealla"),
    (["--precision=bfloat16", "--jit_compile"], "--jit_compile exports compute in float32"),
])
def test_precision_is_for_the_plain_lealla_format(exported_model, tmp_path, capsys, flags,
                                                  message):
    with pytest.raises(SystemExit) as exited:
        export_command.main([f"--model_dir={exported_model['model_dir']}",
                             f"--export_path={tmp_path / 'x'}", *flags])
    assert exited.value.code == 2
    assert_one_line_stderr(2, capsys.readouterr().err, message)
    assert not (tmp_path / "x").exists()


def test_a_bfloat16_export_says_its_precision(exported_model, tmp_path, capsys):
    path = tmp_path / "bf16"
    assert export_command.main([f"--model_dir={exported_model['model_dir']}",
                                f"--export_path={path}", "--precision=bfloat16"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.split("\n", 1)[1].split("\n}\n")[0] + "\n}")
    assert summary["precision"] == "bfloat16"
    assert os.path.exists(path / "assets.extra" / "lealla_export.json")


def test_a_missing_model_or_checkpoint_is_one_line(exported_model, tmp_path, capsys):
    assert export_command.main([f"--model_dir={tmp_path / 'nope'}",
                                f"--export_path={tmp_path / 'x'}"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    # Through the thin entry point in export/, as a user runs it.
    result = subprocess.run(
        [sys.executable, "export/export_tfhub.py", f"--model_dir={exported_model['model_dir']}",
         f"--export_path={tmp_path / 'x'}", "--checkpoint=/nonexistent/ckpt-7"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore"))
    assert_one_line_stderr(result.returncode, result.stderr,
                           "checkpoint /nonexistent/ckpt-7 not found")


def test_a_collapsed_model_is_named_at_export(sentence_vocab_file, tmp_path, capsys,
                                              monkeypatch):
    """Every layer norm's scale at 0: every sentence gets the same vector, and the
    export says so loudly. A model whose tokens differ says nothing (a freshly
    initialised one would warn too: its 0.02-scale token embeddings leave every
    sentence at one point). The check sentences are ones this tiny vocabulary can
    read (the shipped ones are mostly [UNK] to it)."""
    monkeypatch.setattr(formats, "SPREAD_SENTENCES", multilingual_sentences()[:12])
    tokenizer = Tokenizer(sentence_vocab_file, max_seq_length=32)
    encoder = spread_encoder(tokenizer)
    for directory, collapsed in (("spread", False), ("collapsed", True)):
        if collapsed:
            collapse(encoder.weights)
        model_dir = str(tmp_path / directory)
        write_model_config(model_dir, encoder.encoder_config, TokenizerConfig(max_seq_length=32),
                           source_vocab_file=sentence_vocab_file)
        save_encoder_checkpoint(model_dir, encoder)
        assert export_command.main([f"--model_dir={model_dir}",
                                    f"--export_path={tmp_path / (directory + '_export')}"]) == 0
        error = capsys.readouterr().err
        assert ("WARNING" in error and "has collapsed" in error) == collapsed, error
