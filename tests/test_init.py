"""The package's import-time defaults and its public names."""

import os
import subprocess
import sys

import pytest

import lealla_tf


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
