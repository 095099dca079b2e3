"""The kernels' op library in this process: built if needed, loaded once, and
whether this process may use it.

`load()` builds the library (`native_build.build`), loads it through the very
descriptor that was checked (`trusted_cache.open_verified`, then
`/proc/self/fd/N`), and refuses a library that lacks the ops (`OPS`). A failure
is remembered: `available()` is then False, with one warning line naming why,
and training runs the op-by-op layers. `LEALLA_TF_FUSED_KERNELS=0` turns the
kernels off; `usable()` also needs the computation to be on CPUs only.
"""

import os
import pathlib
import sys

import tensorflow as tf

from lealla_tf.models.kernels.native_build import SWITCH, build
from lealla_tf.models.kernels.trusted_cache import KernelBuildError, NotLoadable, open_verified

# Every op the library must define; a library without them is not ours.
OPS = ("lealla_attention", "lealla_attention_grad", "lealla_bias_gelu", "lealla_bias_gelu_grad",
       "lealla_bias_dropout_add_norm", "lealla_bias_dropout_add_norm_grad",
       "lealla_sparse_apply_adam_w")

_state = {"library": None, "failure": None, "warned": False}


def enabled() -> bool:
    """False when `LEALLA_TF_FUSED_KERNELS` is 0 / false / off / no."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def load():
    """The loaded op library (built if needed). KernelBuildError when it cannot
    be built or loaded here (the first failure is remembered)."""
    if _state["library"] is not None:
        return _state["library"]
    if _state["failure"] is not None:
        raise KernelBuildError(_state["failure"])
    try:
        path = build()
        library = _load_verified(path)
        missing = [op for op in OPS if not hasattr(library, op)]
        if missing:
            raise KernelBuildError(f"{path} is not the fused kernels' library (it lacks "
                                   f"{', '.join(missing)}); delete it to rebuild")
    except KernelBuildError as error:
        _state["failure"] = str(error)
        raise
    except (tf.errors.NotFoundError, OSError) as error:
        _state["failure"] = f"loading the fused kernels failed: {error}"
        raise KernelBuildError(_state["failure"]) from None
    _state["library"] = library
    return library


def _load_verified(path: pathlib.Path):
    """tf.load_op_library of the library at `path`, checked
    (`trusted_cache.open_verified`) before it is loaded, and loaded through the
    descriptor that was checked."""
    try:
        fd = open_verified(path)
    except NotLoadable as problem:
        raise KernelBuildError(f"the fused kernels {path} {problem}; not loaded") from None
    try:
        via = f"/proc/self/fd/{fd}"
        return tf.load_op_library(via if os.path.exists(via) else str(path))
    finally:
        os.close(fd)


def available() -> bool:
    """Whether the fused kernels can be used in this process: switched on, and
    built and loaded. The first failure is logged once as a warning with its reason."""
    if not enabled():
        return False
    try:
        load()
        return True
    except KernelBuildError as error:
        if not _state["warned"]:
            _state["warned"] = True
            print(f"warning: training without the fused kernels: {error}", file=sys.stderr)
        return False


def usable(strategy=None) -> bool:
    """`available()`, and `strategy` (default: the current one) computes on CPUs
    only: the kernels have no GPU or TPU version."""
    strategy = strategy or tf.distribute.get_strategy()
    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy: this process's devices
        devices = []
    accelerators = tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    if accelerators or any("CPU" not in device.upper() for device in devices):
        return False
    return available()


def unavailable_reason() -> str | None:
    """Why `available()` is False (None when it is True)."""
    if not enabled():
        return f"{SWITCH}={os.environ.get(SWITCH)}"
    return None if available() else _state["failure"]


