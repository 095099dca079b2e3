"""`lealla-evaluate` (`lealla_tf.cli.evaluate`): the table, JSON and plot it writes;
a collapsed model named; every input fault one line, before the model loads."""

import json
import pathlib
import shutil

import pytest
from conftest import assert_one_line_error, collapse, spread_encoder

from lealla_tf.cli.evaluate import main
from lealla_tf.configs import EncoderConfig
from lealla_tf.evaluation.bucc import write_bucc_split
from lealla_tf.inference import loaders
from lealla_tf.inference.formats import export_lealla_model, export_model_dir
from lealla_tf.inference.loaders import load_embedder
from lealla_tf.models.encoder import build_encoder
from lealla_tf.tokenizers.tokenizer import Tokenizer


def test_evaluate_cli_writes_table_json_and_png(tmp_path, tiny_tatoeba_dir, sentence_vocab_file,
                                                capsys):
    tokenizer = Tokenizer(sentence_vocab_file)
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=8, intermediate_dim=8))
    export_lealla_model(encoder, tokenizer, str(tmp_path / "model"))
    output = tmp_path / "report" / "eval.json"
    assert main([f"--model={tmp_path / 'model'}", f"--tatoeba_dir={tiny_tatoeba_dir}",
                 f"--output_json={output}", "--no_progress"]) == 0
    result = json.loads(output.read_text())
    assert result["primary_metric"] == "tatoeba/average_p_at_1"
    value = result["metrics"]["tatoeba/average_p_at_1"]
    assert 0.0 <= value <= 1.0 and "tatoeba_margin/average_p_at_1" in result["metrics"]
    assert (tmp_path / "report" / "eval.png").stat().st_size > 5000
    out = capsys.readouterr().out
    assert "average" in out and "deu" in out
    assert main([f"--model={tmp_path / 'nothing'}", f"--tatoeba_dir={tiny_tatoeba_dir}",
                 f"--output_json={output}"]) == 2


def test_evaluate_names_a_collapsed_model(sentence_vocab_file, tiny_tatoeba_dir, tmp_path,
                                          capsys):
    """A collapsed export got its P@1 reported with no warning (only the export
    named it). Every layer norm's scale at 0 puts every sentence at one point;
    the same model with its scales kept says nothing."""
    tokenizer = Tokenizer(sentence_vocab_file, max_seq_length=32)
    encoder = spread_encoder(tokenizer)
    for name, collapsed in (("spread", False), ("collapsed", True)):
        if collapsed:
            collapse(encoder.weights)
        model = export_lealla_model(encoder, tokenizer, str(tmp_path / name))
        output = tmp_path / f"{name}.json"
        assert main([f"--model={model}", f"--tatoeba_dir={tiny_tatoeba_dir}",
                     f"--output_json={output}", "--no_progress"]) == 0
        error = capsys.readouterr().err
        warning = json.loads(pathlib.Path(output).read_text()).get("collapse_warning")
        assert ("has collapsed" in error) == collapsed, error
        assert bool(warning) == collapsed
        if collapsed:
            assert f"the model {model} has collapsed" in warning and warning in error


def test_evaluate_faults(exported_model, tiny_tatoeba_dir, tmp_path, capsys):
    base = [f"--model={exported_model['export']}", f"--tatoeba_dir={tiny_tatoeba_dir}",
            "--no_progress"]
    assert_one_line_error(capsys, main(base + ["--max_pairs=-1",
                                               f"--output_json={tmp_path / 'e.json'}"]),
                          "--max_pairs")
    assert_one_line_error(capsys, main(base + [f"--output_json={tmp_path}"]), "--output_json")
    empty = tmp_path / "tatoeba"
    empty.mkdir()
    (empty / "tatoeba.xho-eng.xho").write_text("")
    (empty / "tatoeba.xho-eng.eng").write_text("")
    assert_one_line_error(capsys, main([f"--model={exported_model['export']}",
                                        f"--tatoeba_dir={empty}", "--no_progress",
                                        f"--output_json={tmp_path / 'e.json'}"]),
                          "tatoeba.xho-eng.xho")
    # --max_pairs=1 keeps exactly one pair a language (not "all but the last").
    assert main(base + ["--max_pairs=1", f"--output_json={tmp_path / 'one.json'}"]) == 0
    metrics = json.loads((tmp_path / "one.json").read_text())["metrics"]
    assert {v for k, v in metrics.items() if k.endswith("/pairs")} == {1}


def test_evaluate_input_faults_are_named_before_the_model_loads(exported_model, tiny_tatoeba_dir,
                                                                tmp_path, capsys, monkeypatch):
    """An incomplete Tatoeba language was dropped from the average, gold ids that
    are in no sentence file halved recall, a missing .gold file scored 0: all
    with exit 0. Each is one line naming the file, before the model is loaded."""

    monkeypatch.setattr(loaders, "load_embedder", lambda *_: pytest.fail("model loaded"))
    tatoeba = tmp_path / "tatoeba"
    shutil.copytree(tiny_tatoeba_dir, tatoeba)
    (tatoeba / "tatoeba.deu-eng.eng").unlink()
    base = [f"--model={exported_model['export']}", "--no_progress",
            f"--output_json={tmp_path / 'e.json'}"]
    assert_one_line_error(capsys, main(base + [f"--tatoeba_dir={tatoeba}"]),
                          "tatoeba.deu-eng.eng is missing")
    rows = [("de-0", "Hund"), ("de-1", "Katze")], [("en-0", "dog"), ("en-1", "cat")]
    for split in ("training", "test"):
        write_bucc_split(str(tmp_path / "bucc"), "deu", split, *rows, [("de-0", "en-0")])
    bucc = base + [f"--tatoeba_dir={tiny_tatoeba_dir}", f"--bucc_dir={tmp_path / 'bucc'}",
                   "--bucc_languages=deu"]
    gold = tmp_path / "bucc" / "deu-en.test.gold"
    gold.write_text("de-0\ten-0\nde-5\ten-1\n")
    assert_one_line_error(capsys, main(bucc), str(gold), "line 2: source id 'de-5' unknown")
    gold.unlink()
    assert_one_line_error(capsys, main(bucc), str(gold), "not found")
    assert not (tmp_path / "e.json").exists()


def test_a_model_that_does_not_embed_strings_is_one_line(exported_model, tiny_tatoeba_dir, tmp_path,
                                                        capsys):
    """The encoder half of a LaBSE/2-format pair gave a 30-line signature dump; a
    model directory whose config.json is {} a KeyError."""

    export_model_dir(exported_model["model_dir"], str(tmp_path / "pair"), "labse")
    empty_config = tmp_path / "empty_config"
    shutil.copytree(exported_model["model_dir"], empty_config)
    (empty_config / "config.json").write_text("{}")
    base = [f"--tatoeba_dir={tiny_tatoeba_dir}", "--no_progress",
            f"--output_json={tmp_path / 'e.json'}"]
    for model, message in (
            (tmp_path / "pair" / "encoder",
             f"{tmp_path / 'pair' / 'encoder'} is the encoder half of the LaBSE/2-format pair "
             f"{tmp_path / 'pair'}: pass --model={tmp_path / 'pair'}"),
            (empty_config,
             f"{empty_config / 'config.json'} has no 'encoder' section: {empty_config} is not a "
             "complete lealla_tf model directory (written by `python -m lealla_tf.train` or "
             "`export/import_checkpoint.py`)")):
        with pytest.raises(ValueError) as raised:
            load_embedder(str(model))
        assert str(raised.value) == message
        assert_one_line_error(capsys, main([f"--model={model}", *base]), message)
