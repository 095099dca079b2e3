"""L2 normalisation of the last axis, as a serializable layer."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="lealla_tf")
class L2Normalization(keras.layers.Layer):
    """Scales each row to unit L2 norm; an all-zero row stays zero (finite).

    Computed in float32 whatever the layer's compute dtype or the global
    policy, its inputs never cast down first, because the embeddings feed
    cosine similarities with a scale of 100 in the AMS loss.

    Args:
        epsilon: float. Floor on the squared norm.

    Example:
    ```python
    layer = L2Normalization()
    layer(np.array([[3.0, 4.0]]))  # [[0.6, 0.8]]
    ```
    """

    def __init__(self, epsilon=1e-12, **kwargs):
        # Keras would cast the inputs to a mixed policy's compute dtype before
        # `call`: a float32 embedding rounded to bfloat16 (6e-4 on unit rows).
        kwargs["autocast"] = False
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        squared_norm = ops.sum(ops.square(x), axis=-1, keepdims=True)
        return x * ops.rsqrt(ops.maximum(squared_norm, self.epsilon))

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(inputs.shape, dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({"epsilon": self.epsilon})
        return config
