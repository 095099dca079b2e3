"""L2Normalization: unit rows in float32 whatever the policy, zero rows finite, saving."""

import keras
import numpy as np
import tensorflow as tf

from lealla_tf.models.layers import L2Normalization


def test_rows_become_unit_vectors_and_a_zero_row_stays_zero():
    rows = np.array([[3.0, 4.0], [0.0, 0.0], [-1e-3, 2e-3]], "float32")
    out = L2Normalization()(rows).numpy()
    np.testing.assert_allclose(out[0], [0.6, 0.8], atol=1e-7)
    np.testing.assert_array_equal(out[1], [0.0, 0.0])
    np.testing.assert_allclose(np.linalg.norm(out[2]), 1.0, atol=1e-6)
    # the last axis only, whatever the rank
    batch = np.random.default_rng(0).normal(size=(2, 3, 5)).astype("float32")
    np.testing.assert_allclose(np.linalg.norm(L2Normalization()(batch), axis=-1), 1.0, atol=1e-6)


def test_it_computes_in_float32_under_a_mixed_policy_without_rounding_its_input():
    """A float32 embedding must not be rounded to bfloat16 before it is normalised."""
    rows = tf.constant(np.random.default_rng(1).normal(size=(4, 16)), tf.float32)
    exact = (rows / tf.norm(rows, axis=-1, keepdims=True)).numpy()
    layer = L2Normalization(dtype="mixed_bfloat16")
    out = layer(rows)
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy(), exact, atol=1e-6)
    # a bfloat16 input is widened, not kept
    assert layer(tf.cast(rows, tf.bfloat16)).dtype == tf.float32
    symbolic = layer(keras.Input(shape=(16,), dtype="bfloat16"))
    assert symbolic.dtype == "float32"


def test_its_epsilon_is_kept_by_its_config_and_saving(tmp_path):
    layer = L2Normalization(epsilon=1e-6, name="unit")
    clone = L2Normalization.from_config(layer.get_config())
    assert clone.epsilon == 1e-6 and clone.name == "unit"
    tiny = np.array([[1e-4, 0.0]], "float32")  # squared norm 1e-8, under the floor
    np.testing.assert_allclose(clone(tiny), [[1e-4 / np.sqrt(1e-6), 0.0]], rtol=1e-5)
    inputs = keras.Input(shape=(2,))
    model = keras.Model(inputs, L2Normalization(epsilon=1e-6)(inputs))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(tiny), model(tiny), atol=1e-7)
