"""Pipeline options shared by the Beam pipelines in `lealla_tf.pipelines`, and
how they run (`run_pipeline`: on the DaskRunner, in which order and on which
worker each task runs)."""

import contextlib
import logging

from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

# Beam knows the DaskRunner only by its full name.
RUNNER_ALIASES = {"--runner=DaskRunner":
                  "--runner=apache_beam.runners.dask.dask_runner.DaskRunner"}


def pipeline_options(pipeline_args, save_main_session: bool = False,
                     default_runner: bool = True) -> PipelineOptions:
    """PipelineOptions for a pipeline.

    Without a --runner flag (and with `default_runner`) it runs on Beam's
    FnApiRunner, the local runner without DirectRunner's attempt to download
    Prism. The pipelines live in the installed package, so workers import their
    functions by name and the main session need not be pickled.
    """
    pipeline_args = [RUNNER_ALIASES.get(a, a) for a in pipeline_args]
    if default_runner and not any(a.startswith("--runner") for a in pipeline_args):
        pipeline_args.append("--runner=FnApiRunner")
    options = PipelineOptions(pipeline_args)
    options.view_as(SetupOptions).save_main_session = save_main_session
    return options


def unknown_beam_flags(pipeline_args) -> list:
    """The flags among `pipeline_args` (what a pipeline's own parser left) that
    Beam does not know either. Beam only warns about them and runs on, so a
    misspelled flag (`--thresold=1.2`) would be dropped without a word."""
    # The DaskRunner's options (--dask_client_address, ...) exist once it is imported.
    import apache_beam.runners.dask.dask_runner  # noqa: F401, PLC0415 - heavy (dask): for its flags
    logger = logging.getLogger("apache_beam.options.pipeline_options")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its "Discarding unparseable args" warning
    try:
        options = PipelineOptions([RUNNER_ALIASES.get(a, a) for a in pipeline_args])
        unknown = (set(options.get_all_options(retain_unknown_options=True))
                   - set(options.get_all_options()))
    finally:
        logger.setLevel(level)
    return [a for a in pipeline_args
            if a.startswith("-") and a.lstrip("-").split("=")[0].replace("-", "_") in unknown]


def parse_pipeline_flags(parser, argv=None):
    """`parser`'s flags and the rest for Beam, as `parse_known_args` splits them;
    a flag neither knows is a one-line error (`parser.error`, exit 2)."""
    known, pipeline_args = parser.parse_known_args(argv)
    unknown = unknown_beam_flags(pipeline_args)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (neither this pipeline's "
                     "flags nor Beam's)")
    return known, pipeline_args


# The tasks of dask.bag's task shuffle, the DaskRunner's GroupByKey: each input
# partition grouped, its groups split out, each output partition joined from them.
DASK_SHUFFLE_TASKS = ("shuffle-group", "shuffle-split", "shuffle-join")


def shuffles_first(key) -> int:
    """The dask priority of a task of the DaskRunner's graph (higher runs first on
    a worker): 1 for a shuffle's tasks, 0 for the others.

    A worker runs one task a thread. Where a shuffle's small tasks wait on a
    worker behind a long one (a shard's embedding), the step they feed waits
    with them, on whichever worker dask gave it, idle meanwhile: the shards of
    a run land three on one worker and one on the other. Run first, they hand
    out every group before any long task starts."""
    name = key[0] if isinstance(key, tuple) else key
    return int(str(name).startswith(DASK_SHUFFLE_TASKS))


def on_dask_runner(options) -> bool:
    """Whether `options` run the pipeline on Beam's DaskRunner."""
    return "DaskRunner" in str(options.view_as(StandardOptions).runner)


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
    to be when it becomes ready, which can leave a worker idle while another
    holds several shards. It is a preference: annotated with
    `allow_other_workers`, a task whose worker is gone (killed, restarted
    under another address) runs on another, and an idle worker may still
    steal a waiting one. Every task carries a restriction (which turns off
    dask's queuing of root tasks), and a worker that joins after the run
    starts gets only what it steals. Beyond `MAX_SPREAD_PARTITIONS` the
    shuffle's keys have another shape and its tasks are left to dask."""

    def __init__(self, workers):
        self.workers = sorted(workers)

    def __call__(self, key) -> list[str]:
        partition = partition_of(key)
        if partition is None:
            return list(self.workers)
        return [self.workers[partition % len(self.workers)]]


def dask_connection(options) -> dict | None:
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
    connect = dask_connection(options)
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


# `run_pipeline`'s default: ask the cluster for its workers.
ASK_CLUSTER = object()


def _task_order(options, workers):
    """On the DaskRunner, the graph built inside is annotated with
    `shuffles_first` and, given workers (or on a cluster that lists them when
    asked), `PartitionWorkers`."""
    if not on_dask_runner(options):
        return contextlib.nullcontext()
    import dask  # noqa: PLC0415 - only with the DaskRunner

    if workers is ASK_CLUSTER:
        workers = dask_workers(options)
    elif isinstance(workers, str):
        raise TypeError(f"workers must be a list of worker addresses or None, got {workers!r}")
    if not workers:
        return dask.annotate(priority=shuffles_first)
    return dask.annotate(priority=shuffles_first, workers=PartitionWorkers(workers),
                         allow_other_workers=True)


def run_pipeline(pipeline, workers=ASK_CLUSTER) -> None:
    """Runs `pipeline` to the end (on the DaskRunner, with `shuffles_first`'s
    task order and `PartitionWorkers`' placement over `workers`: by default
    those the cluster lists now; a caller that has listed them already passes
    its list, or None for no placement, and the cluster is not asked again).
    The DaskRunner's result holds a client of the user's cluster: it is closed
    here (the cluster stays up), also on failure."""
    with _task_order(pipeline.options, workers):
        result = pipeline.run()
    try:
        result.wait_until_finish()
    finally:
        if getattr(result, "client", None) is not None:
            result.client.close()
