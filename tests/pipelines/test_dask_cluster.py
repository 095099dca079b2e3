"""lealla_tf.pipelines.dask_cluster: on a cluster the DaskRunner connects to,
each partition's tasks on one worker in turn, and the workers' model loads
started before the run."""

import time

from lealla_tf.machine import usable_cpus
from lealla_tf.pipelines.dask_cluster import (
    PartitionWorkers,
    dask_workers,
    partition_of,
    warm_workers,
)
from lealla_tf.pipelines.options import pipeline_options


def test_each_partition_of_the_dask_runner_s_graph_goes_to_one_worker_in_turn():
    # Keys as dask.bag's task shuffle and Beam's DaskRunner name them (a real run's
    # placement: tests/pipelines/test_embed_corpus.py).
    assert partition_of(("from_sequence-apply_dofn_to_bundle-c6059c79", 3)) == 3
    assert partition_of(("apply_dofn_to_bundle-shuffle-join-0f84d333", 0, (2,))) == 2
    assert partition_of(("shuffle-group-5b93614761a0ad0f", 1, (5,))) == 5
    # a split task stays with its input partition (the last), not the output it feeds
    assert partition_of(("shuffle-split-5b93614761a0ad0f", 1, 7, (1,))) == 1
    assert partition_of("finalize-hlgfinalizecompute-62c11b60") is None
    assert partition_of(("name", True)) is None and partition_of(("name",)) is None
    place = PartitionWorkers(["tcp://127.0.0.1:9002", "tcp://127.0.0.1:9001"])
    assert place(("apply_dofn_to_bundle-1", 0)) == ["tcp://127.0.0.1:9001"]
    assert place(("apply_dofn_to_bundle-1", 3)) == ["tcp://127.0.0.1:9002"]
    assert place(("shuffle-join-1", 0, (4,))) == ["tcp://127.0.0.1:9001"]
    assert place("finalize-1") == ["tcp://127.0.0.1:9001", "tcp://127.0.0.1:9002"]


def test_the_workers_are_those_of_the_cluster_the_runner_connects_to(dask_cluster, caplog):
    address = dask_cluster.scheduler_address
    listed = dask_workers(pipeline_options(["--runner=DaskRunner",
                                            f"--dask_client_address={address}"]))
    assert sorted(listed) == sorted(dask_cluster.workers[name].worker_address
                                    for name in dask_cluster.workers)
    # the runner's own cluster: nothing to ask beforehand
    assert dask_workers(pipeline_options(["--runner=DaskRunner"])) is None
    # a scheduler that does not answer: dask places the tasks itself, with a warning
    unreachable = pipeline_options(["--runner=DaskRunner", "--dask_client_address=127.0.0.1:9",
                                    "--dask_connection_timeout=1"])
    assert dask_workers(unreachable) is None
    assert "did not list its workers" in caplog.text


def test_every_worker_starts_loading_the_model_before_the_run(corpus_model, dask_cluster,
                                                              caplog):
    import distributed

    path, _ = corpus_model
    options = pipeline_options(["--runner=DaskRunner",
                                f"--dask_client_address={dask_cluster.scheduler_address}"])
    assert warm_workers(options, path) == 2

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
    assert warm_workers(pipeline_options(["--runner=DaskRunner"]), path) == 0
    unreachable = pipeline_options(["--runner=DaskRunner", "--dask_client_address=127.0.0.1:9",
                                    "--dask_connection_timeout=1"])
    assert warm_workers(unreachable, path) == 0
    assert "could not start loading" in caplog.text
