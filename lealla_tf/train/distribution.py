"""Choosing a tf.distribute strategy, with the TPU flag validated before any connection.

`--tpu=grpc://host:port` with nothing listening makes TensorFlow's
`experimental_connect_to_cluster` hang forever, and a TPU *name* makes it ask the
GCE metadata server; so the flag is checked first and a clear error replaces the
hang. Nothing here opens a connection unless the user passed `--tpu`.
"""

import json
import os
import socket
import threading
import urllib.parse
from typing import NamedTuple

import tensorflow as tf

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")


class TPUUnavailableError(RuntimeError):
    """--tpu was given but no TPU can be reached; the message says why."""


def check_tpu_flag(tpu: str, connect_timeout: float = 5.0) -> str:
    """Validates `--tpu` and returns the address TensorFlow should use.

    - `local`: a TPU VM; its devices must exist (`/dev/accel*` or `/dev/vfio`).
    - `grpc://host:port`: the worker must accept a TCP connection and answer
      the HTTP/2 preface as a gRPC server does, within `connect_timeout`
      seconds (TensorFlow itself would wait forever, on a silent listener too).
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
                                          timeout=connect_timeout) as connection:
                answers_grpc = _speaks_http2(connection, connect_timeout)
        except OSError as error:
            raise TPUUnavailableError(
                f"no TPU worker answers at {parsed.hostname}:{parsed.port} ({error}); "
                "check the address, or run without --tpu") from None
        if not answers_grpc:
            raise TPUUnavailableError(
                f"something listens at {parsed.hostname}:{parsed.port} but does not answer as a "
                f"gRPC (TPU) worker within {connect_timeout:g} s; check the address, or run "
                "without --tpu")
        return tpu
    product = "/sys/class/dmi/id/product_name"
    if os.path.exists(product):
        with open(product) as f:
            on_gce = "Google" in f.read()
    else:
        on_gce = False
    if not on_gce:
        raise TPUUnavailableError(
            f"--tpu={tpu!r} names a Cloud TPU, which is resolved through the GCE metadata "
            "server, but this is not a Google Cloud VM; pass --tpu=grpc://host:port instead")
    return tpu


# An HTTP/2 client opens with this preface and a SETTINGS frame; a gRPC server
# (a TPU worker's) answers with a SETTINGS frame of its own (frame type 4).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _speaks_http2(connection: socket.socket, timeout: float) -> bool:
    """True when the peer answers the HTTP/2 preface with a SETTINGS frame in time."""
    connection.settimeout(timeout)
    try:
        connection.sendall(_HTTP2_PREFACE + _EMPTY_SETTINGS_FRAME)
        header = b""
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except (TimeoutError, OSError):
        return False
    return header[3] == 4


def _within(seconds: float, function, message: str):
    """Runs `function` in a daemon thread; TPUUnavailableError after `seconds`.

    TensorFlow's cluster connection has no timeout of its own; a peer that
    speaks gRPC but is not a TPU worker would otherwise hang the run forever.
    """
    outcome = {}

    def target():
        try:
            outcome["value"] = function()
        except Exception as error:  # re-raised in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TPUUnavailableError(message)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def make_strategy(strategy: str = "default", tpu: str = None,
                  tpu_timeout: float = 300.0) -> tf.distribute.Strategy:
    """The strategy for training.

    Args:
        strategy: "default" (one device: the CPU or the first GPU), "mirrored"
            (all local GPUs, or the logical CPU devices when there are none),
            "multi_worker" (MultiWorkerMirroredStrategy across the processes that
            TF_CONFIG lists), or "tpu" (needs `tpu`).
        tpu: the `--tpu` flag; implies strategy "tpu".
        tpu_timeout: seconds allowed for connecting to and initialising the TPU.
    """
    if tpu:
        address = check_tpu_flag(tpu)
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        _within(tpu_timeout, lambda: (tf.config.experimental_connect_to_cluster(resolver),
                                      tf.tpu.experimental.initialize_tpu_system(resolver)),
                f"the TPU at {tpu} did not initialise within {tpu_timeout:g} s")
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
    if strategy == "multi_worker":
        return multi_worker_strategy()
    if strategy != "default":
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return tf.distribute.get_strategy()


def multi_worker_strategy() -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over the cluster in TF_CONFIG.

    Every worker runs the same command with its own TF_CONFIG (`cluster.worker`
    lists every worker's host:port, `task.index` says which one this is);
    worker 0 is the chief and writes checkpoints and logs. The variable is
    validated first, so a missing or malformed TF_CONFIG is a message, not a
    hang waiting for peers.
    """
    raw = os.environ.get("TF_CONFIG", "")
    if not raw:
        raise ValueError("--strategy=multi_worker needs TF_CONFIG, e.g. "
                         '{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, '
                         '"task": {"type": "worker", "index": 0}}')
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        index = int(config["task"]["index"])
        kind = config["task"]["type"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"TF_CONFIG is not valid ({error}): {raw[:200]}") from None
    if kind not in ("worker", "chief") or not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task {kind}:{index} is not one of the "
                         f"{len(workers)} workers")
    # RING collectives run over gRPC between the workers' CPUs (and GPUs); NCCL
    # would need a GPU on every worker.
    communication = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)


class WorkerRole(NamedTuple):
    """This process's place in a training cluster.

    chief: writes the model directory (checkpoints, logs, config); the others
        write their checkpoints to temporary directories and only read
        model_dir (to resume from the chief's checkpoint).
    name: e.g. "worker1" (for temporary directories and messages).
    workers: processes that run the training steps together.
    """
    chief: bool
    name: str
    workers: int


def worker_role(strategy: tf.distribute.Strategy) -> WorkerRole:
    """The `WorkerRole` of this process; one process (default, mirrored, TPU
    strategies; a MultiWorkerMirroredStrategy without TF_CONFIG) is the chief."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if (not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            or resolver is None or not resolver.task_type):
        return WorkerRole(chief=True, name="chief", workers=1)
    cluster = resolver.cluster_spec().as_dict()
    kind, index = resolver.task_type, int(resolver.task_id or 0)
    chief = kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)
    workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    return WorkerRole(chief=chief, name=f"{kind}{index}", workers=workers)


def any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """True when `flag` is true on at least one worker process.

    Every worker must call it at the same point (it is a collective): workers
    that decide alone to stop (a signal, a time budget) would leave the others
    waiting forever in the next step's all-reduce.
    """
    votes = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant(1.0 if flag else 0.0))
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, votes, axis=None)) > 0


def is_tpu_strategy(strategy: tf.distribute.Strategy) -> bool:
    """True for a TPUStrategy (its `run` compiles the whole replica function)."""
    return isinstance(strategy, (tf.distribute.TPUStrategy,
                                 tf.distribute.experimental.TPUStrategy))


def default_jit_compile(strategy: tf.distribute.Strategy) -> bool:
    """`--jit_compile`'s default: on under TPUStrategy, which runs only compiled
    steps; off elsewhere, where the fused CPU kernels' step is the one measured
    fastest (docs/benchmarks.md, "The compiled step")."""
    return is_tpu_strategy(strategy)


def resolve_jit_compile(requested: bool | None, strategy: tf.distribute.Strategy) -> bool:
    """The `jit_compile` setting (None: `default_jit_compile`) as a bool."""
    return default_jit_compile(strategy) if requested is None else bool(requested)
