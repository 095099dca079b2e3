"""How `lealla_tf.pipelines.embed_corpus` spreads a run over a dask cluster.

Beam's DaskRunner cuts a pipeline into dask.bag partitions only at its Create,
and every step after keeps as many, GroupByKey included; a partition is one dask
task. A run over one input file would be one partition from its read to its
shards: one worker embedding every shard while the others idle. `dask_reads`
gives the run one partition a shard and reads files in parts to fill them;
`spread_keys` sends each shard to a partition of its own.
"""

import math
import os
from collections.abc import Sequence

from apache_beam.options.pipeline_options import StandardOptions

from lealla_tf.pipelines.corpus_steps import pair_destination


def dask_reads(options, num_files: int, num_shards: int) -> tuple[int, int | None]:
    """(the parts each input file is read in, the partitions of the shards'
    GroupByKey) for `options`' runner: (1, None) but on the DaskRunner.

    Unless --dask_npartitions or --dask_partition_size says otherwise, the run
    is given one partition a shard (--dask_npartitions is set to `num_shards`
    here), and each file is read in as many parts as it takes for the reads to
    fill them; `spread_keys` then deals the shards to them evenly.
    """
    if "DaskRunner" not in str(options.view_as(StandardOptions).runner):
        return 1, None
    from apache_beam.runners.dask.dask_runner import DaskOptions  # noqa: PLC0415 - dask is heavy

    dask = options.view_as(DaskOptions)
    if dask.partition_size:
        return 1, math.ceil(num_files / dask.partition_size)
    if not dask.npartitions:
        dask.npartitions = num_shards
    parts = math.ceil(dask.npartitions / num_files)
    reads = num_files * parts
    # dask.bag.from_sequence's cut of `reads` items into npartitions
    size = (math.ceil(reads / dask.npartitions) if reads <= 100
            else max(1, reads // dask.npartitions))
    return parts, math.ceil(reads / size)


def shard_keys(files: Sequence[str], root: str, pairs: bool, num_shards: int) -> list[tuple]:
    """Every (prefix, shard) key `ReadLines` can give the lines of `files`, sorted."""
    prefixes = ({pair_destination(os.path.relpath(path, root) if root else os.path.basename(path))
                 for path in files} if pairs else {"embeddings"})
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
