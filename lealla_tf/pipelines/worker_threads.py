"""A pipeline worker process around its model: TensorFlow threads (the cores
shared out among the worker processes on a host, the local runner's or a dask
cluster's, so N workers do not each start TensorFlow pools of every core, and
the cap applied before the model loads), and, in a Beam runner's worker
process, an exit that does not wait on the garbage collector (`quick_exit`)."""

import atexit
import functools
import gc
import logging
import os
import sys

import tensorflow as tf
from apache_beam.options.pipeline_options import DirectOptions

from lealla_tf.machine import usable_cpus


def threads_per_worker(options, asked: int | None = None) -> int | None:
    """TensorFlow threads for each worker's model: `asked` when given (0: TensorFlow's
    own default, all cores), else, when the local runner starts several worker
    processes (--direct_num_workers=N --direct_running_mode=multi_processing), this
    host's cores shared out among them, so N workers do not each start a pool of
    every core (chosen by benchmarks/beam_throughput.py --workers=2, run before
    and after the change: commit 1325bec, which made it); else None: TensorFlow's
    default, but on a dask worker, which shares its host's cores out among the
    dask workers there when it loads the model (`dask_worker_threads`)."""
    if asked is not None:
        if asked < 0:
            raise ValueError(f"--threads_per_worker must be at least 0 (0: TensorFlow's "
                             f"default), got {asked}")
        return asked
    direct = options.view_as(DirectOptions)
    # 0 is Beam's "a worker a core"
    workers = usable_cpus() if direct.direct_num_workers == 0 else direct.direct_num_workers or 1
    if workers > 1 and direct.direct_running_mode == "multi_processing":
        return cores_each(workers)
    return None


def dask_worker_threads() -> int | None:
    """Inside a dask.distributed worker's task: this host's cores shared out among
    the cluster's workers on this host, as `threads_per_worker`
    shares them among the local runner's processes (N workers each starting
    TensorFlow pools of every core would oversubscribe them); None outside a
    dask worker or where the scheduler cannot be asked."""
    if "distributed" not in sys.modules:  # no dask worker runs this process
        return None
    try:
        from distributed import get_client, get_worker  # noqa: PLC0415 - only with dask

        worker = get_worker()
    except (ImportError, ValueError):
        return None
    from distributed.comm import get_address_host  # noqa: PLC0415

    host = get_address_host(worker.address)
    try:
        workers = get_client().scheduler_info()["workers"].values()
    except Exception as error:  # the share is an optimisation, never a failure
        logging.warning("embed_corpus: the dask scheduler did not say which workers share "
                        "this host (%s); TensorFlow keeps its default threads", error)
        return None
    return cores_each(sum(1 for info in workers if info.get("host") == host))


def cores_each(workers_on_host: int) -> int:
    """This host's cores shared out among `workers_on_host` worker processes, the local
    runner's or a dask cluster's (at least one each)."""
    return max(1, usable_cpus() // max(1, workers_on_host))


def limit_threads(threads: int) -> bool:
    """Caps this process's TensorFlow thread pools (intra- and inter-op) at
    `threads`; False, with a warning, where TensorFlow already runs here (its pools
    are fixed at start-up: an in-process runner's worker is the caller's process)."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        logging.warning("embed_corpus: TensorFlow already started in this process; "
                        "its thread pools stay as they are (threads per worker: %d asked)",
                        threads)
        return False
    return True


# Set by Beam in the environment of every SDK harness process it starts.
HARNESS_VARIABLE = "CONTROL_API_SERVICE_DESCRIPTOR"


def quick_exit() -> None:
    """In a worker process a Beam runner started (its SDK harness, which has
    `HARNESS_VARIABLE` in its environment), once, after its model loads: at
    exit, every object then alive is frozen out of the garbage collector. A
    loaded TensorFlow model is some 170,000 Python objects, and the
    interpreter's last cyclic collections over them take seconds of a worker's
    exit, which the run waits for (the local runner closes its worker
    processes one after another).

    The process's memory goes back to the system as ever, but objects in
    reference cycles are then never finalized (no `__del__`, no flush of a
    file left open among them): the pipeline's steps close what they write,
    and the hook stays out of every other process (a caller's own, where an
    in-process runner loads the model, and a dask worker, which outlives the
    run). Earlier exit hooks still run; the exit status is untouched."""
    if HARNESS_VARIABLE in os.environ:
        _register_exit_hook()


@functools.cache  # one hook however many models load
def _register_exit_hook() -> None:
    atexit.register(_freeze_collector)  # hooks run last-registered first


def _freeze_collector() -> None:
    gc.disable()
    gc.freeze()
