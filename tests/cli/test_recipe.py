"""`python -m lealla_tf.recipe`'s command line: flags to `RecipeConfig`, one-line errors."""

import dataclasses

from conftest import assert_one_line_error

from lealla_tf.cli.recipe import build_parser, config_from_args, main
from lealla_tf.recipe.settings import RecipeConfig


def test_no_flags_give_the_default_job():
    assert config_from_args(build_parser().parse_args([])) == RecipeConfig()


def test_every_setting_of_the_job_has_its_flag():
    flags = set(vars(build_parser().parse_args([])))
    assert {field.name for field in dataclasses.fields(RecipeConfig)} - flags <= {
        "loss_weights", "encoder_overrides", "truncate_teacher", "teacher_in_step"}
    # the four kept out above are spelled differently on the command line
    assert {"loss_weights", "encoder_overrides", "no_truncate_teacher",
            "no_teacher_in_step"} <= flags


def test_flags_reach_their_settings():
    config = config_from_args(build_parser().parse_args([
        "--decay_fraction=0.5", "--clip_norm=0", "--scale=50", "--margin=0.2",
        "--language_alpha=0.7", "--news_languages=deu,fra", "--loss_weights=fd=2",
        "--encoder_overrides=num_layers=2", "--no_teacher_in_step", "--train_steps=30"]))
    assert (config.decay_fraction, config.clip_norm, config.scale, config.margin) == (
        0.5, 0.0, 50.0, 0.2)
    assert config.language_alpha == 0.7 and config.news_languages == ["deu", "fra"]
    assert config.loss_weights == {"fd": 2.0} and config.encoder_overrides == {"num_layers": 2}
    assert not config.teacher_in_step and config.train_steps == 30


def test_a_malformed_flag_is_one_line(capsys, tmp_path):
    code = main([f"--work_dir={tmp_path / 'job'}", "--encoder_overrides=num_layers"])
    assert_one_line_error(capsys, code, "num_layers")
    assert not (tmp_path / "job").exists()
