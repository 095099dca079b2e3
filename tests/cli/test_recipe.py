"""`python -m lealla_tf.recipe`'s command line: its flags are the job's
(lealla_tf.recipe.command_line, tests/recipe/test_command_line.py), its errors one line."""

from conftest import assert_one_line_error

from lealla_tf.cli.recipe import build_parser, main
from lealla_tf.recipe.command_line import config_from_flags
from lealla_tf.recipe.settings import RecipeConfig


def test_the_command_line_parses_the_jobs_flags_with_its_own_help():
    parser = build_parser()
    assert "the main job's command line" in parser.description
    assert config_from_flags(vars(parser.parse_args([]))) == RecipeConfig()


def test_a_malformed_flag_is_one_line(capsys, tmp_path):
    code = main([f"--work_dir={tmp_path / 'job'}", "--encoder_overrides=num_layers"])
    assert_one_line_error(capsys, code, "num_layers")
    assert not (tmp_path / "job").exists()
