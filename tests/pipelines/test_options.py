"""lealla_tf.pipelines.options: the local-runner default and save_main_session; on
the DaskRunner, a shuffle's tasks first and each partition on its worker."""

import time

import dask
import dask.bag
import pytest
from apache_beam.options.pipeline_options import SetupOptions, StandardOptions

from lealla_tf.pipelines.options import (
    PartitionWorkers,
    dask_workers,
    partition_of,
    pipeline_options,
    run_pipeline,
    shuffles_first,
)


class RecordingPipeline:
    """Stands in for a Beam pipeline in run_pipeline: records the dask
    annotations its graph would be built under."""

    def __init__(self, flags):
        self.options = pipeline_options(flags)
        self.annotations = None

    def run(self):
        self.annotations = dict(dask.get_annotations())
        return self

    def wait_until_finish(self):
        pass


def test_defaults_to_the_fn_api_runner():
    options = pipeline_options([], save_main_session=True)
    assert options.view_as(StandardOptions).runner == "FnApiRunner"
    assert options.view_as(SetupOptions).save_main_session is True


def test_keeps_a_given_runner_and_can_leave_it_unset():
    given = pipeline_options(["--runner=DataflowRunner"], save_main_session=False)
    assert given.view_as(StandardOptions).runner == "DataflowRunner"
    assert given.view_as(SetupOptions).save_main_session is False
    unset = pipeline_options([], save_main_session=False, default_runner=False)
    assert unset.view_as(StandardOptions).runner is None


def test_a_shuffles_tasks_come_first_on_the_dask_runner_only():
    # Keys as dask.bag's task shuffle and Beam's DaskRunner name them.
    assert shuffles_first(("shuffle-split-5b93614761a0ad0f", 1, 1, (3,))) == 1
    assert shuffles_first(("shuffle-group-5b93614761a0ad0f", 1, (0,))) == 1
    assert shuffles_first(("shuffle-join-5b93614761a0ad0f", 0, (2,))) == 1
    # Dask names a fused chain of steps after its parts: a Beam step fused with the
    # shuffle stage it feeds is not a shuffle's own small task.
    assert shuffles_first(("apply_dofn_to_bundle-concat-shuffle-join-0f84d333", 0, (9,))) == 0
    assert shuffles_first(("from_sequence-apply_dofn_to_bundle-c6059c79", 0)) == 0
    assert shuffles_first("finalize-hlgfinalizecompute-62c11b60") == 0
    # The pinned dask's own task shuffle (the DaskRunner's GroupByKey) is recognised.
    grouped = dask.bag.from_sequence(range(40), npartitions=4).groupby(lambda n: n % 3,
                                                                       shuffle="tasks")
    names = {(key[0] if isinstance(key, tuple) else key)
             for key in dict(grouped.__dask_graph__())}
    stages = {name.rsplit("-", 1)[0] for name in names if shuffles_first((name,))}
    assert {"shuffle-group", "shuffle-split"} <= stages

    on_dask = RecordingPipeline(["--runner=DaskRunner"])
    local = RecordingPipeline(["--runner=FnApiRunner"])
    run_pipeline(on_dask)
    run_pipeline(local)
    assert on_dask.annotations == {"priority": shuffles_first}
    assert local.annotations == {}
    assert dask.get_annotations() == {}  # nothing left behind


def test_on_a_cluster_it_connects_to_each_partition_also_goes_to_its_worker(dask_cluster):
    address = dask_cluster.scheduler_address

    pipeline = RecordingPipeline(["--runner=DaskRunner", f"--dask_client_address={address}"])
    run_pipeline(pipeline)
    assert pipeline.annotations["priority"] is shuffles_first
    assert pipeline.annotations["allow_other_workers"] is True
    assert pipeline.annotations["workers"].workers == sorted(
        dask_cluster.workers[name].worker_address for name in dask_cluster.workers)
    assert dask.get_annotations() == {}  # nothing left behind


def test_workers_listed_before_the_run_are_used_without_asking_the_cluster_again(caplog):
    # A scheduler that would not answer: asked, it would cost a connect timeout
    # and a warning. Given the workers (as `warm_workers` returns them), or None
    # (no placement), run_pipeline does not ask.
    flags = ["--runner=DaskRunner", "--dask_client_address=127.0.0.1:9",
             "--dask_connection_timeout=5"]
    listed, unplaced = RecordingPipeline(flags), RecordingPipeline(flags)
    started = time.monotonic()
    run_pipeline(listed, ["tcp://127.0.0.1:9002", "tcp://127.0.0.1:9001"])
    run_pipeline(unplaced, None)
    assert time.monotonic() - started < 4  # asking would cost the 5 s connect timeout
    assert listed.annotations["workers"].workers == ["tcp://127.0.0.1:9001",
                                                     "tcp://127.0.0.1:9002"]
    assert listed.annotations["priority"] is shuffles_first
    assert unplaced.annotations == {"priority": shuffles_first}
    assert "did not list its workers" not in caplog.text
    with pytest.raises(TypeError, match="a list of worker addresses"):
        run_pipeline(RecordingPipeline(flags), "tcp://127.0.0.1:9001")


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
