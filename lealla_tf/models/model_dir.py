"""The model directory: what training writes and export / evaluation read.

    model_dir/
      config.json      resolved config: {"encoder": EncoderConfig, "tokenizer": {...}, ...}
      vocab.txt        the vocabulary (or vocab.model for SentencePiece)
      checkpoints/     tf.train.Checkpoint with the encoder under the key "encoder"

Nothing needs passing twice: the exporter rebuilds the encoder and the
tokenizer from this directory alone.
"""

import dataclasses
import os

import tensorflow as tf

from lealla_tf.configs import (
    EncoderConfig,
    TokenizerConfig,
    config_from_dict,
    config_to_dict,
    read_json,
    write_json,
)
from lealla_tf.models.encoder import build_encoder

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"


def vocab_file_name(vocab_file: str) -> str:
    """Name the vocabulary gets inside a model directory (keeps `.model`)."""
    return "vocab.model" if vocab_file.endswith(".model") else "vocab.txt"


def write_model_config(model_dir: str, encoder: EncoderConfig, tokenizer: TokenizerConfig,
                       source_vocab_file: str | None = None, **sections) -> dict:
    """Writes config.json (and copies the vocabulary in) and returns the config.

    Args:
        model_dir: directory to write into (created).
        encoder: the encoder architecture.
        tokenizer: tokenizer settings; its `vocab_file` is rewritten to the
            name inside `model_dir` when `source_vocab_file` is copied.
        source_vocab_file: vocabulary to copy into the model directory.
        **sections: further JSON-ready sections (training, origin, ...).
    """
    tf.io.gfile.makedirs(model_dir)
    if source_vocab_file is not None:
        name = vocab_file_name(source_vocab_file)
        destination = os.path.join(model_dir, name)
        if os.path.abspath(source_vocab_file) != os.path.abspath(destination):
            tf.io.gfile.copy(source_vocab_file, destination, overwrite=True)
        tokenizer = dataclasses.replace(tokenizer, vocab_file=name)
    config = {"encoder": config_to_dict(encoder), "tokenizer": config_to_dict(tokenizer)}
    config.update(sections)
    write_json(os.path.join(model_dir, CONFIG_FILE), config)
    return config


def read_model_config(model_dir: str) -> dict:
    """config.json of a model directory; FileNotFoundError naming what is missing,
    ValueError naming the file when it is no JSON object."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(
            f"{path} not found: {model_dir} is not a lealla_tf model directory "
            "(written by `python -m lealla_tf.train` or `export/import_checkpoint.py`)")
    try:
        config = read_json(path)
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not the object "
                         "of a lealla_tf model directory")
    return config


def _config_section(model_dir: str, section: str, cls):
    """Section `section` of config.json as a `cls`; ValueError naming the file when
    it is missing or does not describe a `cls` (a `{}` config gave a KeyError)."""
    values = read_model_config(model_dir).get(section)
    path = os.path.join(model_dir, CONFIG_FILE)
    if not isinstance(values, dict):
        raise ValueError(f"{path} has no {section!r} section: {model_dir} is not a complete "
                         "lealla_tf model directory (written by `python -m lealla_tf.train` "
                         "or `export/import_checkpoint.py`)")
    try:
        return config_from_dict(cls, values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: its {section!r} section is not a valid {cls.__name__} "
                         f"({error})") from None


def encoder_config_of(model_dir: str) -> EncoderConfig:
    """The `EncoderConfig` stored in a model directory."""
    return _config_section(model_dir, "encoder", EncoderConfig)


def tokenizer_config_of(model_dir: str) -> TokenizerConfig:
    """The `TokenizerConfig` stored in a model directory."""
    return _config_section(model_dir, "tokenizer", TokenizerConfig)


def build_tokenizer(config: TokenizerConfig, vocab_file: str | None = None):
    """The `Tokenizer` a `TokenizerConfig` describes, on `vocab_file` (default
    `config.vocab_file`): the one place that maps settings to the constructor."""
    from lealla_tf.tokenizers.tokenizer import Tokenizer  # noqa: PLC0415 - tensorflow_text

    return Tokenizer(vocab_file or config.vocab_file, max_seq_length=config.max_seq_length,
                     lower_case=config.lower_case, special_tokens=config.special_tokens,
                     prefix=config.prefix, unknown_per_character=config.unknown_per_character)


def load_tokenizer(model_dir: str):
    """The model's `Tokenizer`, built from the vocabulary inside `model_dir`."""
    config = tokenizer_config_of(model_dir)
    vocab_file = config.vocab_file
    if not os.path.isabs(vocab_file) and "://" not in vocab_file:
        vocab_file = os.path.join(model_dir, vocab_file)
    return build_tokenizer(config, vocab_file)


def latest_checkpoint(model_dir: str) -> str | None:
    """Path prefix of the newest checkpoint, or None."""
    return tf.train.latest_checkpoint(os.path.join(model_dir, CHECKPOINT_DIR))


def load_encoder(model_dir: str, checkpoint: str | None = None, dtype=None):
    """The encoder of a model directory with its trained weights.

    Args:
        model_dir: a model directory.
        checkpoint: a specific checkpoint prefix; default the latest one.
        dtype: the dtype policy for inference (default "float32", whatever the
            global policy: a model trained with --mixed_precision in the same
            process still exports and evaluates in float32); "mixed_bfloat16".

    Raises:
        FileNotFoundError: no checkpoint in `model_dir`.
    """
    encoder = build_encoder(encoder_config_of(model_dir), dtype=dtype or "float32")
    if checkpoint and not tf.io.gfile.exists(checkpoint + ".index"):
        raise FileNotFoundError(f"checkpoint {checkpoint} not found (expected {checkpoint}.index;"
                                f" pass a prefix such as {os.path.join(model_dir, CHECKPOINT_DIR)}"
                                "/ckpt-N, or no --checkpoint for the latest)")
    checkpoint = checkpoint or latest_checkpoint(model_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"no checkpoint in {os.path.join(model_dir, CHECKPOINT_DIR)}")
    status = tf.train.Checkpoint(encoder=encoder).restore(checkpoint)
    status.expect_partial()  # optimizer slots and training state are not needed here
    status.assert_existing_objects_matched()
    return encoder


def save_encoder_checkpoint(model_dir: str, encoder) -> str:
    """Saves `encoder` alone as `model_dir/checkpoints/ckpt-N` (for imports)."""
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(encoder=encoder), os.path.join(model_dir, CHECKPOINT_DIR),
        max_to_keep=1)
    return manager.save()
