"""lealla_tf.pipelines.worker_threads: a host's cores shared out among the local
runner's worker processes and among a dask cluster's workers on it."""

import pytest

from lealla_tf.pipelines.worker_threads import dask_worker_threads, threads_per_worker


def test_local_worker_processes_share_the_cores_out():
    from apache_beam.options.pipeline_options import PipelineOptions

    from lealla_tf.machine import usable_cpus

    def threads(args, asked=None):
        return threads_per_worker(PipelineOptions(args), asked)

    multi = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    assert threads(multi) == max(1, usable_cpus() // 2)
    assert threads(["--direct_num_workers=64", "--direct_running_mode=multi_processing"]) == 1
    assert threads(["--direct_num_workers=2"]) is None  # threads of one process: its own pool
    # 0 is Beam's "a worker a core"
    assert threads(["--direct_num_workers=0", "--direct_running_mode=multi_processing"]) == 1
    assert threads([]) is None
    assert threads(multi, asked=3) == 3 and threads(multi, asked=0) == 0
    with pytest.raises(ValueError, match="--threads_per_worker must be at least 0"):
        threads(multi, asked=-1)


def test_dask_workers_share_their_hosts_cores_out(dask_cluster):
    """On each of the two local dask workers a model gets half this host's cores
    (at least one); outside a dask worker there is nothing to share."""
    import distributed

    from lealla_tf.machine import usable_cpus

    assert dask_worker_threads() is None
    with distributed.Client(dask_cluster.scheduler_address) as client:
        futures = [client.submit(dask_worker_threads, pure=False) for _ in range(2)]
        assert {future.result() for future in futures} == {max(1, usable_cpus() // 2)}
