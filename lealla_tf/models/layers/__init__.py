"""Small Keras layers used by the encoders (one public class per module)."""

from lealla_tf.models.layers.l2_normalization import L2Normalization
from lealla_tf.models.layers.masked_mean_pooling import MaskedMeanPooling

__all__ = ["L2Normalization", "MaskedMeanPooling"]
