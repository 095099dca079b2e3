"""MaskedMeanPooling: the mean over real tokens only, zeros for an all-padding row."""

import keras
import numpy as np

from lealla_tf.models.layers import MaskedMeanPooling


def test_the_mean_counts_only_the_positions_the_mask_keeps():
    sequence = np.random.default_rng(0).normal(size=(3, 4, 5)).astype("float32")
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], "int32")
    out = MaskedMeanPooling()(sequence, mask).numpy()
    np.testing.assert_allclose(out[0], sequence[0].mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(out[1], sequence[1, :2].mean(axis=0), atol=1e-6)
    np.testing.assert_array_equal(out[2], np.zeros(5))  # no real token: zeros, not NaN
    # what padding holds does not matter
    padded = sequence.copy()
    padded[1, 2:] = 1e3
    np.testing.assert_allclose(MaskedMeanPooling()(padded, mask)[1], out[1], atol=1e-6)


def test_it_builds_in_a_functional_model_with_the_pooled_shape():
    sequence = keras.Input(shape=(None, 6))
    mask = keras.Input(shape=(None,), dtype="int32")
    pooled = MaskedMeanPooling()(sequence, mask)
    assert tuple(pooled.shape) == (None, 6)
    model = keras.Model([sequence, mask], pooled)
    values = np.ones((2, 3, 6), "float32") * np.array([1.0, 2.0, 3.0])[None, :, None]
    out = model([values, np.array([[1, 1, 0], [1, 1, 1]], "int32")])
    np.testing.assert_allclose(out, [[1.5] * 6, [2.0] * 6], atol=1e-6)
