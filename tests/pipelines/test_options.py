"""lealla_tf.pipelines.options: the local-runner default and save_main_session."""

from apache_beam.options.pipeline_options import SetupOptions, StandardOptions

from lealla_tf.pipelines.options import pipeline_options


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
