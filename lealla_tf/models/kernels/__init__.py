"""Fused CPU kernels for training `LeallaEncoder` (the C++ sources beside this file).

On a CPU, TensorFlow runs a transformer layer's elementwise work one op at a
time: layer norms, GELU, residual adds, dropout, softmax, transposes and their
gradients, which on lealla_small's training step take longer than its matmuls
in bfloat16 (`benchmarks/training_step.py --profile` groups the step's op
time). Four ops do that work in one pass each; this package compiles them for
this machine, loads them safely, and wraps them:

- `fused_ops`: the ops' Python wrappers (`attention`, `bias_gelu`,
  `bias_dropout_add_norm`, `sparse_apply_adamw`) and their gradients;
- `op_library`: the library in this process: `load`, and whether the kernels
  are `available` / `usable` (`LEALLA_TF_FUSED_KERNELS=0` turns them off, and a
  machine without a C++ compiler runs without them, with one warning);
- `native_build`: compiling the library with `-march=native` (`build`,
  `library_path`), on first use or by `python -m lealla_tf.models.kernels`,
  which the Makefile's setup runs;
- `trusted_cache`: the cache folder (`$LEALLA_TF_KERNEL_CACHE`, default
  `~/.cache/lealla_tf/kernels`) and whether a file there may be loaded: nothing
  is loaded from a folder or file another user could have written, and a
  library is loaded only through the descriptor whose size and sha256 were
  checked against those written beside it when it was built.

The names below are the package's API; the modules hold the rest.
"""

from lealla_tf.progress import quiet_startup_if_run_as

# `python -m lealla_tf.models.kernels` imports this package, and TensorFlow with it,
# before its __main__ runs: the command line is quieted here.
quiet_startup_if_run_as("lealla_tf.models.kernels")

from lealla_tf.models.kernels.fused_ops import (  # noqa: E402 - after the quieting above
    attention,
    bias_dropout_add_norm,
    bias_gelu,
    sparse_apply_adamw,
)
from lealla_tf.models.kernels.native_build import (  # noqa: E402
    SOURCES,
    SWITCH,
    build,
    library_path,
)
from lealla_tf.models.kernels.op_library import (  # noqa: E402
    OPS,
    available,
    enabled,
    load,
    unavailable_reason,
    usable,
)
from lealla_tf.models.kernels.trusted_cache import (  # noqa: E402
    BUILD_PREFIX,
    CACHE,
    KernelBuildError,
    cache_dir,
    checksum_path,
    trusted_folder,
    valid,
)

__all__ = [
    "BUILD_PREFIX", "CACHE", "OPS", "SOURCES", "SWITCH", "KernelBuildError", "attention",
    "available", "bias_dropout_add_norm", "bias_gelu", "build", "cache_dir", "checksum_path",
    "enabled", "library_path", "load", "sparse_apply_adamw", "trusted_folder",
    "unavailable_reason", "usable", "valid",
]
