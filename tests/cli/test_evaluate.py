"""`python -m lealla_tf.cli.evaluate` on a model that maps every sentence to one point."""

import json

from conftest import collapse, spread_encoder

from lealla_tf.cli.evaluate import main
from lealla_tf.inference.export import export_lealla_model
from lealla_tf.tokenizers.tokenizer import Tokenizer


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
        warning = json.load(open(output)).get("collapse_warning")
        assert ("has collapsed" in error) == collapsed, error
        assert bool(warning) == collapsed
        if collapsed:
            assert f"the model {model} has collapsed" in warning and warning in error
