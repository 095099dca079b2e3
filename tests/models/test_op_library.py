"""The kernels' library in this process (lealla_tf.models.kernels.op_library): built
and loaded here, turned off by the switch, and a machine without a compiler or a
library without the ops trains without them, with one warning."""

import os
import pathlib
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.models import kernels
from lealla_tf.models.kernels import trusted_cache

if shutil.which(os.environ.get("CXX", "g++")) is None:  # pragma: no cover - CI has g++
    pytest.skip("no C++ compiler to build the fused kernels", allow_module_level=True)
if tf.config.list_physical_devices("GPU"):  # pragma: no cover - CI is a CPU
    pytest.skip("the fused kernels are CPU-only; TensorFlow sees a GPU here",
                allow_module_level=True)


def test_the_library_builds_and_loads_here():
    assert kernels.available(), kernels.unavailable_reason()
    assert kernels.usable()
    assert kernels.library_path().exists()
    # built once: a second build finds it in the cache
    assert kernels.build() == kernels.library_path()


def test_without_a_compiler_training_falls_back_with_one_warning(tmp_path):
    """A machine without g++: one warning naming why, and the op-by-op layers train."""
    script = (
        "import numpy as np, tensorflow as tf\n"
        "from lealla_tf.models import kernels\n"
        "from lealla_tf.configs import EncoderConfig\n"
        "from lealla_tf.models.encoder import build_encoder\n"
        "assert not kernels.available() and not kernels.available()\n"
        "print('reason:', kernels.unavailable_reason())\n"
        "encoder = build_encoder(EncoderConfig(vocabulary_size=30, num_layers=2, num_heads=2,\n"
        "                                      hidden_dim=8, intermediate_dim=16))\n"
        "ids = tf.constant([[2, 5, 3]])\n"
        "out = encoder.forward({'input_word_ids': ids, 'input_mask': tf.ones_like(ids),\n"
        "                       'input_type_ids': tf.zeros_like(ids)}, training=True,\n"
        "                      fused_kernels=kernels.usable())\n"
        "print('trained', out['sentence_embedding'].shape)\n")
    environment = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"),
                   kernels.CACHE: str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reason: no C++ compiler" in done.stdout
    assert "trained (1, 8)" in done.stdout
    assert done.stderr.count("training without the fused kernels") == 1


def test_the_switch_turns_them_off(monkeypatch):
    monkeypatch.setenv(kernels.SWITCH, "0")
    assert not kernels.available() and not kernels.usable()
    assert kernels.unavailable_reason() == f"{kernels.SWITCH}=0"


def test_only_a_computation_on_cpus_may_use_them():
    assert kernels.usable()  # the default strategy, this process's CPU
    on_a_gpu = types.SimpleNamespace(extended=types.SimpleNamespace(
        worker_devices=["/job:localhost/replica:0/task:0/device:GPU:0"]))
    assert not kernels.usable(on_a_gpu)
    two_cpus = types.SimpleNamespace(extended=types.SimpleNamespace(
        worker_devices=["/device:CPU:0", "/device:CPU:1"]))
    assert kernels.usable(two_cpus)


def test_a_foreign_library_with_a_matching_checksum_falls_back_with_one_warning(tmp_path,
                                                                            monkeypatch):
    """A foreign library under the cached name, with a matching checksum: loaded,
    found to lack the ops, refused with one warning naming them."""
    monkeypatch.setenv(kernels.CACHE, str(tmp_path / "cache"))
    library = kernels.library_path()
    library.parent.mkdir(parents=True)
    library.write_bytes(pathlib.Path(np.linalg._umath_linalg.__file__).read_bytes())
    kernels.checksum_path(library).write_text(trusted_cache.fingerprint(library) + "\n")
    script = "from lealla_tf.models import kernels; print('available', kernels.available())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "available False" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "is not the fused kernels' library" in lines[0], done.stderr
    assert "lealla_attention" in lines[0]
    done = subprocess.run([sys.executable, "-m", "lealla_tf.models.kernels", "--strict"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert done.returncode == 1 and "is not the fused kernels' library" in done.stderr
