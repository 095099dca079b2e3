"""Training across worker processes: two MultiWorkerMirroredStrategy workers on
127.0.0.1 compute the step one process computes on the concatenated global batch
(negatives gathered across workers), and resume together from the chief's
checkpoint; the other worker never writes the model directory."""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO_ROOT, training_environment
from helpers.multi_worker_probe import flatten

from lealla_tf.cli.train import build_parser, config_from_flags
from lealla_tf.train.distribution import make_strategy, worker_role
from lealla_tf.train.launch import build_trainer

WORKERS = 2
PROBE = str(REPO_ROOT / "tests" / "helpers" / "multi_worker_probe.py")


def flags(model_dir, data, vocab, steps):
    """The command line every worker (and the one-process reference) runs."""
    return ["--preset=lealla_small", "--encoder_overrides=num_layers=2,hidden_dim=8,"
            "num_heads=2,intermediate_dim=16,dropout=0.0", f"--vocab_file={vocab}",
            f"--train_data={data}", f"--model_dir={model_dir}", "--objective=ams+fd+ld+mcl+mse",
            "--loss_weights=ams=1,fd=1,ld=1,mcl=1,mse=1", "--global_batch_size=8",
            # The AMS scale multiplies every logit: at 20 gradients reach 60, where
            # float32 sums taken in another order differ by 2e-5; at 5 they agree to 1e-5.
            "--scale=5", f"--train_steps={steps}",
            "--learning_rate=1e-3", "--warmup_steps=2", "--shuffle_buffer=50",
            "--max_seq_length=16", "--checkpoint_every=1", "--keep_checkpoints=10",
            "--log_every=1", "--no_progress"]


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_workers(command, root, timeout=900):
    """Runs `command(index)` in WORKERS processes of one loopback cluster; returns
    their stdout. Each gets its own TMPDIR under `root` (to see what it leaves)."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(WORKERS)]}
    processes, logs = [], []
    for index in range(WORKERS):
        os.makedirs(root / f"tmp{index}", exist_ok=True)
        env = dict(training_environment(), TMPDIR=str(root / f"tmp{index}"), TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        logs.append((open(root / f"stdout{index}", "w+"), open(root / f"stderr{index}", "w+")))
        processes.append(subprocess.Popen(command(index), env=env, cwd=str(REPO_ROOT),
                                          stdout=logs[-1][0], stderr=logs[-1][1]))
    deadline = time.time() + timeout
    try:
        while any(p.poll() is None for p in processes) and time.time() < deadline:
            if any(p.poll() not in (None, 0) for p in processes):
                break  # a dead worker leaves the other waiting for it
            time.sleep(0.2)
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = []
    for p, (out, err) in zip(processes, logs):
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
        out.close(), err.close()
        assert p.returncode == 0, f"worker exited {p.returncode}:\n{stderr[-4000:]}"
        outputs.append(stdout)
    return outputs


@pytest.fixture(scope="module")
def two_worker_run(teacher_records, sentence_vocab_file, tmp_path_factory):
    """Two workers train 2 steps (checkpoint every step), each recording its
    first step (tests/helpers/multi_worker_probe.py)."""
    root = tmp_path_factory.mktemp("two_workers")
    model_dir = str(root / "model")
    run_workers(lambda i: [sys.executable, PROBE, str(root / f"worker{i}.npz")]
                + flags(model_dir, teacher_records, sentence_vocab_file, 2), root)
    probes = [dict(np.load(root / f"worker{i}.npz")) for i in range(WORKERS)]
    return root, model_dir, probes


def reference(root, data, vocab, steps):
    """The one-process trainer of the same command, in its own model_dir."""
    args = build_parser().parse_args(flags(str(root / "single"), data, vocab, steps))
    return build_trainer(config_from_flags(args), args.model_dir, args.vocab_file,
                         make_strategy("default"), progress=False)


def global_batches(task, tokenizer, steps):
    """(each worker's batch, their concatenation) for the first `steps` steps;
    token inputs padded to max_seq_length (padding changes nothing)."""
    streams = [iter(task.dataset(tf.distribute.InputContext(WORKERS, i, WORKERS)))
               for i in range(WORKERS)]
    length = task.config.tokenizer.max_seq_length

    def join(values, name=""):
        if isinstance(values[0], dict):
            return {key: join([v[key] for v in values], key) for key in values[0]}
        if name in ("input_word_ids", "input_mask", "input_type_ids"):
            fill = tokenizer.pad_id if name == "input_word_ids" else 0
            values = [tf.pad(v, [[0, 0], [0, length - v.shape[1]]], constant_values=fill)
                      for v in values]
        return tf.concat(values, 0)

    for _ in range(steps):
        parts = [next(stream) for stream in streams]
        yield parts, join(parts)


def checkpoint_values(path):
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
            if not name.startswith("_CHECKPOINTABLE")}


def replay(trainer, tokenizer, steps):
    """`steps` one-process steps (eager: no tracing) on the workers'
    concatenated batches; returns the path of a checkpoint of the result."""
    for _, batch in global_batches(trainer.task, tokenizer, steps):
        trainer.strategy.run(trainer.replica_step, args=(batch,))
        trainer.step.assign_add(1)
    return trainer.checkpoint.write(os.path.join(trainer.model_dir, f"replay-{steps}"))


def max_difference(a, b):
    keys = sorted(k for k in a if k != "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    assert keys == sorted(k for k in b if k != "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - b[k]))) for k in keys)


@pytest.mark.slow
def test_two_workers_step_equals_one_process_on_the_global_batch(
        two_worker_run, teacher_records, sentence_vocab_file, tmp_path):
    root, model_dir, probes = two_worker_run
    trainer = reference(tmp_path, teacher_records, sentence_vocab_file, 2)
    task = trainer.task
    count = len(task.trainable)
    for worker in probes[1:]:  # the chief's initial weights reached every worker
        for i in range(count):
            np.testing.assert_array_equal(worker[f"initial/{i}"], probes[0][f"initial/{i}"])
    for i, variable in enumerate(task.trainable):
        variable.assign(probes[0][f"initial/{i}"])
    (parts, batch), = global_batches(task, task.tokenizer, 1)
    for worker, part in zip(probes, parts):  # each worker read its own share
        for path, value in flatten(part):
            np.testing.assert_array_equal(worker[f"batch/{path}"], value.numpy(), err_msg=path)
    _, total, gradients = task.replica_gradients(batch)  # one process, eager
    gradients = [tf.convert_to_tensor(g) for g in gradients]  # lookup tables' are sparse
    # Gradients agree to float32 round-off at their own scale: each tensor within
    # 1e-5 plus 1e-6 of its largest entry. (The two processes sum the batch's
    # rows in another order; with AVX-512 kernels the embedding gradients, whose
    # entries reach 30, differ by 1.5e-5, a relative 5e-7.)
    figures = {"loss": 0.0, "gradients": 0.0, "gradients_over_tolerance": 0.0}
    for worker in probes:
        figures["loss"] = max(figures["loss"], abs(float(worker["total"]) - float(total)))
        for i, gradient in enumerate(gradients):
            difference = float(np.max(np.abs(worker[f"gradient/{i}"] - gradient.numpy())))
            tolerance = 1e-5 + 1e-6 * float(np.max(np.abs(gradient.numpy())))
            figures["gradients"] = max(figures["gradients"], difference)
            figures["gradients_over_tolerance"] = max(figures["gradients_over_tolerance"],
                                                      difference / tolerance)
    assert figures["loss"] < 1e-5 and figures["gradients_over_tolerance"] < 1, figures
    # Negatives come from both workers: each worker's half alone gives another loss.
    halves = sum(float(task.loss_terms(part)["ams"]) for part in parts)
    assert abs(halves - float(task.loss_terms(batch)["ams"])) > 1e-3
    # Two steps of Trainer.train on 2 workers == two one-process steps.
    figures["weights"] = max_difference(
        checkpoint_values(os.path.join(model_dir, "checkpoints", "ckpt-2")),
        checkpoint_values(replay(trainer, task.tokenizer, 2)))
    assert figures["weights"] < 1e-5
    for worker in probes[1:]:
        for i in range(count):
            np.testing.assert_array_equal(worker[f"final/{i}"], probes[0][f"final/{i}"])
    print("multi-worker equality (max abs diff):", json.dumps(figures))


@pytest.mark.slow
def test_chief_checkpoint_resumes_on_both_workers(two_worker_run, teacher_records,
                                                  sentence_vocab_file, tmp_path):
    root, model_dir, probes = two_worker_run
    # Only the chief wrote model_dir: one log row per step, no worker files left.
    with open(os.path.join(model_dir, "train_log.jsonl")) as log:
        steps = [json.loads(line)["step"] for line in log]
    assert steps == [1, 2]
    assert not os.path.exists(str(probes[1]["write_dir"]))
    assert str(probes[0]["write_dir"]) == model_dir
    summaries = [json.loads(str(p["summary"])) for p in probes]
    assert [s["checkpoint"] for s in summaries] == [os.path.join(model_dir, "checkpoints",
                                                                 "ckpt-2")] * WORKERS

    # The real command, on both workers, resumes at step 2 and runs to 4.
    outputs = run_workers(lambda i: [sys.executable, "-m", "lealla_tf.cli.train",
                                     "--strategy=multi_worker"]
                          + flags(model_dir, teacher_records, sentence_vocab_file, 4), root)
    for output in outputs:
        assert "steps 2 -> 4" in output, output
        assert f"checkpoint: {os.path.join(model_dir, 'checkpoints', 'ckpt-4')}" in output
    with open(os.path.join(model_dir, "train_log.jsonl")) as log:
        steps = [json.loads(line)["step"] for line in log]
    assert steps == [1, 2, 3, 4]
    for index in range(WORKERS):  # (TensorFlow's autograph files stay in TMPDIR)
        assert not [n for n in os.listdir(root / f"tmp{index}") if n.startswith("lealla_")]
    # Both workers restored step 2 (a worker that had not would have added
    # gradients of other weights): the result is four one-process steps.
    trainer = reference(tmp_path, teacher_records, sentence_vocab_file, 4)
    for i, variable in enumerate(trainer.task.trainable):
        variable.assign(probes[0][f"initial/{i}"])
    difference = max_difference(
        checkpoint_values(os.path.join(model_dir, "checkpoints", "ckpt-4")),
        checkpoint_values(replay(trainer, trainer.task.tokenizer, 4)))
    print("multi-worker resume: max abs weight diff after 2+2 steps:", difference)
    assert difference < 1e-5


def test_worker_role_of_one_process():
    assert worker_role(make_strategy("default")) == (True, "chief", 1)
    assert worker_role(make_strategy("mirrored")).chief
