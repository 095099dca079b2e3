"""The keras-hub internals the fast forward pass reads (lealla_tf.models.transformer_adapter):
all there in the installed keras-hub, every weight covered, and a clear error when
a release renames one."""

import types

import keras
import keras_hub
import numpy as np
import pytest

from lealla_tf.models.transformer_adapter import (
    KERAS_HUB_PARTS,
    KerasHubInternalsError,
    TransformerParts,
    transformer_parts,
)


def built_layer(heads=2, width=16, intermediate=32, dropout=0.1):
    layer = keras_hub.layers.TransformerEncoder(intermediate_dim=intermediate, num_heads=heads,
                                               dropout=dropout)
    layer(np.zeros((1, 3, width), "float32"))
    return layer


def test_every_part_is_there_with_the_kind_the_forward_pass_expects():
    parts = transformer_parts(built_layer())
    assert (parts.heads, parts.head_size) == (2, 8)
    for name in ("query_dense", "key_dense", "value_dense", "attention_output_dense"):
        assert len(getattr(parts, name).kernel.shape) == 3, name  # EinsumDense [d, heads, size]
    for name in ("intermediate_dense", "output_dense"):
        assert isinstance(getattr(parts, name), keras.layers.Dense), name
    for name in ("attention_norm", "feedforward_norm"):
        assert isinstance(getattr(parts, name), keras.layers.LayerNormalization), name
    for name in ("attention_dropout", "attention_output_dropout", "feedforward_dropout"):
        assert isinstance(getattr(parts, name), keras.layers.Dropout), name
        assert getattr(parts, name).rate == pytest.approx(0.1), name
    assert set(KERAS_HUB_PARTS) == set(TransformerParts._fields)


def test_the_parts_hold_every_weight_of_the_layer():
    """A keras-hub release that adds a weight (a bias, a norm) would be computed
    without it by the forward pass: every weight must belong to a part it reads."""
    layer = built_layer()
    parts = transformer_parts(layer)
    read = {id(w) for name in ("query_dense", "key_dense", "value_dense",
                               "attention_output_dense", "intermediate_dense", "output_dense",
                               "attention_norm", "feedforward_norm")
            for w in getattr(parts, name).weights}
    unread = [w.path for w in layer.weights if id(w) not in read]
    assert not unread, (f"keras-hub {keras_hub.__version__}'s TransformerEncoder has weights "
                        f"the fast forward pass does not read: {unread}")


def test_a_renamed_attribute_is_named_with_the_installed_version():
    renamed = types.SimpleNamespace(_self_attention_layer=types.SimpleNamespace())
    with pytest.raises(KerasHubInternalsError) as error:
        transformer_parts(renamed)
    message = str(error.value)
    assert f"keras-hub {keras_hub.__version__}" in message
    assert "without `_self_attention_layer._num_heads`" in message
    assert "KERAS_HUB_PARTS" in message and "setup.py" in message
    assert isinstance(error.value, RuntimeError)
