"""Small Keras layers used by the encoders, one public class a module
(`l2_normalization`, `masked_mean_pooling`), and the counter-hash dropout their
forward pass and the fused kernels share (`hash_dropout`: functions, no layer)."""

from lealla_tf.models.layers.l2_normalization import L2Normalization
from lealla_tf.models.layers.masked_mean_pooling import MaskedMeanPooling

__all__ = ["L2Normalization", "MaskedMeanPooling"]
