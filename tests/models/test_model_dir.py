"""The model directory: config.json, vocabulary copy, checkpoint restore."""

import pathlib

import numpy as np
import pytest

from lealla_tf.configs import EncoderConfig, config_from_dict
from lealla_tf.models.encoder import build_encoder
from lealla_tf.models.model_dir import (
    TokenizerConfig,
    encoder_config_of,
    load_encoder,
    load_tokenizer,
    read_model_config,
    save_encoder_checkpoint,
    write_model_config,
)

TINY = EncoderConfig(vocabulary_size=60, num_layers=1, num_heads=2, hidden_dim=8,
                     intermediate_dim=8)


def test_round_trip(tiny_vocab_file, tmp_path):
    rows = len(pathlib.Path(tiny_vocab_file).read_text().split("\n")) - 1
    encoder = build_encoder(TINY.replace(vocabulary_size=rows))
    model_dir = str(tmp_path / "m")
    config = write_model_config(model_dir, encoder.encoder_config,
                                TokenizerConfig(max_seq_length=20, lower_case=True),
                                source_vocab_file=tiny_vocab_file, training={"steps": 3})
    assert config["tokenizer"]["vocab_file"] == "vocab.txt"
    assert read_model_config(model_dir)["training"] == {"steps": 3}
    assert encoder_config_of(model_dir) == encoder.encoder_config
    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.max_seq_length == 20 and tokenizer.lower_case
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_encoder(model_dir)
    save_encoder_checkpoint(model_dir, encoder)
    restored = load_encoder(model_dir)
    for a, b in zip(encoder.weights, restored.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # a run trained with --mixed_precision leaves that global policy behind: the
    # model still loads (exports, evaluates) in float32 unless asked otherwise
    import keras

    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        assert load_encoder(model_dir).token_embedding.compute_dtype == "float32"
        assert load_encoder(model_dir, dtype="mixed_bfloat16").token_embedding.compute_dtype \
            == "bfloat16"
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def test_missing_directory_and_unknown_fields(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a lealla_tf model directory"):
        read_model_config(str(tmp_path))
    with pytest.raises(ValueError, match="unknown EncoderConfig fields"):
        config_from_dict(EncoderConfig, {"hidden_dim": 8, "hiden_dim": 8})


def test_build_tokenizer_takes_every_setting_of_the_config(tiny_vocab_file, tmp_path):
    from lealla_tf.models.model_dir import build_tokenizer

    config = TokenizerConfig(vocab_file="elsewhere.txt", max_seq_length=7, lower_case=True,
                             prefix="query: ")
    tokenizer = build_tokenizer(config, tiny_vocab_file)
    assert (tokenizer.max_seq_length, tokenizer.lower_case, tokenizer.prefix) == (
        7, True, "query: ")
    with pytest.raises(FileNotFoundError, match="elsewhere.txt"):
        build_tokenizer(config)  # the config's own file, absent here


@pytest.mark.parametrize("content,message", [
    ("{}", "config.json has no 'encoder' section: "),
    ('{"encoder": {}}', "config.json has no 'tokenizer' section: "),
    ('{"encoder": {"bogus": 1}, "tokenizer": {}}',
     "config.json: its 'encoder' section is not a valid EncoderConfig (unknown EncoderConfig "
     "fields: ['bogus'])"),
    ("[1, 2]", "config.json holds a JSON list, not the object of a lealla_tf model directory"),
    ("{not json", "config.json is not valid JSON (")])
def test_a_config_that_is_no_model_config_is_named(tmp_path, content, message):
    """A `{}` config.json gave a KeyError: 'encoder'."""
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ValueError) as raised:
        if "tokenizer" in message:
            load_tokenizer(str(tmp_path))
        else:
            encoder_config_of(str(tmp_path))
    assert str(raised.value).startswith(str(tmp_path / "config.json")) and message in str(
        raised.value)
