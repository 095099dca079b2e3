"""One way to get `strings -> unit embeddings` from any model a user has.

`load_embedder(model)` accepts:
  - an exported LEALLA-format SavedModel (strings in, embeddings out);
  - a LaBSE/2-format pair: a directory with `preprocessor/` and `encoder/`
    (our `--format=labse` export, or the teacher from export/convert_teacher.py);
  - a training model directory (config.json + checkpoints);
  - a TF-Hub handle of either kind (this one needs the network, by the user's choice).
The result is L2-normalised float32, batched inside the caller.
"""

import os

import numpy as np
import tensorflow as tf


class Embedder:
    """Callable: strings (list or tf.string tensor) -> float32 `[n, d]` unit rows."""

    def __init__(self, embed_fn, dimension: int, description: str):
        self._embed = embed_fn
        self.dimension = dimension
        self.description = description

    def __call__(self, strings) -> np.ndarray:
        strings = tf.constant(strings) if not isinstance(strings, tf.Tensor) else strings
        return np.asarray(self._embed(strings), dtype=np.float32)


def _unit(x):
    return tf.math.l2_normalize(tf.cast(x, tf.float32), axis=-1)


def load_embedder(model: str) -> Embedder:
    """Loads `model` (see the module docstring) once; returns an `Embedder`."""
    import tensorflow_text  # noqa: F401  (text ops of the exported tokenizers)

    from lealla_tf.data import trim_to_longest

    spec = [tf.TensorSpec([None], tf.string)]
    if os.path.isdir(os.path.join(model, "preprocessor")) and os.path.isdir(
            os.path.join(model, "encoder")):
        preprocessor = tf.saved_model.load(os.path.join(model, "preprocessor"))
        encoder = tf.saved_model.load(os.path.join(model, "encoder"))

        @tf.function(input_signature=spec)
        def embed_pair(strings):
            return _unit(encoder(trim_to_longest(preprocessor(strings)))["default"])

        fn, description = embed_pair, f"LaBSE/2-format pair {model}"
    elif os.path.exists(os.path.join(model, "config.json")) and os.path.isdir(
            os.path.join(model, "checkpoints")):
        from lealla_tf.model_dir import load_encoder, load_tokenizer

        encoder, tokenizer = load_encoder(model), load_tokenizer(model)

        @tf.function(input_signature=spec)
        def embed_checkpoint(strings):
            return encoder(tokenizer(strings), training=False)["sentence_embedding"]

        fn, description = embed_checkpoint, f"model directory {model}"
    elif os.path.exists(os.path.join(model, "saved_model.pb")) or "://" in model:
        loaded = tf.saved_model.load(model) if "://" not in model else __import__(
            "tensorflow_hub").load(model)

        @tf.function(input_signature=spec)
        def embed_saved_model(strings):
            output = loaded(strings)
            if isinstance(output, dict):
                output = output["default"]
            return _unit(output)

        fn, description = embed_saved_model, f"SavedModel {model}"
    else:
        raise FileNotFoundError(
            f"{model} is neither a SavedModel, a LaBSE/2-format directory "
            "(preprocessor/ + encoder/), nor a training model directory")
    dimension = int(fn(tf.constant(["dimension probe"])).shape[-1])
    return Embedder(fn, dimension, description)
