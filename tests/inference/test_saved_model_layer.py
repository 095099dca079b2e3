"""LeallaSavedModelLayer on a tiny SavedModel with a LEALLA export's signature
(strings -> {"default": vectors}): the tensor out, the SavedModel's own variables
tracked under names Keras accepts, training in `fit`, its config. A real export
in a Keras 3 model:
tests/inference/test_formats.py::test_lealla_format_trains_inside_fit_in_both_keras."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.inference.saved_model_layer import LeallaSavedModelLayer

SENTENCES = tf.constant(["a", "bbb", "cc", "dddd"])


class TinyExport(tf.Module):
    """Strings -> {"default": length / 10 * kernel + offset}, with a slash in each
    variable's name as an exported encoder's have."""

    def __init__(self):
        super().__init__()
        self.kernel = tf.Variable([[0.5, -0.5]], name="encoder/dense/kernel")
        self.offset = tf.Variable([0.1, 0.2], trainable=False, name="encoder/offset")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, inputs):
        lengths = tf.cast(tf.strings.length(inputs), tf.float32)[:, None] / 10.0
        return {"default": lengths * self.kernel + self.offset}


def expected(kernel, offset=(0.1, 0.2)):
    lengths = np.array([[1.0], [3.0], [2.0], [4.0]]) / 10.0
    return lengths * np.asarray(kernel) + np.asarray(offset)


@pytest.fixture(scope="module")
def export_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_export"))
    module = TinyExport()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


def test_the_layer_returns_the_embedding_tensor(export_path):
    layer = LeallaSavedModelLayer(export_path)
    out = layer(SENTENCES)
    assert not isinstance(out, dict)
    np.testing.assert_allclose(out, expected([[0.5, -0.5]]), atol=1e-6)
    assert not layer.trainable_weights  # frozen unless trainable=True
    # Keras' own TFSMLayer returns the signature's dict
    plain = keras.layers.TFSMLayer(export_path, call_endpoint="serving_default")
    assert set(plain(SENTENCES)) == {"default"}


def test_it_tracks_the_variables_the_function_reads_under_names_keras_accepts(export_path):
    layer = LeallaSavedModelLayer(export_path, trainable=True)
    assert sorted(w.name for w in layer.weights) == ["encoder_dense_kernel", "encoder_offset"]
    assert [w.name for w in layer.trainable_weights] == ["encoder_dense_kernel"]
    # the tracked variable is the one the function reads, not a copy
    layer.trainable_weights[0].assign([[1.0, 2.0]])
    np.testing.assert_allclose(layer(SENTENCES), expected([[1.0, 2.0]]), atol=1e-6)
    # Keras' own TFSMLayer keeps the ':0', which its optimizers refuse in a slot name
    plain = keras.layers.TFSMLayer(export_path, call_endpoint="serving_default",
                                   trainable=True)
    assert all(w.name.endswith(":0") for w in plain.weights)


def test_fit_trains_the_saved_models_weights(export_path):
    layer = LeallaSavedModelLayer(export_path, trainable=True)
    text = keras.Input(shape=(), dtype="string")
    model = keras.Model(text, keras.layers.Dense(1)(layer(text)))
    model.compile(keras.optimizers.Adam(0.05), "mse")
    targets = tf.constant([[1.0], [3.0], [2.0], [4.0]])
    before = layer.trainable_weights[0].numpy().copy()
    history = model.fit(SENTENCES, targets, epochs=20, batch_size=4, verbose=0)
    after = layer.trainable_weights[0].numpy()
    assert np.abs(after - before).max() > 1e-2
    assert history.history["loss"][-1] < history.history["loss"][0]
    np.testing.assert_allclose(layer(SENTENCES), expected(after), atol=1e-5)
    np.testing.assert_allclose(layer.weights[1].numpy(), [0.1, 0.2])  # not trainable


def test_its_config_names_the_path_and_rebuilds_the_layer(export_path):
    layer = LeallaSavedModelLayer(export_path, trainable=True, name="encoder_layer")
    config = layer.get_config()
    assert config["path"] == export_path and config["trainable"] is True
    assert "filepath" not in config and "call_endpoint" not in config
    clone = LeallaSavedModelLayer.from_config(config, safe_mode=False)
    assert clone.name == "encoder_layer"
    np.testing.assert_allclose(clone(SENTENCES), layer(SENTENCES), atol=1e-6)
    # loading an external SavedModel from a config stays refused in Keras' safe mode
    with pytest.raises(ValueError, match="safe_mode"):
        LeallaSavedModelLayer.from_config(config, safe_mode=True)
