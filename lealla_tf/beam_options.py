"""Pipeline options shared by the scripts in beam_pipelines/."""

import sys

from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions


def pipeline_options(pipeline_args, module_name: str, save_main_session: bool,
                     default_runner: bool = True) -> PipelineOptions:
    """PipelineOptions for a pipeline script.

    Without a --runner flag (and with `default_runner`) it runs on Beam's
    FnApiRunner, the local runner without DirectRunner's attempt to download
    Prism. When the script is imported rather than run (tests, the main job),
    workers cannot import it by name, so its functions and DoFns are shipped
    by value.
    """
    pipeline_args = list(pipeline_args)
    if default_runner and not any(a.startswith("--runner") for a in pipeline_args):
        pipeline_args.append("--runner=FnApiRunner")
    if module_name != "__main__":
        from apache_beam.internal.cloudpickle import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[module_name])
    options = PipelineOptions(pipeline_args)
    options.view_as(SetupOptions).save_main_session = save_main_session
    return options
