"""The package's import-time defaults and its public names."""

import os
import re
import subprocess
import sys

import pytest

import lealla_tf
from lealla_tf import tensorflow_startup


def _after_import(code, environment=None):
    return subprocess.run([sys.executable, "-c", f"import lealla_tf, os, sys; {code}"],
                          env=environment, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_onednn_kernels_are_on_unless_the_user_chose():
    environment = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    code = "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'))"
    assert _after_import(code, environment) == "1"
    assert _after_import(code, {**environment, "TF_ENABLE_ONEDNN_OPTS": "0"}) == "0"


def test_importing_the_package_loads_no_tensorflow():
    """The public names load their modules when first used, so a command line's
    --help and `import lealla_tf` stay fast."""
    assert _after_import("print('tensorflow' in sys.modules)") == "False"


def test_every_public_name_resolves_and_each_thing_has_one():
    for name in lealla_tf.__all__:
        value = getattr(lealla_tf, name)
        assert getattr(value, "__name__", name) == name  # PRESETS is a dict
    from lealla_tf.inference.loaders import load_embedder

    assert lealla_tf.load_embedder is load_embedder
    for gone in ("load", "no_such_name"):  # `load` was `load_embedder` under a second name
        with pytest.raises(AttributeError, match=f"no attribute '{gone}'"):
            getattr(lealla_tf, gone)


# TensorFlow's C++ start-up lines: absl's notice, log lines (oneDNN, CUDA drivers, the
# failed cuInit of a machine without a GPU, CUDA plugins registered twice) and the
# CPU-feature notice.
START_UP_LINES = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl|"
                            r"To enable the following instructions)|cuInit|Unable to register")


def _start_up_lines(code, level):
    """The start-up lines `python -c code` prints to stderr in the environment a user
    has: none of the suite's quieting variables, TF_CPP_MIN_LOG_LEVEL=`level` (None:
    unset)."""
    environment = {k: v for k, v in os.environ.items() if k not in (
        "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "CUDA_VISIBLE_DEVICES",
        "LEALLA_TF_VERBOSE")}
    if level is not None:
        environment["TF_CPP_MIN_LOG_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if START_UP_LINES.search(line)]


# lealla_tf first, then what loads TensorFlow (a public name's module) and runs an op
# (where a machine without a GPU fails its cuInit).
USES_TENSORFLOW = ("import lealla_tf; lealla_tf.Tokenizer; import tensorflow as tf; "
                   "assert int(tf.reduce_sum(tf.ones([2]))) == 2")


@pytest.mark.parametrize("level", [None, "3"], ids=["unset", "3"])
def test_tensorflow_starts_silently_in_a_program_that_imports_lealla_tf(level):
    """A CPU user's program sees none of TensorFlow's start-up lines, whether it leaves
    TF_CPP_MIN_LOG_LEVEL unset or sets it to 3 (which TensorFlow's libraries read only
    after their first lines)."""
    if level is None and tensorflow_startup.gpu_driver_present():
        pytest.skip("with an NVIDIA driver TensorFlow's own log level applies")
    assert _start_up_lines(USES_TENSORFLOW, level) == []


def test_a_user_who_asks_for_tensorflows_lines_sees_them():
    """TF_CPP_MIN_LOG_LEVEL=0, the user's choice, is kept: every line shows."""
    assert _start_up_lines(USES_TENSORFLOW, "0")
