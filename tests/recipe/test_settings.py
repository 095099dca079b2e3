"""The main job's settings (`lealla_tf.recipe.settings`): where it finds its data,
and the loss weights its students train with."""

import pytest

from lealla_tf.recipe.settings import (
    RECIPE_LOSS_WEIGHTS,
    RecipeConfig,
    find_data_dir,
    recipe_loss_weights,
)


def test_the_data_dir_is_found_or_every_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing parallel/, tatoeba_dev/"):
        find_data_dir(str(tmp_path / "nothing"))
    (tmp_path / "parallel").mkdir()
    missing = f"(?s){tmp_path}: missing tatoeba_dev/.*--data_dir"
    with pytest.raises(FileNotFoundError, match=missing):
        find_data_dir(str(tmp_path))
    (tmp_path / "tatoeba_dev").mkdir()
    assert find_data_dir(str(tmp_path)) == tmp_path


def test_the_students_weights_are_the_recipes_for_the_terms_the_objective_has():
    assert recipe_loss_weights("lealla") == {"fd": 1.0, "ld": 1e6}
    assert recipe_loss_weights("mse") == {}
    assert recipe_loss_weights("lealla+hd") == {"fd": 1.0, "ld": 1e6, "hd": 300.0}
    assert recipe_loss_weights(RecipeConfig().objective) == RECIPE_LOSS_WEIGHTS
