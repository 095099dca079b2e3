"""The Keras internals lealla_tf relies on (lealla_tf.models.keras_adapter): all there
in the installed Keras, doing what the adapter promises, and a clear error naming
the Keras version and the attribute when a release renames one."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.models import keras_adapter
from lealla_tf.models.keras_adapter import (
    KERAS_INTERNALS,
    AdamWDecayInStep,
    KerasInternalsError,
    shared_variable,
)


def test_every_class_level_internal_is_there_in_the_installed_keras():
    keras_adapter.check_class_attributes()
    checked = {f"{owner}.{attribute}"
               for owner, (_, attributes) in keras_adapter._CLASS_ATTRIBUTES.items()
               for attribute in attributes}
    assert checked <= set(KERAS_INTERNALS)


def test_a_renamed_internal_is_named_with_the_installed_version(monkeypatch):
    renamed = type("AdamW", (), {})  # a Keras whose AdamW lost the method
    monkeypatch.setitem(keras_adapter._CLASS_ATTRIBUTES, "AdamW",
                        (renamed, ("_apply_weight_decay",)))
    with pytest.raises(KerasInternalsError) as error:
        keras_adapter.check_class_attributes()
    message = str(error.value)
    assert f"keras {keras.__version__} has no `AdamW._apply_weight_decay`" in message
    assert KERAS_INTERNALS["AdamW._apply_weight_decay"] in message
    assert "setup.py" in message and "keras_adapter" in message


def test_a_shared_variable_is_the_tensorflow_variable_itself():
    original = tf.Variable([1.0, 2.0], name="encoder/dense/kernel")
    variable = shared_variable(original, name="encoder_dense_kernel")
    assert isinstance(variable, keras.Variable) and variable.name == "encoder_dense_kernel"
    variable.assign([3.0, 4.0])
    np.testing.assert_array_equal(original.numpy(), [3.0, 4.0])
    original.assign([5.0, 6.0])
    np.testing.assert_array_equal(variable.numpy(), [5.0, 6.0])
    assert variable.value is original


def test_a_keras_that_copies_the_variable_is_named(monkeypatch):
    """A Keras whose `keras.Variable(initializer=tf_variable)` copies it: the
    SavedModel's functions would read weights that fit never changes."""
    class Copying(keras.Variable):
        def __init__(self, initializer, **kwargs):
            super().__init__(initializer=tf.convert_to_tensor(initializer) + 0, **kwargs)

    monkeypatch.setattr(keras_adapter.keras, "Variable", Copying)
    with pytest.raises(KerasInternalsError, match=f"keras {keras.__version__} copies"):
        shared_variable(tf.Variable([1.0]), name="copied")


class DecaysTheKernelInStep(AdamWDecayInStep):
    """Decays `kernel` in its own step, by plain ops, and records what it saw."""

    seen = {}

    def decays_in_update_step(self, variable) -> bool:
        return "kernel" in variable.name

    def update_step(self, gradient, variable, learning_rate):
        if self.decays_in_update_step(variable):
            self.seen[variable.name.split(":")[0]] = (self.weight_decay_due(variable),
                                        [slot.path for slot in self.adam_slots(variable)])
            if self.weight_decay_due(variable):
                variable.assign_sub(variable * self.weight_decay * learning_rate)
            self.weight_decay, saved = None, self.weight_decay  # Adam's step alone
            try:
                return super().update_step(gradient, variable, learning_rate)
            finally:
                self.weight_decay = saved
        return super().update_step(gradient, variable, learning_rate)


def run(optimizer_class):
    kernel = keras.Variable(np.full((2, 2), 2.0, "float32"), name="kernel")
    bias = keras.Variable(np.ones(2, "float32"), name="bias")
    other = keras.Variable(np.full(2, 3.0, "float32"), name="other")
    optimizer = optimizer_class(learning_rate=0.1, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    gradients = [tf.fill((2, 2), 0.25), tf.fill((2,), -0.5), tf.fill((2,), 1.0)]
    for _ in range(2):
        optimizer.apply_gradients(zip(gradients, [kernel, bias, other]))
    return [v.numpy() for v in (kernel, bias, other)], optimizer


def test_decay_in_step_equals_adamw_and_exposes_the_decay_and_slots():
    expected, _ = run(keras.optimizers.AdamW)
    assert AdamWDecayInStep().decays_in_update_step(keras.Variable(1.0)) is False
    DecaysTheKernelInStep.seen.clear()
    for optimizer_class in (AdamWDecayInStep, DecaysTheKernelInStep):
        got, _ = run(optimizer_class)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    due, slots = DecaysTheKernelInStep.seen["kernel"]
    assert due is True
    assert [path.split("/")[-1] for path in slots] == ["kernel_momentum", "kernel_velocity"]
    assert set(DecaysTheKernelInStep.seen) == {"kernel"}  # the others stayed AdamW's


def test_weight_decay_due_follows_the_exclusions():
    optimizer = AdamWDecayInStep(learning_rate=0.1, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    kernel, bias = keras.Variable(np.ones(2, "float32"), name="kernel"), keras.Variable(
        np.ones(2, "float32"), name="bias")
    optimizer.build([kernel, bias])
    optimizer._apply_weight_decay([kernel, bias])  # what Keras calls before the steps
    assert optimizer.weight_decay_due(kernel) and not optimizer.weight_decay_due(bias)
    momentum, velocity = optimizer.adam_slots(bias)
    assert momentum.shape == velocity.shape == (2,)
