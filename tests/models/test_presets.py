"""Presets: exact parameter counts of the released models and the paper's table."""

import gc

import pytest

from lealla_tf.models.encoder import build_encoder
from lealla_tf.models.presets import (
    LABSE_VOCABULARY_SIZE,
    PRESETS,
    count_encoder_parameters,
    count_flops_per_token,
    count_parameters,
    get_preset,
    student_preset,
)

RELEASED = {
    "lealla_small": 68_988_672,
    "lealla_base": 107_034_240,
    "lealla_large": 147_447_296,
    "labse": 470_926_848,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RELEASED))
def test_built_model_has_released_parameter_count(name):
    config = get_preset(name).encoder
    assert config.vocabulary_size == LABSE_VOCABULARY_SIZE
    encoder = build_encoder(config)  # no optimizer: no slots counted
    assert encoder.count_params() == RELEASED[name]
    assert count_parameters(config) == RELEASED[name]
    del encoder
    gc.collect()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_formula_matches_built_model_for_every_preset(name):
    # A small vocabulary keeps this cheap; the table adds V x d exactly.
    config = PRESETS[name].encoder.replace(vocabulary_size=97)
    encoder = build_encoder(config)
    assert encoder.count_params() == count_parameters(config)
    del encoder
    gc.collect()


@pytest.mark.parametrize("changes", [
    {"embedding_dim": 16},
    {"num_unique_layers": 2},
    {"embedding_dim": 8, "num_unique_layers": 1, "pooling": "mean"},
    {"pooler_dim": 24, "output_dim": 16},
    {"pooling": "mean", "output_dim": 12},
])
def test_formula_matches_bottleneck_and_recurrence(changes):
    config = PRESETS["lealla_small"].encoder.replace(vocabulary_size=50, num_layers=4, **changes)
    assert build_encoder(config).count_params() == count_parameters(config)


def test_paper_parameter_column_agrees_to_the_printed_precision():
    # The paper mostly rounds (101.7M -> "102M") but once truncates (66.6M -> "66M").
    for name, preset in PRESETS.items():
        millions = count_parameters(preset.encoder) / 1e6
        assert abs(millions - float(preset.paper_parameters.rstrip("M"))) < 1.0, name


def test_encoder_parameters_match_paper_p_e():
    # Table 1's P_E (parameters except word embeddings), in millions.
    expected = {"labse": 85, "lealla_small": 5, "lealla_base": 11, "lealla_large": 19,
                "layers24_hidden384": 42}
    for name, p_e in expected.items():
        assert round(count_encoder_parameters(PRESETS[name].encoder) / 1e6) in (p_e, p_e + 1)


def test_unknown_preset_lists_choices():
    with pytest.raises(ValueError, match="lealla_small"):
        get_preset("lealla_tiny")


def test_student_preset_maps_encoder_presets_and_dimension_reduction():
    student, encoder, objective = student_preset("lealla_small", {"pooling": "mean"})
    assert (student, objective) == ("encoder", "lealla")
    assert encoder == PRESETS["lealla_small"].encoder.replace(pooling="mean")
    student, encoder, objective = student_preset("dimension_reduction", reduction_dim=96)
    assert (student, objective) == ("dimension_reduction", "ams")
    assert (encoder.hidden_dim, encoder.num_layers) == (96, 1)
    with pytest.raises(ValueError, match="do not apply to dimension_reduction"):
        student_preset("dimension_reduction", {"num_layers": 2})
    with pytest.raises(ValueError, match="reduction_dim must be positive"):
        student_preset("dimension_reduction", reduction_dim=0)
    with pytest.raises(ValueError, match="unknown preset"):
        student_preset("lealla_tiny")


@pytest.mark.parametrize("name,changes", [("lealla_small", {}), ("lealla_base", {}),
                                          ("lealla_small", {"pooling": "mean"}),
                                          ("lealla_small", {"embedding_dim": 32})])
def test_flops_per_token_are_twice_the_kernels_multiply_adds(name, changes):
    """Every kernel of the built model does one multiply-add a weight a token
    (the layers' and the embedding bottleneck's) or a sentence (pooler, output),
    and attention 2 x length x d a layer a token."""
    config = PRESETS[name].encoder.replace(vocabulary_size=97, **changes)
    encoder = build_encoder(config)
    per_token = per_sentence = 0
    for weight in encoder.weights:
        if not weight.path.endswith("/kernel"):
            continue
        if weight.path.startswith(("transformer_layer", "embedding_projection")):
            per_token += weight.shape.num_elements()
        else:
            per_sentence += weight.shape.num_elements()
    length = 20
    attention = 2 * 2 * length * config.hidden_dim * config.num_layers
    expected = 2 * per_token + attention + 2 * per_sentence / length
    assert count_flops_per_token(config, length) == pytest.approx(expected)
