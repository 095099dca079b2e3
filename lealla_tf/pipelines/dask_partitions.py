"""How `lealla_tf.pipelines.embed_corpus` spreads a run over a dask cluster.

Beam's DaskRunner cuts a pipeline into dask.bag partitions only at its Create,
and every step after keeps as many (GroupByKey too, up to
`MAX_SPREAD_PARTITIONS`); a partition is one dask task. A run over one input
file would be one partition from its read to its shards: one worker embedding
every shard while the others idle. `dask_reads` gives the run a partition a
shard and reads files in parts to fill them; `spread_keys` sends each shard to
a partition of its own.

On a cluster the runner connects to (--dask_client_address or
--dask_scheduler_file), `warm_workers` starts each worker's model load before
the run (and `options.PartitionWorkers` says which worker runs each
partition's tasks).
`EMBEDDING_WORKER_CONFIG` holds the settings of a cluster made for embedding.
"""

import logging
import math
from collections import Counter
from collections.abc import Sequence

from lealla_tf.pipelines.corpus_steps import file_name, pair_destination, warm_embedder
from lealla_tf.pipelines.options import dask_connection, on_dask_runner
from lealla_tf.pipelines.worker_threads import cores_each

# dask.bag's task shuffle (the DaskRunner's GroupByKey) has exactly as many output
# partitions as input ones, each key at int(tokenize(key), 16) modulo their number,
# up to its max_branch (32); beyond, it shuffles in stages over another layout.
MAX_SPREAD_PARTITIONS = 32


