"""The keras-hub internals lealla_tf reads, in one place.

The fast forward pass (`lealla_tf.models.forward_pass`) computes a keras-hub
`TransformerEncoder` with fewer, larger ops, so it needs the layer's sublayers
(the attention's query, key, value and output projections, its dropout, the
feed-forward block, the two layer norms) and the attention's head count and
size. keras-hub has no public accessors for them; they are private attributes.
`KERAS_HUB_PARTS` names every one, `transformer_parts` reads them, and nothing
else in lealla_tf touches a private keras-hub attribute (tests/test_architecture.py
checks). A keras-hub release that renames one fails in `transformer_parts` with
the installed version and the missing attribute, and
tests/models/test_transformer_adapter.py fails with the same words.
"""

from typing import NamedTuple

import keras_hub

# {our name: attribute path on a keras-hub TransformerEncoder}.
KERAS_HUB_PARTS = {
    "attention": "_self_attention_layer",
    "heads": "_self_attention_layer._num_heads",
    "head_size": "_self_attention_layer._key_dim",
    "query_dense": "_self_attention_layer._query_dense",
    "key_dense": "_self_attention_layer._key_dense",
    "value_dense": "_self_attention_layer._value_dense",
    "attention_output_dense": "_self_attention_layer._output_dense",
    "attention_dropout": "_self_attention_layer._dropout_layer",
    "attention_norm": "_self_attention_layer_norm",
    "attention_output_dropout": "_self_attention_dropout",
    "intermediate_dense": "_feedforward_intermediate_dense",
    "output_dense": "_feedforward_output_dense",
    "feedforward_norm": "_feedforward_layer_norm",
    "feedforward_dropout": "_feedforward_dropout",
}


class TransformerParts(NamedTuple):
    """The sublayers of one keras-hub TransformerEncoder (`KERAS_HUB_PARTS`)."""

    attention: object
    heads: int
    head_size: int
    query_dense: object
    key_dense: object
    value_dense: object
    attention_output_dense: object
    attention_dropout: object
    attention_norm: object
    attention_output_dropout: object
    intermediate_dense: object
    output_dense: object
    feedforward_norm: object
    feedforward_dropout: object


class KerasHubInternalsError(RuntimeError):
    """The installed keras-hub builds its TransformerEncoder without an attribute
    that `KERAS_HUB_PARTS` names (the message says which, and the version)."""


def transformer_parts(layer) -> TransformerParts:
    """`layer`'s sublayers (a built keras-hub `TransformerEncoder`), as the fast
    forward pass uses them.

    Raises:
        KerasHubInternalsError: the installed keras-hub builds its
            TransformerEncoder otherwise (an attribute in `KERAS_HUB_PARTS` is
            gone), naming the attribute and the keras-hub version.
    """
    values = {}
    for name, path in KERAS_HUB_PARTS.items():
        value = layer
        for attribute in path.split("."):
            if not hasattr(value, attribute):
                raise KerasHubInternalsError(
                    f"keras-hub {keras_hub.__version__} builds TransformerEncoder without "
                    f"`{path}`, which lealla_tf's fast forward pass reads "
                    "(lealla_tf.models.transformer_adapter.KERAS_HUB_PARTS); install the "
                    "keras-hub version setup.py pins, or update KERAS_HUB_PARTS to its new name")
            value = getattr(value, attribute)
        values[name] = value
    return TransformerParts(**values)
