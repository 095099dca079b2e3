"""Choosing a tf.distribute strategy, with the TPU flag validated before any connection.

`--tpu=grpc://host:port` with nothing listening makes TensorFlow's
`experimental_connect_to_cluster` hang forever, and a TPU *name* makes it ask the
GCE metadata server; so the flag is checked first and a clear error replaces the
hang. Nothing here opens a connection unless the user passed `--tpu`.
"""

import os
import socket
import urllib.parse

import tensorflow as tf

STRATEGIES = ("default", "mirrored", "tpu")


class TPUUnavailableError(RuntimeError):
    """--tpu was given but no TPU can be reached; the message says why."""


def check_tpu_flag(tpu: str, connect_timeout: float = 5.0) -> str:
    """Validates `--tpu` and returns the address TensorFlow should use.

    - `local`: a TPU VM; its devices must exist (`/dev/accel*` or `/dev/vfio`).
    - `grpc://host:port`: the worker must accept a TCP connection within
      `connect_timeout` seconds (TensorFlow itself would wait forever).
    - any other name: a Cloud TPU resolved through the GCE metadata server,
      which exists only on Google Cloud VMs.
    """
    if not tpu or not tpu.strip():
        raise TPUUnavailableError("--tpu is empty; pass local, grpc://host:port or a TPU name")
    tpu = tpu.strip()
    if tpu == "local":
        devices = [d for d in ("/dev/accel0", "/dev/vfio/0") if os.path.exists(d)]
        if not devices:
            raise TPUUnavailableError(
                "--tpu=local but this machine has no TPU devices (/dev/accel0 or /dev/vfio/0)")
        return tpu
    if "://" in tpu:
        parsed = urllib.parse.urlparse(tpu)
        if parsed.scheme != "grpc" or not parsed.hostname or not parsed.port:
            raise TPUUnavailableError(f"--tpu={tpu!r} is not of the form grpc://host:port")
        try:
            with socket.create_connection((parsed.hostname, parsed.port),
                                          timeout=connect_timeout):
                pass
        except OSError as error:
            raise TPUUnavailableError(
                f"no TPU worker answers at {parsed.hostname}:{parsed.port} ({error}); "
                "check the address, or run without --tpu") from None
        return tpu
    product = "/sys/class/dmi/id/product_name"
    on_gce = os.path.exists(product) and "Google" in open(product).read()
    if not on_gce:
        raise TPUUnavailableError(
            f"--tpu={tpu!r} names a Cloud TPU, which is resolved through the GCE metadata "
            "server, but this is not a Google Cloud VM; pass --tpu=grpc://host:port instead")
    return tpu


def make_strategy(strategy: str = "default", tpu: str = None) -> tf.distribute.Strategy:
    """The strategy for training.

    Args:
        strategy: "default" (one device: the CPU or the first GPU), "mirrored"
            (all local GPUs, or the logical CPU devices when there are none),
            or "tpu" (needs `tpu`).
        tpu: the `--tpu` flag; implies strategy "tpu".
    """
    if tpu:
        address = check_tpu_flag(tpu)
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if strategy == "tpu":
        raise TPUUnavailableError("--strategy=tpu needs --tpu=local|grpc://host:port|<name>")
    if strategy == "mirrored":
        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
        if gpus:
            return tf.distribute.MirroredStrategy(gpus)
        # NCCL is GPU-only: reduce on one device when mirroring logical CPUs.
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(
            cpus, cross_device_ops=tf.distribute.ReductionToOneDevice())
    if strategy != "default":
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return tf.distribute.get_strategy()