def dask_reads(options, files: Sequence[str],
               num_shards: int) -> tuple[list[tuple[str, int, int]], int | None]:
    """(the reads, each (file, part, parts), the partitions `spread_keys`
    deals the shards to, or None) for `options`' runner: each file read
    whole, and None, but on the DaskRunner.

    There, unless --dask_npartitions or --dask_partition_size says otherwise,
    the run asks for a partition a shard (--dask_npartitions is set to
    `num_shards` here, at most `MAX_SPREAD_PARTITIONS`), and the files are
    read in as many parts, in all, as there are partitions (fewer files than
    partitions: each file in one part or more; more: each file whole). Each
    part reads its file through, so a compressed file is decompressed once a
    part. None (no spreading: the shuffle's own hash) beyond
    `MAX_SPREAD_PARTITIONS`.
    """
    whole = [(path, 0, 1) for path in files]
    if not on_dask_runner(options):
        return whole, None
    from apache_beam.runners.dask.dask_runner import DaskOptions  # noqa: PLC0415 - dask is heavy

    dask = options.view_as(DaskOptions)
    if dask.partition_size:
        partitions = math.ceil(len(files) / dask.partition_size)
        return whole, partitions if partitions <= MAX_SPREAD_PARTITIONS else None
    if not dask.npartitions:
        dask.npartitions = min(num_shards, MAX_SPREAD_PARTITIONS)
    wanted = dask.npartitions
    reads = []
    for index, path in enumerate(files):
        parts = max(1, wanted // len(files) + (index < wanted % len(files)))
        reads += [(path, part, parts) for part in range(parts)]
    # dask.bag.from_sequence's cut of the reads into `wanted` partitions
    size = (math.ceil(len(reads) / wanted) if len(reads) <= 100
            else max(1, len(reads) // wanted))
    partitions = math.ceil(len(reads) / size)
    return reads, partitions if partitions <= MAX_SPREAD_PARTITIONS else None


def shard_keys(files: Sequence[str], root: str, pairs: bool, num_shards: int) -> list[tuple]:
    """Every (prefix, shard) key `ReadLines` can give the lines of `files`, sorted."""
    prefixes = ({pair_destination(file_name(path, root)) for path in files} if pairs
                else {"embeddings"})
    return sorted((prefix, shard) for prefix in prefixes for shard in range(num_shards))


def spread_keys(keys: Sequence[tuple], partitions: int) -> dict[tuple, tuple]:
    """{key: key + (salt,)}, the salt chosen so that Beam's DaskRunner gives
    the i-th of `keys` to output partition i modulo `partitions` of its
    GroupByKey (one dask task each): its GroupByKey is dask.bag's task
    shuffle, which sends a key to partition int(tokenize(key), 16) modulo the
    partitions, so the shard keys alone can pile several shards into one task
    and leave a worker idle. Other runners group the extended keys alike.
    Should dask place keys otherwise, the shards stay correct, only less even."""
    from dask.base import tokenize  # noqa: PLC0415 - dask only where the DaskRunner runs

    spread = {}
    for index, key in enumerate(keys):
        salt = 0
        while int(tokenize(key + (salt,)), 16) % partitions != index % partitions:
            salt += 1
        spread[key] = key + (salt,)
    return spread


# Dask settings for the workers of a cluster that embeds, set where the cluster is made
# (`dask.config.set(EMBEDDING_WORKER_CONFIG)` before a LocalCluster, or the same keys in
# the workers' dask config): a worker's statistical profiler walks every thread's stack
# 100 times a second, and the nanny's MALLOC_TRIM_THRESHOLD_ (64 KiB, which also fixes
# glibc's mmap threshold) has freed memory handed back after each batch only to be
# faulted in again on the next; neither is of use to a worker that runs one long
# embedding task after another. None unsets the variable (the nanny skips it), whether
# the key is set alone or merged into dask's defaults; a variable already in the
# environment the workers start from still reaches them.
EMBEDDING_WORKER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
}


def warm_workers(options, model: str, max_seq_length: int | None = None,
                 threads: int | None = None) -> list[str] | None:
    """Starts every worker's load of `model` now, before the run is even built:
    a worker's first shard waits for that load (TensorFlow's import, then
    `load_embedder`), which otherwise starts with the worker's first read.
    `threads` as `corpus_steps.warm_embedder` takes them (None: the host's cores
    shared out among the cluster's workers on it).

    Returns the cluster's worker addresses, sorted, for `options.run_pipeline`
    to place the run on without asking again; None where the runner starts its
    own cluster, the cluster lists no workers yet, or it cannot be asked (a
    warning says why): dask then places the tasks itself. Where a worker fails
    to start its load, a warning says so and the reads start the loads, as on
    every runner."""
    connect = dask_connection(options)
    if connect is None:
        return None
    import distributed  # noqa: PLC0415 - only with the DaskRunner

    workers = None
    try:
        with distributed.Client(**connect) as client:
            listed = client.scheduler_info()["workers"]
            workers = sorted(listed) or None
            sharing = dict(Counter(info.get("host") for info in listed.values()))
            client.run(_warm_here, model, max_seq_length, threads, sharing)
    except Exception as error:  # the reads start the loads instead
        logging.warning("the dask workers could not start loading %s ahead (%s); each loads "
                        "it with its first read%s", model, error,
                        "" if workers else ", and dask places the tasks itself")
    return workers


def _warm_here(model: str, max_seq_length, threads, sharing: dict, dask_worker=None) -> bool:
    """On a dask worker (`Client.run`, in its event loop): imports the pipeline's
    steps, then starts this worker's model load (`warm_embedder`'s thread).

    The pipeline's steps (Beam, TensorFlow) are imported with this module, as
    `Client.run` unpickles it, and `warm_workers` returns only once every worker
    has them: the run's tasks, sent after, import Beam too, and Beam imported
    by two threads at once can fail on its own circular imports ("partially
    initialized module 'apache_beam.runners'"). The worker's event loop waits
    for that import."""
    if threads is None and dask_worker is not None:
        from distributed.comm import get_address_host  # noqa: PLC0415 - on a dask worker

        threads = cores_each(sharing.get(get_address_host(dask_worker.address), 1))

    warm_embedder(model, max_seq_length, threads)  # its own thread loads the model
    return True
