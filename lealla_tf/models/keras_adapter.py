"""The Keras internals lealla_tf relies on, in one place.

Keras has no public API for two things lealla_tf needs:

- how a `keras.layers.TFSMLayer` tracks the SavedModel's variables
  (`SharedWeightsTFSMLayer`): under names its optimizers accept;
- AdamW's weight decay and Adam slots per variable (`AdamWDecayInStep`), so that
  an optimizer can decay a variable in the same pass as its Adam step.

Both are built here on Keras' private attributes, listed in `KERAS_INTERNALS`;
nothing else in lealla_tf touches a private Keras attribute
(tests/test_architecture.py checks). The class-level ones are checked when this
module is imported, the per-instance ones on first use: a Keras release that
renames one fails with `KerasInternalsError` naming the installed Keras version
and the attribute, and tests/models/test_keras_adapter.py fails with the same words.

`shared_variable` (a Keras variable that IS a TensorFlow variable, not a copy)
uses the public constructor, and checks that it shares.
"""

import keras

# Every private Keras attribute used below: {"Class.attribute": what for}.
KERAS_INTERNALS = {
    "Layer._track_variable": "tracks a Keras variable made outside add_weight",
    "TFSMLayer._add_existing_weight": "called once per SavedModel variable "
                                      "(overridden by SharedWeightsTFSMLayer)",
    "AdamW._apply_weight_decay": "decays every variable before the Adam steps "
                                 "(overridden by AdamWDecayInStep)",
    "AdamW._use_weight_decay": "whether a variable is decayed",
    "AdamW._var_key": "a variable's key in the optimizer",
    "AdamW._get_variable_index": "a variable's index in the slot lists",
    "AdamW._momentums": "the first-moment slots, by index",
    "AdamW._velocities": "the second-moment slots, by index",
}

# Checked at import: the methods the classes below override or call.
_CLASS_ATTRIBUTES = {
    "Layer": (keras.layers.Layer, ("_track_variable",)),
    "TFSMLayer": (keras.layers.TFSMLayer, ("_add_existing_weight",)),
    "AdamW": (keras.optimizers.AdamW, ("_apply_weight_decay", "_use_weight_decay", "_var_key",
                                       "_get_variable_index")),
}


class KerasInternalsError(RuntimeError):
    """The installed Keras lacks a private attribute that lealla_tf uses
    (`KERAS_INTERNALS`); the message names it and the Keras version."""


def missing(attribute: str) -> KerasInternalsError:
    """The error for a `KERAS_INTERNALS` entry the installed Keras lacks."""
    return KerasInternalsError(
        f"keras {keras.__version__} has no `{attribute}`, which lealla_tf uses "
        f"({KERAS_INTERNALS.get(attribute, 'see lealla_tf.models.keras_adapter')}); "
        "install the keras version setup.py pins, or adapt "
        "lealla_tf.models.keras_adapter to the new Keras")


def check_class_attributes() -> None:
    """Raises `KerasInternalsError` unless every class-level attribute of
    `KERAS_INTERNALS` is there in the installed Keras."""
    for owner, (cls, attributes) in _CLASS_ATTRIBUTES.items():
        for attribute in attributes:
            if not hasattr(cls, attribute):
                raise missing(f"{owner}.{attribute}")


check_class_attributes()


def shared_variable(tf_variable, name: str) -> keras.Variable:
    """A Keras variable that is `tf_variable` itself (its reads and assignments
    go to it), named `name`: a SavedModel's restored functions read their own
    variables, so a Keras layer that trains them must track those very ones.

    Raises:
        KerasInternalsError: the installed Keras copies a TensorFlow variable
            given as a Keras variable's initializer.
    """
    variable = keras.Variable(initializer=tf_variable, trainable=tf_variable.trainable,
                              dtype=tf_variable.dtype, shape=tf_variable.shape, name=name)
    if variable.value is not tf_variable:
        raise KerasInternalsError(
            f"keras {keras.__version__} copies a TensorFlow variable given as a "
            "keras.Variable's initializer, so a Keras layer cannot train a SavedModel's "
            "own variables (lealla_tf.models.keras_adapter.shared_variable); install the "
            "keras version setup.py pins")
    return variable


class SharedWeightsTFSMLayer(keras.layers.TFSMLayer):
    """`keras.layers.TFSMLayer` that tracks the SavedModel's own variables (the
    ones its restored functions read), named as Keras allows (no `/`, no `:0`),
    instead of copies that the functions never read: `fit` then trains the
    model the layer calls."""

    def _add_existing_weight(self, weight):
        self._track_variable(shared_variable(
            weight, name=weight.name.split(":")[0].replace("/", "_")))


class AdamWDecayInStep(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` where a subclass decays chosen variables itself,
    in its `update_step`, instead of in AdamW's pass over all variables before
    the steps.

    A subclass overrides `decays_in_update_step(variable)`; for the variables it
    accepts, AdamW's pass skips them and `update_step` decays each where
    `weight_decay_due(variable)` says so. `adam_slots(variable)` gives the
    variable's first- and second-moment slots.
    """

    def decays_in_update_step(self, variable) -> bool:
        """Whether `update_step` decays `variable` (AdamW's pass does not)."""
        return False

    def weight_decay_due(self, variable) -> bool:
        """Whether `variable` is to be decayed in this step (weight decay on, and
        not excluded by `exclude_from_weight_decay`)."""
        due = getattr(self, "_decay_in_step", ())  # set each step by _apply_weight_decay
        return self.weight_decay is not None and self._var_key(variable) in due

    def adam_slots(self, variable) -> tuple:
        """(momentum, velocity): `variable`'s Adam slots, Keras variables."""
        if not (hasattr(self, "_momentums") and hasattr(self, "_velocities")):
            raise missing("AdamW._momentums" if not hasattr(self, "_momentums")
                          else "AdamW._velocities")
        index = self._get_variable_index(variable)
        return self._momentums[index], self._velocities[index]

    def _apply_weight_decay(self, variables):
        # The same order as AdamW's (all decays, then all steps) for the
        # variables left to it; the others are decayed just before their step.
        self._decay_in_step = {self._var_key(v) for v in variables if self._use_weight_decay(v)}
        rest = [v for v in variables if not self.decays_in_update_step(v)]
        if rest:
            super()._apply_weight_decay(rest)
