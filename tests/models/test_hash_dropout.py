"""The hash-mask dropout: its distribution, its seed, its gradient."""

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.models.layers import hash_dropout

N = 1 << 20


def mask(seed, rate, shape=(N,)):
    return hash_dropout.keep_mask(tf.constant(shape), tf.constant(seed, tf.int64), rate).numpy()


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_keeps_each_entry_with_probability_one_minus_rate(rate):
    kept = mask([7, 3], rate).mean()
    sigma = np.sqrt(rate * (1 - rate) / N)
    assert abs(kept - (1 - rate)) < 5 * sigma, kept


def test_masks_are_independent_across_positions_and_seeds():
    rate = 0.3
    a, b, c = mask([7, 3], rate), mask([7, 4], rate), mask([8, 3], rate)
    expected = rate ** 2 + (1 - rate) ** 2  # agreement of two independent masks
    sigma = np.sqrt(expected * (1 - expected) / N)
    for other in (b, c, np.roll(a, 1)):  # next seed, other generator, neighbour
        assert abs((a == other).mean() - expected) < 5 * sigma
    # runs of equal bits as long as for independent coins (no striping)
    grid = mask([7, 3], rate, (1024, 1024))
    for axis in (0, 1):
        agree = (grid == np.roll(grid, 1, axis=axis)).mean()
        assert abs(agree - expected) < 5 * sigma


def test_the_same_seed_gives_the_same_mask_and_32_bit_words_are_used():
    np.testing.assert_array_equal(mask([7, 3], 0.1), mask([7, 3], 0.1))
    assert (mask([7, 3], 0.1) != mask([7 + (1 << 32), 3], 0.1)).sum() == 0  # low words
    assert (mask([7, 3], 0.1) != mask([-7, 3], 0.1)).sum() > 0


def test_dropout_scales_kept_entries_and_zeroes_the_rest():
    x = tf.random.normal([64, 48])
    y = hash_dropout.dropout(x, 0.25, tf.constant([1, 2])).numpy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], x.numpy()[kept] / 0.75, rtol=1e-6)
    assert 0.6 < kept.mean() < 0.9
    np.testing.assert_array_equal(hash_dropout.dropout(x, 0.0, tf.constant([1, 2])), x)


def test_gradient_is_the_mask_times_the_scale_and_bfloat16_works():
    x = tf.random.normal([32, 16])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hash_dropout.dropout(x, 0.5, tf.constant([5, 9]))
    gradient = tape.gradient(y, x).numpy()
    np.testing.assert_allclose(gradient, np.where(y.numpy() != 0, 2.0, 0.0))
    traced = tf.function(lambda x: hash_dropout.dropout(x, 0.5, tf.constant([5, 9])))
    half = traced(tf.cast(x, tf.bfloat16))
    assert half.dtype == tf.bfloat16
    np.testing.assert_array_equal(half.numpy() != 0, y.numpy() != 0)


@pytest.mark.parametrize("rate", [-0.1, 1.0, 2.0])
def test_a_rate_outside_0_1_is_refused(rate):
    with pytest.raises(ValueError, match="dropout rate"):
        hash_dropout.dropout(tf.ones([2]), rate, tf.constant([0, 0]))
