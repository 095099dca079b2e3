"""lealla_tf.pipelines.dask_partitions: on the DaskRunner a run gets a partition a
shard, reads its files in enough parts to fill them, and sends each shard to a
partition of its own; on a cluster it connects to, each partition's tasks go to
one worker in turn and the workers' model loads start before the run. (That the
DaskRunner's output equals the FnApiRunner's: tests/pipelines/test_embed_corpus.py.)"""

import time

from lealla_tf.machine import usable_cpus
from lealla_tf.pipelines.corpus_steps import ReadLines, shard_of
from lealla_tf.pipelines.dask_partitions import (
    EMBEDDING_WORKER_CONFIG,
    dask_reads,
    shard_keys,
    spread_keys,
    warm_workers,
)
from lealla_tf.pipelines.options import pipeline_options


def test_the_dask_runner_gets_a_partition_a_shard_and_reads_enough_parts_to_fill_them():
    """On the DaskRunner the files are read in as many parts, in all, as the run
    has partitions (a partition a shard unless given, at most 32); more files
    than partitions are read whole. Other runners read each file whole."""
    import dask.bag
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dask.dask_runner import DaskOptions

    from lealla_tf.pipelines.options import pipeline_options

    def reads(args, files, shards):
        options = pipeline_options(args)
        planned, partitions = dask_reads(options, [f"f{i}" for i in range(files)], shards)
        parts = [sum(1 for read in planned if read[0] == f"f{i}") for i in range(files)]
        assert all(read[2] == parts[int(read[0][1:])] for read in planned)
        assert sorted(planned) == sorted({read for read in planned})  # each part once
        return parts, partitions, options.view_as(DaskOptions).npartitions

    flags = ["--runner=DaskRunner"]
    assert reads(flags, 1, 4) == ([4], 4, 4)
    assert reads(flags, 3, 4) == ([2, 1, 1], 4, 4)
    assert reads(flags, 3, 8) == ([3, 3, 2], 8, 8)
    assert reads(flags, 200, 4) == ([1] * 200, 4, 4)
    assert reads(flags, 1, 64) == ([32], 32, 32)  # the task shuffle's one-stage limit
    assert reads(flags + ["--dask_npartitions=2"], 1, 4) == ([2], 2, 2)
    assert reads(flags + ["--dask_npartitions=40"], 1, 4) == ([40], None, 40)
    assert reads(flags + ["--dask_partition_size=16"], 40, 4) == ([1] * 40, 3, None)
    # dask.bag's own cut, which dask_reads follows: 400 reads asked into 7 give 8
    assert dask.bag.from_sequence(range(400), npartitions=7).npartitions == 8
    assert reads(flags + ["--dask_npartitions=7"], 400, 4)[1] == 8
    assert reads([], 2, 4) == ([1, 1], None, None)
    assert dask_reads(PipelineOptions([]), ["f0"], 4) == ([("f0", 0, 1)], None)


def test_spread_keys_deal_shards_evenly_to_the_dask_shuffles_partitions(tmp_path):
    """Each shard key gets a salt that sends it to its own partition of dask.bag's
    task shuffle (key -> int(tokenize(key), 16) % partitions); ReadLines keys
    its records with the salted key."""
    from dask.base import tokenize

    keys = shard_keys(["/in/deu-eng.tsv.gz", "/in/fra-eng.tsv"], "/in", True, 3)
    assert keys == [("deu-eng", 0), ("deu-eng", 1), ("deu-eng", 2), ("fra-eng", 0),
                    ("fra-eng", 1), ("fra-eng", 2)]
    assert shard_keys(["/in/a.txt", "/in/b.txt"], "/in", False, 2) == [
        ("embeddings", 0), ("embeddings", 1)]
    spread = spread_keys(keys, 4)
    assert [int(tokenize(spread[key]), 16) % 4 for key in keys] == [0, 1, 2, 3, 0, 1]
    assert all(spread[key][:2] == key for key in keys)
    (tmp_path / "a.txt").write_bytes(b"Der Hund.\n")
    lines = spread_keys(shard_keys([str(tmp_path / "a.txt")], str(tmp_path), False, 2), 2)
    ((kind, (key, _)), *_) = ReadLines(str(tmp_path), num_shards=2, spread=lines).process(
        (str(tmp_path / "a.txt"), 0, 1))
    assert key == lines["embeddings", shard_of("a.txt:1", 2)]


def test_every_worker_starts_loading_the_model_before_the_run(corpus_model, dask_cluster,
                                                              caplog):
    import distributed

    path, _ = corpus_model
    options = pipeline_options(["--runner=DaskRunner",
                                f"--dask_client_address={dask_cluster.scheduler_address}"])
    # the workers it asked, for the run's placement (tests/pipelines/test_options.py)
    assert warm_workers(options, path) == sorted(
        dask_cluster.workers[name].worker_address for name in dask_cluster.workers)

    def loaded(dask_worker):
        from lealla_tf.pipelines import corpus_steps
        from lealla_tf.pipelines.worker_threads import tf

        return ((path, None) in corpus_steps._MODELS,
                tf.config.threading.get_intra_op_parallelism_threads())

    with distributed.Client(dask_cluster.scheduler_address) as client:
        deadline = time.time() + 120
        while time.time() < deadline:
            states = list(client.run(loaded).values())
            if all(state[0] for state in states):
                break
            time.sleep(0.5)
    # loaded on each worker, on its share of the host's cores (two workers here)
    assert states == [(True, max(1, usable_cpus() // 2))] * 2
    # the runner's own cluster, or one that does not answer: the reads start the loads
    assert warm_workers(pipeline_options(["--runner=DaskRunner"]), path) is None
    unreachable = pipeline_options(["--runner=DaskRunner", "--dask_client_address=127.0.0.1:9",
                                    "--dask_connection_timeout=1"])
    assert warm_workers(unreachable, path) is None
    assert "could not start loading" in caplog.text


def test_a_cluster_made_for_embedding_runs_its_workers_without_profiler_or_trim(monkeypatch):
    import dask
    import distributed

    # a dask nanny leaves its variables in the environment of the process that made it
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with dask.config.set(EMBEDDING_WORKER_CONFIG):
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
    try:
        with distributed.Client(cluster.scheduler_address) as client:
            def state(dask_worker):
                import os

                return ("profile" in dask_worker.periodic_callbacks,
                        os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.environ.get("OMP_NUM_THREADS"))

            assert list(client.run(state).values()) == [(False, None, "1")]
    finally:
        cluster.close()
