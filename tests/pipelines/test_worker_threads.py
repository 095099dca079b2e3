"""lealla_tf.pipelines.worker_threads: a host's cores shared out among the local
runner's worker processes and among a dask cluster's workers on it; a worker's quick exit."""

import os

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


def test_a_runner_s_worker_that_loaded_its_model_exits_without_collecting(corpus_model,
                                                                         tmp_path):
    """The interpreter's last garbage collections over a loaded model take seconds of
    each worker's exit: in a Beam worker process (the variable Beam sets in its
    harness's environment), once the model is loaded, the exit freezes the
    collector first (a hook registered before the load runs after it), and the
    exit status stands. In any other process, no hook."""
    import atexit
    import subprocess
    import sys

    from lealla_tf.pipelines.worker_threads import HARNESS_VARIABLE, quick_exit

    path, _ = corpus_model
    script = tmp_path / "worker.py"
    script.write_text(
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('at exit:', gc.get_freeze_count() > 0, gc.isenabled()))\n"
        "from lealla_tf.pipelines.corpus_steps import _embedder\n"
        "print('before:', gc.get_freeze_count() > 0, gc.isenabled())\n"
        "_embedder(sys.argv[1], None, 1)\n"
        "sys.exit(3)\n")
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **{HARNESS_VARIABLE: "url: ''"})
    done = subprocess.run([sys.executable, str(script), path], capture_output=True, text=True,
                          timeout=300, env=environment)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == ["before: False True", "at exit: True False"]
    # this process is no runner's worker
    hooks = atexit._ncallbacks()
    quick_exit()
    assert atexit._ncallbacks() == hooks


def test_a_worker_gets_one_exit_hook_however_many_models_it_loads(monkeypatch):
    import atexit

    from lealla_tf.pipelines import worker_threads

    monkeypatch.setenv(worker_threads.HARNESS_VARIABLE, "url: ''")
    hooks = atexit._ncallbacks()
    try:
        worker_threads.quick_exit()
        worker_threads.quick_exit()
        assert atexit._ncallbacks() == hooks + 1
    finally:  # this process exits as before
        atexit.unregister(worker_threads._freeze_collector)
        worker_threads._register_exit_hook.cache_clear()
