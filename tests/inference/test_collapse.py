"""lealla_tf.inference.collapse: the mean cosine of different sentences' embeddings,
against its definition written out, and the warning it gives a collapsed model."""

import numpy as np
import pytest

from lealla_tf.inference.collapse import COLLAPSED_MEAN_COSINE, collapse_warning, mean_cosine


def test_mean_cosine_tells_a_collapsed_model_from_a_spread_one():
    rng = np.random.default_rng(0)
    spread = rng.normal(size=(50, 8))
    unit = spread / np.linalg.norm(spread, axis=1, keepdims=True)
    cosines = unit @ unit.T
    expected = (cosines.sum() - np.trace(cosines)) / (50 * 49)  # the definition, written out
    assert mean_cosine(spread) == pytest.approx(expected, abs=1e-6)
    collapsed = np.ones((50, 8)) + 1e-6 * rng.normal(size=(50, 8))
    assert mean_cosine(collapsed) > 0.9999 > COLLAPSED_MEAN_COSINE
    assert collapse_warning(mean_cosine(spread), "m") is None
    assert "m has collapsed" in collapse_warning(mean_cosine(collapsed), "m")
    assert np.isnan(mean_cosine(spread[:1])) and collapse_warning(float("nan"), "m") is None
    assert mean_cosine(np.zeros((5, 8))) == 1.0  # collapsed to the origin
    half = np.concatenate([np.zeros((2, 8)), unit[:2]])  # 1 zero pair, 1 unit pair of 12
    assert mean_cosine(half) == pytest.approx((2 * (1 + unit[0] @ unit[1])) / 12, abs=1e-6)


def test_its_rows_are_normalised_as_mining_normalises_them():
    """collapse keeps its own copy of `normalize_rows` (inference does not import
    mining): the two give the same rows, zero and non-finite rows included."""
    from lealla_tf.inference.collapse import _unit_rows
    from lealla_tf.mining.neighbours import normalize_rows

    rows = np.random.default_rng(1).normal(size=(20, 8)).astype(np.float64)
    rows[3], rows[7, 2] = 0.0, np.inf
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(_unit_rows(rows), normalize_rows(rows))
