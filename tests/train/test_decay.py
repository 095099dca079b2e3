"""The warmup-stable-decay window (lealla_tf.train.decay): the same on numbers
(the planner, the cooldown's share) as on tensors (the schedule)."""

import pytest
import tensorflow as tf

from lealla_tf.train.decay import decay_window


@pytest.mark.parametrize("total, warmup, fraction, start, steps", [
    (100, 10, 0.2, 82.0, 18.0),     # the last fifth of the 90 steps after warmup
    (6, 2, 0.5, 4.0, 2.0),
    (50, 0, 1.0, 1.0, 50.0),        # decays from step 1 without a warmup
    (10, 10, 0.2, 10.0, 1.0),       # never before the warmup ends, over one step at least
])
def test_the_window_is_the_last_fraction_after_warmup(total, warmup, fraction, start, steps):
    assert decay_window(float(total), warmup, fraction) == (pytest.approx(start),
                                                            pytest.approx(steps))
    tensors = decay_window(tf.constant(float(total)), warmup, fraction, tf.maximum)
    assert [float(x) for x in tensors] == [pytest.approx(start), pytest.approx(steps)]
