"""The configuration dataclasses (`lealla_tf.configs`): an impossible encoder is
refused when it is made, and every config goes to JSON and back unchanged, with
a misspelt key named."""

import json

import pytest

from lealla_tf.configs import (
    EncoderConfig,
    TeacherConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
)


@pytest.mark.parametrize("changes, message", [
    ({"hidden_dim": 10, "num_heads": 4}, "not divisible by num_heads=4"),
    ({"num_layers": 0}, "num_layers must be a positive int"),
    ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
    ({"num_unique_layers": 3}, "must divide num_layers=4"),
    ({"pooling": "max"}, "pooling must be one of"),
    ({"pooling": "mean", "pooler_dim": 16}, "pooler_dim needs pooling='cls'"),
    ({"output_dim": 0}, "output_dim must be a positive int or None"),
    ({"hidden_activation": "swish"}, "hidden_activation must be one of"),
])
def test_an_impossible_encoder_is_refused_naming_the_field(changes, message):
    settings = dict(vocabulary_size=30, num_layers=4, num_heads=2, hidden_dim=8,
                    intermediate_dim=16)
    with pytest.raises(ValueError, match=message):
        EncoderConfig(**{**settings, **changes})
    with pytest.raises(ValueError, match=message):  # a copy is checked too
        EncoderConfig(**settings).replace(**changes)


def test_the_embedding_is_the_last_width_the_encoder_has():
    encoder = EncoderConfig(hidden_dim=8, num_heads=2)
    assert encoder.embedding_size == 8
    assert encoder.replace(pooler_dim=12).embedding_size == 12  # distillation-first
    assert encoder.replace(pooler_dim=12, output_dim=8).embedding_size == 8


def test_a_teacher_is_a_hub_module_when_it_has_a_path_or_an_encoder():
    assert not TeacherConfig().hub and not TeacherConfig(in_step=True).hub
    assert TeacherConfig(path="runs/teacher").hub and TeacherConfig(encoder="https://x").hub


def test_a_config_goes_to_json_and_back_unchanged():
    config = TrainConfig(encoder=EncoderConfig(hidden_dim=16, num_heads=4, pooling="mean"),
                         teacher=TeacherConfig(center=True), train_steps=7)
    config.loss.weights = {"fd": 2.0}
    values = json.loads(json.dumps(config_to_dict(config)))
    assert values["encoder"]["hidden_dim"] == 16 and values["loss"]["weights"] == {"fd": 2.0}
    assert config_from_dict(TrainConfig, values) == config


def test_a_misspelt_key_is_named_not_ignored():
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields: \['train_step'\]"):
        config_from_dict(TrainConfig, {"train_step": 5})
    with pytest.raises(ValueError, match=r"unknown EncoderConfig fields: \['hiden_dim'\]"):
        config_from_dict(TrainConfig, {"encoder": {"hiden_dim": 8}})
