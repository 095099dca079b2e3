"""Launching a run (`lealla_tf.train.launch`): what is checked before anything is
written, the model directory's vocabulary and config, and the vocabulary's digest."""

import hashlib
import json

import pytest

from lealla_tf.configs import DataConfig, TrainConfig
from lealla_tf.models.model_dir import CONFIG_FILE
from lealla_tf.train.launch import check_model_dir, file_sha256, model_vocab_file, prepare


def test_a_files_digest_is_its_sha256(tmp_path):
    path = tmp_path / "vocab.txt"
    content = bytes(range(256)) * 5000  # more than one read of 1 MiB
    path.write_bytes(content)
    assert file_sha256(str(path)) == hashlib.sha256(content).hexdigest()


def test_a_model_dir_must_be_a_folder_a_run_can_write(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for path in (a_file, a_file / "below"):
        with pytest.raises(ValueError, match=f"--model_dir={path}"):
            check_model_dir(str(path))
    check_model_dir(str(tmp_path / "new" / "model"))  # made when the run writes it
    assert not (tmp_path / "new").exists()


def test_an_existing_model_dir_keeps_its_own_vocabulary(tmp_path):
    assert model_vocab_file(str(tmp_path)) is None  # a new model dir
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"tokenizer": {"vocab_file": "vocab.model"}}))
    assert model_vocab_file(str(tmp_path)) == str(tmp_path / "vocab.model")


def test_what_a_new_run_lacks_is_named_before_anything_is_written(tmp_path, tiny_parallel_dir,
                                                                   tiny_vocab_file):
    model_dir = tmp_path / "m"
    with pytest.raises(ValueError, match="--vocab_file is required"):
        prepare(TrainConfig(data=DataConfig([tiny_parallel_dir])), str(model_dir))
    with pytest.raises(ValueError, match="--train_data is required"):
        prepare(TrainConfig(), str(model_dir), tiny_vocab_file)
    with pytest.raises(ValueError, match="--global_batch_size must be positive"):
        prepare(TrainConfig(global_batch_size=0, data=DataConfig([tiny_parallel_dir])),
                str(model_dir), tiny_vocab_file)
    with pytest.raises(FileNotFoundError, match="no training files"):
        prepare(TrainConfig(data=DataConfig([str(tmp_path / "none*.tsv")])), str(model_dir),
                tiny_vocab_file)
    assert not model_dir.exists()


def test_a_run_gives_the_callers_dtype_policy_back(sentence_vocab_file, tiny_parallel_dir,
                                                    tmp_path):
    """A bfloat16 run sets Keras' global policy while it builds; a model the
    caller builds after it is float32 again (it was silently bfloat16)."""
    import dataclasses

    import keras
    from conftest import tiny_config, vocab_size

    from lealla_tf.train.launch import train

    config = dataclasses.replace(
        tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams", train_steps=1),
        mixed_precision=True)
    keras.mixed_precision.set_dtype_policy("float32")
    train(config, str(tmp_path / "run"), sentence_vocab_file, progress=False)
    assert keras.mixed_precision.global_policy().name == "float32"
