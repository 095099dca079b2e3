"""The fused CPU kernels (lealla_tf.models.kernels) against the op-by-op TensorFlow they replace."""

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import dead_pid

from lealla_tf.models import kernels
from lealla_tf.models.layers import hash_dropout

if shutil.which(os.environ.get("CXX", "g++")) is None:  # pragma: no cover - CI has g++
    pytest.skip("no C++ compiler to build the fused kernels", allow_module_level=True)
if tf.config.list_physical_devices("GPU"):  # pragma: no cover - CI is a CPU
    pytest.skip("the fused kernels are CPU-only; TensorFlow sees a GPU here",
                allow_module_level=True)

SEED = tf.constant([123, -456], tf.int64)  # a negative word too: only its low 32 bits count


def test_the_library_builds_and_loads_here():
    assert kernels.available(), kernels.unavailable_reason()
    assert kernels.usable()
    assert kernels.library_path().exists()
    # built once: a second build finds it in the cache
    assert kernels.build() == kernels.library_path()


def reference_attention(qkv, bias, mask, heads, rate, seed):
    """What LeallaEncoder._forward computes op by op (float32)."""
    batch, length = mask.shape
    size = qkv.shape[1] // (3 * heads)
    x = tf.reshape(qkv + bias, [batch, length, 3, heads, size])
    query, key, value = tf.unstack(tf.transpose(x, [2, 0, 3, 1, 4]))
    key_bias = (1.0 - tf.cast(mask, tf.float32))[:, None, None, :] * -1e9
    probabilities = tf.nn.softmax(tf.matmul(query, key, transpose_b=True) + key_bias)
    if rate:
        probabilities = hash_dropout._drop(probabilities, seed, rate)
    context = tf.matmul(probabilities, value)
    return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch * length, heads * size])


def compare(fused, reference, inputs, atol=1e-5, gradient_atol=2e-5):
    """Outputs and input gradients (of a random projection) of two functions."""
    rng = np.random.default_rng(7)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        ours, theirs = fused(*inputs), reference(*inputs)
        weights = tf.constant(rng.normal(size=ours.shape), tf.float32)
        loss_ours, loss_theirs = tf.reduce_sum(ours * weights), tf.reduce_sum(theirs * weights)
    np.testing.assert_allclose(ours, theirs, atol=atol)
    for index, (a, b) in enumerate(zip(tape.gradient(loss_ours, inputs),
                                       tape.gradient(loss_theirs, inputs))):
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale,
                                   atol=gradient_atol, err_msg=f"gradient of input {index}")


