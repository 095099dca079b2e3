"""Mean of token vectors over the non-padding positions."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="lealla_tf")
class MaskedMeanPooling(keras.layers.Layer):
    """Averages `[B, T, d]` over positions where `mask` is 1.

    This is the pooling of sentence-transformers models (all-MiniLM-L6-v2): the
    sum of token vectors times the mask, divided by the number of real tokens
    (floored at 1 so an all-padding row gives zeros, not NaN).

    Example:
    ```python
    pooled = MaskedMeanPooling()(sequence_output, input_mask)
    ```
    """

    def call(self, sequence, mask):
        weights = ops.expand_dims(ops.cast(mask, sequence.dtype), -1)
        total = ops.sum(sequence * weights, axis=1)
        count = ops.maximum(ops.sum(weights, axis=1), 1.0)
        return total / count

    def compute_output_shape(self, sequence_shape, mask_shape=None):
        return (sequence_shape[0], sequence_shape[-1])
