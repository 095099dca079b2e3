"""A LEALLA export as a Keras 3 layer that embeds strings and fine-tunes in `fit`."""

from lealla_tf.models.keras_adapter import SharedWeightsTFSMLayer


class LeallaSavedModelLayer(SharedWeightsTFSMLayer):
    """An exported LEALLA model (strings -> unit embeddings) in a Keras 3 model.

    Keras 3's own `TFSMLayer` returns the signature's dict (`{"default": ...}`)
    and, with `trainable=True`, cannot train in `fit`: it tracks copies of the
    SavedModel's variables that the restored function never reads, named
    `...:0`, which the optimizers refuse as slot names. This layer returns the
    embedding tensor and tracks the variables the function reads, under names
    Keras accepts (`lealla_tf.models.keras_adapter.SharedWeightsTFSMLayer`), so
    `fit` updates the model it calls.

    Args:
        path: the export's directory (`export/export_tfhub.py --format=lealla`).
        trainable: fine-tune the encoder's weights with the rest of the model.

    Example:
    ```python
    import tensorflow_text  # the export's tokenizer ops
    text = keras.Input(shape=(), dtype="string")
    vectors = LeallaSavedModelLayer("runs/recipe/export/lealla_small")(text)
    model = keras.Model(text, keras.layers.Dense(2)(vectors))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(tf.data.Dataset.from_tensor_slices((sentences, labels)).batch(32))
    ```
    """

    def __init__(self, path, trainable=False, **kwargs):
        super().__init__(path, call_endpoint="serving_default", trainable=trainable, **kwargs)

    def call(self, inputs, training=False, **kwargs):
        outputs = super().call(inputs, training=training, **kwargs)
        return outputs["default"] if isinstance(outputs, dict) else outputs

    def get_config(self):
        config = super().get_config()
        config.pop("call_endpoint", None)
        config.pop("call_training_endpoint", None)
        config["path"] = config.pop("filepath")
        return config
