"""Beam's DaskRunner on a cluster it connects to (--dask_client_address or
--dask_scheduler_file): which worker runs each partition's tasks
(`PartitionWorkers`, the annotation `run_pipeline` builds the graph under), and
each worker's model load started before the run (`warm_workers`).

Importing it loads neither dask nor TensorFlow: a worker imports it to run
`warm_workers`' function in its event loop, which must not wait on an import.
"""

import logging
import threading
from collections import Counter

from lealla_tf.machine import usable_cpus


def partition_of(key) -> int | None:
    """The bag partition a task of the DaskRunner's graph works on, or None: a
    step's task is (name, partition); a shuffle's group and join tasks end in
    (partition,), and its split tasks in their input's (partition,)."""
    if not isinstance(key, tuple) or len(key) < 2:
        return None
    last = key[-1]
    if isinstance(last, tuple) and len(last) == 1:
        last = last[0]
    return last if isinstance(last, int) and not isinstance(last, bool) else None


class PartitionWorkers:
    """The dask `workers` annotation that places partition i's tasks on the i-th
    (modulo their number) of `workers`, a cluster's worker addresses; a task of
    no partition may run on any of them.

    The DaskRunner's run has a partition a shard (`dask_partitions`), and its
    shards are of about equal size, so this deals them evenly. Left to the
    scheduler, a shard's task goes where its inputs or an idle moment happen
    to be when it becomes ready: some runs put three of four shards on one of
    two workers. Annotated with `allow_other_workers`, a task whose worker is
    gone (killed, restarted under another address) runs on another."""

    def __init__(self, workers):
        self.workers = sorted(workers)

    def __call__(self, key) -> list[str]:
        partition = partition_of(key)
        if partition is None:
            return list(self.workers)
        return [self.workers[partition % len(self.workers)]]


def _connection(options) -> dict | None:
    """`distributed.Client`'s arguments for the cluster the DaskRunner connects
    to, or None where the runner starts a cluster of its own."""
    from apache_beam.runners.dask.dask_runner import DaskOptions  # noqa: PLC0415 - dask is heavy

    dask_options = options.view_as(DaskOptions)
    if not (dask_options.address or dask_options.scheduler_file):
        return None
    connect = {"address": dask_options.address, "scheduler_file": dask_options.scheduler_file}
    if dask_options.timeout is not None:  # else dask's own connect timeout, as the runner's
        connect["timeout"] = dask_options.timeout
    return connect


def dask_workers(options) -> list[str] | None:
    """The worker addresses of the cluster the DaskRunner connects to, sorted, or
    None: the runner starts a cluster of its own, or the cluster cannot be
    asked (a warning says why)."""
    connect = _connection(options)
    if connect is None:
        return None
    import distributed  # noqa: PLC0415 - only with the DaskRunner

    try:
        with distributed.Client(**connect) as client:
            return sorted(client.scheduler_info()["workers"]) or None
    except Exception as error:  # placement is an optimisation; the run reports its errors
        logging.warning("the dask scheduler did not list its workers (%s); dask places the "
                        "tasks itself", error)
        return None


def warm_workers(options, model: str, max_seq_length: int | None = None,
                 threads: int | None = None) -> int:
    """Starts every worker's load of `model` now, before the run is even built:
    a worker's first shard waits for that load (TensorFlow's import, then
    `load_embedder`), which otherwise starts with the worker's first read.
    `threads` as `corpus_steps.warm_embedder` takes them (None: the host's cores
    shared out among the cluster's workers on it). Returns how many workers
    were asked; 0 where the runner starts its own cluster or the cluster
    cannot be asked (a warning says why), and the reads start the loads, as
    on every runner."""
    connect = _connection(options)
    if connect is None:
        return 0
    import distributed  # noqa: PLC0415 - only with the DaskRunner

    try:
        with distributed.Client(**connect) as client:
            workers = client.scheduler_info()["workers"]
            sharing = dict(Counter(info.get("host") for info in workers.values()))
            client.run(_warm_here, model, max_seq_length, threads, sharing)
    except Exception as error:  # the reads start the loads instead
        logging.warning("the dask workers could not start loading %s ahead (%s); each loads "
                        "it with its first read", model, error)
        return 0
    return len(workers)


def _warm_here(model: str, max_seq_length, threads, sharing: dict, dask_worker=None) -> bool:
    """On a dask worker (`Client.run`, in its event loop): starts this worker's
    model load in a thread and returns at once."""
    if threads is None and dask_worker is not None:
        from distributed.comm import get_address_host  # noqa: PLC0415 - on a dask worker

        threads = max(1, usable_cpus() // max(1, sharing.get(
            get_address_host(dask_worker.address), 1)))

    def load():
        from lealla_tf.pipelines.corpus_steps import warm_embedder  # noqa: PLC0415 - TensorFlow

        warm_embedder(model, max_seq_length, threads)

    threading.Thread(target=load, name="warm_workers", daemon=True).start()
    return True
