"""The main job's flags (lealla_tf.recipe.command_line): every setting has one, they
reach their settings, and a mistake is a ValueError naming it, never an exit."""

import dataclasses

import pytest

from lealla_tf.recipe.command_line import (
    build_parser,
    config_from_flags,
    flag_values,
    recipe_config,
)
from lealla_tf.recipe.settings import RecipeConfig


def test_no_flags_give_the_default_job():
    assert recipe_config([]) == RecipeConfig()
    assert config_from_flags({}) == RecipeConfig()
    assert config_from_flags(vars(build_parser().parse_args([]))) == RecipeConfig()


def test_every_setting_of_the_job_has_its_flag():
    flags = set(flag_values([]))
    assert {field.name for field in dataclasses.fields(RecipeConfig)} - flags <= {
        "loss_weights", "encoder_overrides", "truncate_teacher", "teacher_in_step"}
    # the four kept out above are spelled differently on the command line
    assert {"loss_weights", "encoder_overrides", "no_truncate_teacher",
            "no_teacher_in_step"} <= flags


def test_flags_reach_their_settings():
    config = recipe_config([
        "--decay_fraction=0.5", "--clip_norm=0", "--scale=50", "--margin=0.2",
        "--language_alpha=0.7", "--news_languages=deu,fra", "--loss_weights=fd=2",
        "--encoder_overrides=num_layers=2", "--no_teacher_in_step", "--train_steps=30"])
    assert (config.decay_fraction, config.clip_norm, config.scale, config.margin) == (
        0.5, 0.0, 50.0, 0.2)
    assert config.language_alpha == 0.7 and config.news_languages == ["deu", "fra"]
    assert config.loss_weights == {"fd": 2.0} and config.encoder_overrides == {"num_layers": 2}
    assert not config.teacher_in_step and config.train_steps == 30


def test_flag_values_by_name_make_the_same_job():
    """A dict of flag values, as a program holds them: those left out keep their
    defaults, and --fresh (how a run starts) is no setting."""
    assert config_from_flags({"train_steps": 30, "news_languages": "deu,fra",
                              "no_teacher_in_step": True, "fresh": True}) == recipe_config(
        ["--train_steps=30", "--news_languages=deu,fra", "--no_teacher_in_step"])


@pytest.mark.parametrize("flags, message", [
    (["--lerning_rate=1"], "unrecognized arguments: --lerning_rate=1"),
    (["--learning_rate=fast"], "--learning_rate: invalid float value"),
    (["--pooling=max"], "--pooling: invalid choice"),
    (["--time_budget_minute=5"], "unrecognized arguments"),  # no abbreviated flags
    (["--encoder_overrides=num_layers"], "num_layers"),
    (["--loss_weights=fd"], "fd"),
])
def test_a_mistake_is_a_value_error_naming_it(flags, message):
    with pytest.raises(ValueError, match=message):
        recipe_config(flags)


def test_a_name_that_is_no_flag_is_refused():
    with pytest.raises(ValueError, match="no flags --lerning_rate"):
        config_from_flags({"lerning_rate": 1e-3})
