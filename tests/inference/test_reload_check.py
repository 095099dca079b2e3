"""The reload check's own behaviour: what it refuses, what a failed reload says, and
how it counts the weights `fit` changed (the export tests in test_formats.py run it
on every format and loader)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.inference.reload_check import LOADERS, fit_changes, reload_in_fresh_process


def test_an_unknown_loader_is_refused_before_a_process_starts(tmp_path):
    with pytest.raises(ValueError, match="loader must be one of"):
        reload_in_fresh_process(str(tmp_path), ["x"], loader="onnx_runtime")
    assert "saved_model_load" in LOADERS and "hub_keras_layer" in LOADERS


@pytest.mark.parametrize("loader,export_format", [("saved_model_load", "lealla"),
                                                   ("hub_keras_layer", "labse")])
def test_only_batch_is_refused_for_another_check(tmp_path, loader, export_format):
    with pytest.raises(ValueError, match="only_batch is the hub_keras_layer check"):
        reload_in_fresh_process(str(tmp_path), ["x"], loader, export_format, only_batch=True)


def test_a_reload_that_fails_names_the_loader_the_path_and_the_childs_error(tmp_path):
    missing = tmp_path / "no_export"
    with pytest.raises(RuntimeError) as raised:
        reload_in_fresh_process(str(missing), ["The dog is nice."], loader="saved_model_load",
                                timeout=300)
    message = str(raised.value)
    assert message.startswith(f"saved_model_load could not reload {missing} in a fresh process")
    assert "Traceback" in message  # the child's own stderr follows


@pytest.mark.parametrize("trainable,changed", [(True, 2), (False, 0)])
def test_fit_changes_counts_the_trainable_weights_that_moved(trainable, changed):
    inputs = keras.Input(shape=(3,))
    layer = keras.layers.Dense(4, trainable=trainable)
    model = keras.Model(inputs, keras.layers.Dense(2)(layer(inputs)))
    batch = tf.constant(np.random.default_rng(0).normal(size=(8, 3)), tf.float32)
    count = fit_changes(model, layer, batch,
                        keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert int(count) == changed
