"""The package's import-time defaults."""

import os
import subprocess
import sys


def _onednn_after_import(environment):
    code = "import lealla_tf, os; print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'))"
    return subprocess.run([sys.executable, "-c", code], env=environment, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_onednn_kernels_are_on_unless_the_user_chose():
    environment = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    assert _onednn_after_import(environment) == "1"
    assert _onednn_after_import({**environment, "TF_ENABLE_ONEDNN_OPTS": "0"}) == "0"