@pytest.mark.parametrize("batch,length,heads,size", [
    (3, 7, 4, 16),   # lealla_small's head size, keys padded to 16
    (2, 17, 2, 8),   # layers24_hidden64's head size 8, 17 keys (two vectors)
    (2, 5, 3, 24),   # a head size that is no multiple of 16
    (1, 33, 1, 64),  # labse's head size
])
@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_attention_equals_the_op_by_op_layer(batch, length, heads, size, rate):
    rng = np.random.default_rng(batch * length)
    qkv = tf.constant(rng.normal(size=(batch * length, 3 * heads * size)), tf.float32)
    bias = tf.constant(rng.normal(size=(3 * heads * size,)), tf.float32)
    mask = np.ones((batch, length), np.int32)
    mask[-1, max(1, length // 2):] = 0  # padded keys in the last sequence
    mask = tf.constant(mask)
    compare(lambda q, b: kernels.attention(q, b, mask, SEED, heads, rate),
            lambda q, b: reference_attention(q, b, mask, heads, rate, SEED), [qkv, bias])


def test_attention_with_every_key_padded_is_keras_uniform_softmax():
    """Keras adds -1e9 to padded keys; with all of them padded the softmax is over
    the raw scores again, not a division by zero."""
    rng = np.random.default_rng(3)
    qkv = tf.constant(rng.normal(size=(4, 3 * 2 * 16)), tf.float32)
    bias = tf.zeros([96])
    mask = tf.zeros([1, 4], tf.int32)
    ours = kernels.attention(qkv, bias, mask, None, 2)
    assert np.isfinite(ours.numpy()).all()
    np.testing.assert_allclose(ours, reference_attention(qkv, bias, mask, 2, 0.0, SEED),
                               atol=1e-5)


def test_attention_in_bfloat16_rounds_once():
    rng = np.random.default_rng(4)
    qkv = tf.constant(rng.normal(size=(2 * 9, 3 * 4 * 16)), tf.float32)
    bias = tf.constant(rng.normal(size=(192,)), tf.float32)
    mask = tf.ones([2, 9], tf.int32)
    ours = kernels.attention(tf.cast(qkv, tf.bfloat16), bias, mask, SEED, 4, 0.1)
    assert ours.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(ours, tf.float32),
                               reference_attention(qkv, bias, mask, 4, 0.1, SEED), atol=5e-2)


@pytest.mark.parametrize("approximate", [True, False])
def test_bias_gelu_equals_tensorflow_gelu(approximate):
    rng = np.random.default_rng(5)
    x = tf.constant(3 * rng.normal(size=(37, 40)), tf.float32)
    bias = tf.constant(rng.normal(size=(40,)), tf.float32)
    compare(lambda x, b: kernels.bias_gelu(x, b, approximate),
            lambda x, b: tf.nn.gelu(x + b, approximate=approximate), [x, bias])
    half = kernels.bias_gelu(tf.cast(x, tf.bfloat16), bias, approximate)
    np.testing.assert_allclose(tf.cast(half, tf.float32),
                               tf.nn.gelu(x + bias, approximate=approximate), atol=4e-2, rtol=1e-2)


def reference_norm(x, bias, residual, gamma, beta, rate, epsilon):
    z = x + bias
    if rate:
        z = hash_dropout._drop(z, SEED, rate)
    z = z + residual
    mean = tf.reduce_mean(z, axis=-1, keepdims=True)
    centered = z - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return centered * (tf.math.rsqrt(variance + epsilon) * gamma) + beta


@pytest.mark.parametrize("width", [128, 40])
@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_bias_dropout_add_norm_equals_the_op_by_op_layer(width, rate):
    rng = np.random.default_rng(width)
    x, residual = (tf.constant(rng.normal(size=(23, width)), tf.float32) for _ in range(2))
    bias, gamma, beta = (tf.constant(rng.normal(size=(width,)), tf.float32) for _ in range(3))
    compare(lambda *a: kernels.bias_dropout_add_norm(*a[:3], a[3], a[4], SEED, rate, 1e-12),
            lambda *a: reference_norm(*a, rate, 1e-12), [x, bias, residual, gamma, beta])


def test_the_ops_refuse_inconsistent_shapes():
    with pytest.raises(tf.errors.InvalidArgumentError, match="heads"):
        kernels.attention(tf.zeros([6, 40]), tf.zeros([40]), tf.ones([2, 3], tf.int32), None, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bias"):
        kernels.bias_gelu(tf.zeros([2, 8]), tf.zeros([7]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="residual"):
        kernels.bias_dropout_add_norm(tf.zeros([2, 8]), tf.zeros([8]), tf.zeros([3, 8]),
                                      tf.ones([8]), tf.zeros([8]), None, 0.0, 1e-6)
    with pytest.raises(ValueError, match="dropout rate"):
        kernels.bias_dropout_add_norm(tf.zeros([2, 8]), tf.zeros([8]), tf.zeros([2, 8]),
                                      tf.ones([8]), tf.zeros([8]), SEED, 1.0, 1e-6)


def adamw_run(fused, duplicates, steps=3):
    """The table and dense variable after `steps` FusedAdamW steps with a sparse
    table gradient, with or without the fused kernel."""
    import keras

    from lealla_tf.train.optimizers import FusedAdamW

    previous = os.environ.get(kernels.SWITCH)
    os.environ[kernels.SWITCH] = "1" if fused else "0"
    try:
        rng = np.random.default_rng(0)
        table = keras.Variable(rng.normal(size=(300, 24)).astype("float32"), name="embeddings")
        dense = keras.Variable(rng.normal(size=(24, 4)).astype("float32"), name="kernel")
        bias = keras.Variable(rng.normal(size=(4,)).astype("float32"), name="bias")
        optimizer = FusedAdamW(learning_rate=1e-2, weight_decay=0.05)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        optimizer.build([table, dense, bias])

        @tf.function
        def step(ids, values, g_dense, g_bias):
            # the rows read as the students read them (ResourceGather: the table in
            # copy-on-read mode, the case where a dense update would copy it first)
            rows = tf.gather(table.value, ids)
            optimizer.apply_gradients([
                (tf.IndexedSlices(values + 0.0 * rows, ids, tf.constant([300, 24])), table),
                (g_dense, dense), (g_bias, bias)])

        draws = np.random.default_rng(1)
        for _ in range(steps):
            ids = draws.choice(300, 40, replace=False).astype("int32")
            if duplicates:
                ids[:6] = ids[6]
            arguments = (ids, draws.normal(size=(40, 24)).astype("float32"),
                         draws.normal(size=(24, 4)).astype("float32"),
                         draws.normal(size=(4,)).astype("float32"))
            step(*arguments)
        graph = step.get_concrete_function(*arguments).graph.as_graph_def()
        ops = {node.op for node in graph.node}
        ops |= {node.op for function in graph.library.function for node in function.node_def}
        assert ("LeallaSparseApplyAdamW" in ops) == fused, sorted(ops)
        return [v.numpy() for v in (table, optimizer._momentums[0], optimizer._velocities[0],
                                     dense, bias)]
    finally:
        if previous is None:
            os.environ.pop(kernels.SWITCH)
        else:
            os.environ[kernels.SWITCH] = previous


@pytest.mark.parametrize("duplicates", [False, True])
def test_sparse_adamw_equals_decay_and_fused_adam_on_the_densified_gradient(duplicates):
    fused, ops = adamw_run(True, duplicates), adamw_run(False, duplicates)
    for name, a, b in zip(["table", "m", "v", "dense", "bias"], fused, ops):
        # float32 round-off only (the kernel may contract a * b + c into one FMA)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)


def test_sparse_adamw_refuses_an_index_outside_the_table():
    table, m, v = (tf.Variable(tf.zeros([5, 2])) for _ in range(3))
    gradient = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([5]), tf.constant([5, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        kernels.sparse_apply_adamw(table.handle, m.handle, v.handle, gradient, 0.1, 0.9,
                                   0.999, 0.9, 0.999, 1e-6, 0.0)


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


def test_a_failed_compile_is_named_and_the_setup_step_goes_on(tmp_path):
    """`python -m lealla_tf.models.kernels` (make setup): a compiler error is one line
    with the compiler's own error; exit 0 (training falls back), 1 with --strict."""
    compiler = tmp_path / "broken-g++"
    compiler.write_text("#!/bin/sh\n"
                        "[ \"$1\" = --version ] && { echo broken 1.0; exit 0; }\n"
                        "echo 'fused_layers.cc:1:1: error: this compiler is broken' >&2\n"
                        "exit 1\n")
    compiler.chmod(0o755)
    environment = {**os.environ, "CXX": str(compiler), kernels.CACHE: str(tmp_path / "cache")}
    for flags, code in (([], 0), (["--strict"], 1)):
        done = subprocess.run([sys.executable, "-m", "lealla_tf.models.kernels", *flags],
                              capture_output=True, text=True, env=environment, timeout=300)
        assert done.returncode == code, done.stderr[-2000:]
        assert "not built: compiling fused_layers.cc, sparse_adamw.cc failed (exit 1): " \
               "fused_layers.cc:1:1: error: this compiler is broken" in done.stderr
    assert not list((tmp_path / "cache").glob("*.so"))  # no half-written library left


@pytest.fixture()
def copying_compiler(tmp_path):
    """A `$CXX` that "compiles" by copying the real library (built once in the
    usual cache), and the environment of a fresh cache that uses it."""
    real = kernels.build()
    compiler = tmp_path / "copying-g++"
    compiler.write_text("#!/bin/sh\n"
                        "[ \"$1\" = --version ] && { echo copying 1.0; exit 0; }\n"
                        "while [ \"$1\" != -o ]; do shift; done\n"
                        f"cp '{real}' \"$2\"\n")
    compiler.chmod(0o755)
    environment = {**os.environ, "CXX": str(compiler), kernels.CACHE: str(tmp_path / "cache")}
    script = (f"import os; os.environ.update({environment!r}); from lealla_tf.models import kernels; "
              "print(kernels.library_path())")
    path = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environment, timeout=300).stdout.split()[-1]
    return {"real": real, "env": environment, "library": pathlib.Path(path)}


def run_kernels(environment, *args):
    return subprocess.run([sys.executable, "-m", "lealla_tf.models.kernels", *args],
                          capture_output=True, text=True, env=environment, timeout=300)


def warnings(stderr):
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def test_a_truncated_or_foreign_cached_library_is_rebuilt_not_loaded(copying_compiler):
    """A truncated cached library killed every process that loaded it (SIGBUS, exit
    135); a foreign one gave an AttributeError. Each is now rebuilt, with one
    warning line, because it does not match the checksum written beside it."""
    environment, library = copying_compiler["env"], copying_compiler["library"]
    done = run_kernels(environment, "--strict")
    assert done.returncode == 0 and done.stdout.strip().endswith(str(library)), done.stderr
    assert kernels.checksum_path(library).read_text().split() == [
        hashlib.sha256(library.read_bytes()).hexdigest(), str(library.stat().st_size)]
    foreign = pathlib.Path(np.linalg._umath_linalg.__file__).read_bytes()
    for damaged, why in ((library.read_bytes()[:library.stat().st_size // 2],
                          "does not match the size and sha256"), (foreign, "does not match")):
        library.write_bytes(damaged)
        done = run_kernels(environment, "--strict")
        assert done.returncode == 0, done.stderr[-2000:]
        assert len(warnings(done.stderr)) == 1 and why in warnings(done.stderr)[0], done.stderr
        assert library.read_bytes() == copying_compiler["real"].read_bytes()
        assert kernels.valid(library)
    # Without its checksum (a library of an older version) it is rebuilt too.
    kernels.checksum_path(library).unlink()
    done = run_kernels(environment, "--strict")
    assert done.returncode == 0 and "has no checksum" in warnings(done.stderr)[0]
    assert kernels.valid(library)


def test_a_foreign_library_with_a_matching_checksum_falls_back_with_one_warning(
        copying_compiler):
    environment, library = copying_compiler["env"], copying_compiler["library"]
    library.parent.mkdir(parents=True)
    library.write_bytes(pathlib.Path(np.linalg._umath_linalg.__file__).read_bytes())
    kernels.checksum_path(library).write_text(kernels._fingerprint(library) + "\n")
    script = "from lealla_tf.models import kernels; print('available', kernels.available())"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "available False" in done.stdout
    lines = warnings(done.stderr)
    assert len(lines) == 1 and "is not the fused kernels' library" in lines[0], done.stderr
    assert "lealla_attention" in lines[0]
    done = run_kernels(environment, "--strict")
    assert done.returncode == 1 and "is not the fused kernels' library" in done.stderr


def test_a_killed_builds_partial_library_is_removed_by_the_next_build(copying_compiler):
    """Only partial libraries that are ours (by name) and whose builder has exited."""
    environment, library = copying_compiler["env"], copying_compiler["library"]
    cache = library.parent
    cache.mkdir(parents=True)
    ours_killed = cache / f"{kernels.BUILD_PREFIX}{dead_pid()}-abc123.so"
    ours_running = cache / f"{kernels.BUILD_PREFIX}{os.getpid()}-def456.so"
    legacy_empty = cache / "tmpa1b2c3d4.so"  # an older version's mkstemp name, not yet written
    legacy_ours = cache / "tmpe5f6g7h8.so"
    not_ours = [cache / "tmpzzzzzzzz.so", cache / "other.so", cache / "notes.txt"]
    for path in (ours_killed, ours_running, legacy_empty):
        path.write_bytes(b"")
    legacy_ours.write_bytes(b"\x7fELF...LeallaAttention...")
    for path in not_ours:
        path.write_bytes(b"someone else's")
    done = run_kernels(environment, "--strict")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not ours_killed.exists() and not legacy_empty.exists() and not legacy_ours.exists()
    assert ours_running.exists() and all(path.exists() for path in not_ours)
    assert kernels.valid(library)
    assert not list(cache.glob(f"{kernels.BUILD_PREFIX}*-*.so.sha256*"))


# === A cache another user can write is never loaded from ===

PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("planted code ran\n", f); fclose(f); }
}
"""


def plant(path: pathlib.Path, marker: pathlib.Path) -> None:
    """A library at `path` whose constructor writes `marker`, with the size and
    sha256 a build would have written beside it."""
    source = path.with_name("planted.c")
    path.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(PLANTED % marker)
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(path)], check=True)
    source.unlink()
    kernels.checksum_path(path).write_text(kernels._fingerprint(path) + "\n")


def planted_library(monkeypatch, cache=None, xdg=None):
    """The environment of a cache (`$LEALLA_TF_KERNEL_CACHE`, or under
    `$XDG_CACHE_HOME`) and the predictable path a planted library takes there."""
    environment = {k: v for k, v in os.environ.items() if k not in (kernels.CACHE,
                                                                    "XDG_CACHE_HOME")}
    monkeypatch.delenv(kernels.CACHE, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    if cache is not None:
        environment[kernels.CACHE] = str(cache)
        monkeypatch.setenv(kernels.CACHE, str(cache))
    if xdg is not None:
        environment["XDG_CACHE_HOME"] = str(xdg)
        monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    return environment, kernels.library_path()


@pytest.mark.parametrize("where", ["cache", "xdg"])
def test_a_planted_library_in_a_folder_others_can_write_never_runs(tmp_path, monkeypatch,
                                                                   where):
    """`$LEALLA_TF_KERNEL_CACHE` (or `$XDG_CACHE_HOME`) at a world-writable folder: a
    library planted there under the predictable name, its checksum beside it, ran its
    constructor inside training. The folder is now refused before anything is
    loaded: training falls back with one warning naming the folder, and
    `python -m lealla_tf.models.kernels --strict` exits 1 naming it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    marker = tmp_path / "planted-code-ran"
    environment, library = planted_library(monkeypatch, **{where: shared})
    plant(library, marker)
    shared.chmod(0o777)  # anyone may write here (no sticky bit)
    script = ("from lealla_tf.models import kernels\n"
              "print('available', kernels.available(), kernels.usable())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert not marker.exists(), "the planted library's code ran"
    assert done.returncode == 0, done.stderr[-2000:]
    assert "available False False" in done.stdout
    lines = warnings(done.stderr)
    assert len(lines) == 1 and str(shared) in lines[0] and "other users can write" in lines[0], \
        done.stderr
    done = run_kernels(environment, "--strict")
    assert not marker.exists(), "the planted library's code ran"
    assert done.returncode == 1 and str(shared) in done.stderr, done.stderr


@pytest.mark.parametrize("fault", ["group_writable", "symlink", "foreign_owner"])
def test_a_cached_library_others_could_have_written_is_rebuilt_not_loaded(
        copying_compiler, tmp_path, fault):
    """In a folder of our own, a library file another user could have written (or
    a symlink to one elsewhere) is not loaded even with a matching checksum: it
    is rebuilt, with one warning line naming it."""
    environment, library = copying_compiler["env"], copying_compiler["library"]
    marker = tmp_path / "planted-code-ran"
    if fault == "symlink":
        elsewhere = tmp_path / "elsewhere" / library.name
        plant(elsewhere, marker)
        library.parent.mkdir(parents=True)
        library.symlink_to(elsewhere)
        kernels.checksum_path(library).write_text(kernels._fingerprint(elsewhere) + "\n")
    else:
        plant(library, marker)
        if fault == "group_writable":
            library.chmod(0o775)
        else:
            if os.geteuid() != 0:
                pytest.skip("only root can give a file to another user")
            os.chown(library, 65534, 65534)
    done = run_kernels(environment, "--strict")
    assert not marker.exists(), "the planted library's code ran"
    assert done.returncode == 0, done.stderr[-2000:]
    lines = warnings(done.stderr)
    assert len(lines) == 1 and str(library) in lines[0] and "rebuilding" in lines[0], done.stderr
    assert not library.is_symlink()
    assert library.read_bytes() == copying_compiler["real"].read_bytes()
    assert kernels.valid(library)
