"""lealla_tf.tensorflow_startup: what counts as start-up noise, and the import hook
that leaves it out of stderr (in a fresh process, `import lealla_tf` then TensorFlow:
tests/test_init.py)."""

import os
import sys

import pytest

from lealla_tf import tensorflow_startup
from lealla_tf.tensorflow_startup import is_log_noise


def test_log_noise_is_what_tensorflow_and_beam_workers_print_as_they_start():
    noise = ["WARNING: All log messages before absl::InitializeLog() is called are written to "
             "STDERR",
             "I0000 00:00:1795682891.780398    4335 port.cc:153] oneDNN custom operations are on.",
             "W1126 08:01:02.123456    4335 gpu_device.cc:2] some warning",
             "E0000 00:00:1795682895.281743    4335 cuda_platform.cc:52] failed call to cuInit",
             "To enable the following instructions: AVX2 FMA, in other operations, rebuild",
             "INFO:apache_beam.runners.worker.sdk_worker:Control channel established.",
             "WARNING:root:apitools not found, and bigquery client libraries are not available",
             "WARNING:__main__:No semi_persistent_directory found:  User registered objects"]
    for line in noise:
        assert is_log_noise(line, 3), line
    kept = ["F0000 00:00:1795682895.281743    4335 x.cc:1] Check failed: fatal",
            "error: --k must be at least 1", "embedding:  50% (1/2) [00:01<00:01, 1.0batch/s]",
            "WARNING:apache_beam.io.filesystem:a real warning",
            "Traceback (most recent call last):"]
    for line in kept:
        assert not is_log_noise(line, 3), line
    # TF_CPP_MIN_LOG_LEVEL=2 keeps TensorFlow's errors, 0 all of its lines
    assert not is_log_noise(noise[3], 2) and is_log_noise(noise[2], 2)
    assert not any(is_log_noise(line, 0) for line in noise[:5])


def installed_filters():
    return [finder for finder in sys.meta_path
            if isinstance(finder, tensorflow_startup._QuietTensorFlowImport)]


@pytest.fixture()
def fresh_start(monkeypatch):
    """A process as it starts: no filter yet, TensorFlow not loaded, no quieting
    variable set, and a stderr to filter; all restored afterwards."""
    monkeypatch.setattr(sys, "meta_path", [finder for finder in sys.meta_path if not isinstance(
        finder, tensorflow_startup._QuietTensorFlowImport)])
    if "tensorflow" in sys.modules:
        monkeypatch.delitem(sys.modules, "tensorflow")
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL",
                 tensorflow_startup.VERBOSE_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tensorflow_startup, "_has_stderr", lambda: True)
    return monkeypatch


def test_importing_lealla_tf_filters_tensorflows_first_import_once(fresh_start):
    fresh_start.setattr(tensorflow_startup, "gpu_driver_present", lambda: False)
    tensorflow_startup.quiet_tensorflow_import()
    tensorflow_startup.quiet_tensorflow_import()
    assert [f._min_level for f in installed_filters()] == [3]
    assert tensorflow_startup.min_log_level() == 3  # the cuInit error is hidden too


def test_the_users_choices_are_kept(fresh_start):
    fresh_start.setattr(tensorflow_startup, "gpu_driver_present", lambda: True)
    tensorflow_startup.quiet_tensorflow_import()  # a GPU's errors matter: level 0 stays
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    assert not installed_filters()
    fresh_start.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    tensorflow_startup.quiet_tensorflow_import()
    assert [f._min_level for f in installed_filters()] == [1]
    for name, value in (("TF_CPP_MAX_VLOG_LEVEL", "1"),
                        (tensorflow_startup.VERBOSE_VARIABLE, "1")):
        fresh_start.setattr(sys, "meta_path", [])
        fresh_start.setenv(name, value)
        tensorflow_startup.quiet_tensorflow_import()
        assert not installed_filters(), name
        fresh_start.delenv(name)


def test_no_filter_once_tensorflow_is_loaded_or_without_a_stderr(fresh_start):
    fresh_start.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    fresh_start.setattr(tensorflow_startup, "_has_stderr", lambda: False)
    tensorflow_startup.quiet_tensorflow_import()
    assert not installed_filters()
    fresh_start.setitem(sys.modules, "tensorflow", object())
    tensorflow_startup.filter_tensorflow_import(3)
    assert not installed_filters()


def test_a_missing_stderr_is_none_to_filter(monkeypatch):
    """A daemon's, or pythonw's: holding it would fail `import tensorflow` itself."""
    monkeypatch.setattr(sys, "stderr", None)
    assert not tensorflow_startup._has_stderr()


def test_the_filter_hands_every_other_import_on():
    hook = tensorflow_startup._QuietTensorFlowImport(3)
    assert hook.find_spec("json") is None and hook.find_spec("tensorflow_text") is None
