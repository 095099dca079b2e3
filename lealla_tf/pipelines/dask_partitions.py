"""How `lealla_tf.pipelines.embed_corpus` spreads a run over a dask cluster.

Beam's DaskRunner cuts a pipeline into dask.bag partitions only at its Create,
and every step after keeps as many (GroupByKey too, up to
`MAX_SPREAD_PARTITIONS`); a partition is one dask task. A run over one input
file would be one partition from its read to its shards: one worker embedding
every shard while the others idle. `dask_reads` gives the run a partition a
shard and reads files in parts to fill them; `spread_keys` sends each shard to
a partition of its own.
"""

import math
from collections.abc import Sequence

from lealla_tf.pipelines.corpus_steps import file_name, pair_destination
from lealla_tf.pipelines.options import on_dask_runner

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
