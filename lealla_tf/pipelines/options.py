"""Pipeline options shared by the Beam pipelines in `lealla_tf.pipelines`."""

from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions

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


def run_pipeline(pipeline) -> None:
    """Runs `pipeline` to the end. The DaskRunner's result holds a client of the
    user's cluster: it is closed here (the cluster stays up), also on failure."""
    result = pipeline.run()
    try:
        result.wait_until_finish()
    finally:
        if getattr(result, "client", None) is not None:
            result.client.close()
