"""`lealla-train` (`lealla_tf.cli.train`): kill -9 and resume, the TPU flag, and every
mistake and fault in its flags and data as one line naming it."""

import gzip
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    REPO_ROOT,
    assert_one_line_error,
    assert_one_line_stderr,
    training_environment,
)

from lealla_tf.cli.train import main
from lealla_tf.flags import parse_overrides
from lealla_tf.train.distribution import TPUUnavailableError, check_tpu_flag

STEPS = 8


def command(model_dir, data, vocab, *extra):
    return [sys.executable, "-m", "lealla_tf.cli.train", "--preset=lealla_small",
            "--encoder_overrides=num_layers=2,hidden_dim=16,num_heads=2,intermediate_dim=32",
            f"--vocab_file={vocab}", f"--train_data={data}", f"--model_dir={model_dir}",
            "--objective=ams", "--global_batch_size=4", f"--train_steps={STEPS}",
            "--checkpoint_every=1", "--keep_checkpoints=20", "--max_seq_length=16",
            "--no_progress", "--scale=20", *extra]


@pytest.fixture(scope="module")
def varied_parallel_dir(tmp_path_factory):
    """Pairs from 5 to 300 bytes: four length buckets, each filling at its own pace."""
    from conftest import TINY_PAIRS, write_pairs

    root = tmp_path_factory.mktemp("varied")
    for language, pairs in TINY_PAIRS.items():
        longer = [(" ".join([source] * (1 + i % 12)), " ".join([english] * (1 + i % 12)))
                  for i, (source, english) in enumerate(pairs * 8)]
        write_pairs(root, language, longer)
    return str(root)


def final_weights(model_dir):
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(
        os.path.join(model_dir, "checkpoints")) if name.startswith("encoder/")}


def log_rows(model_dir):
    with open(os.path.join(model_dir, "train_log.jsonl")) as f:
        return [json.loads(line) for line in f]


def fingerprints(model_dir):
    return [(row["step"], row["fingerprint"]) for row in log_rows(model_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--length_buckets=4", "--mixed_precision"),
                                   ("--jit_compile",)],
                         ids=["stream_order_float32", "length_buckets_bfloat16", "jit_compile"])
def test_kill_minus_nine_then_rerun_resumes_exactly(tiny_parallel_dir, varied_parallel_dir,
                                                    sentence_vocab_file, tmp_path, extra):
    data = varied_parallel_dir if extra else tiny_parallel_dir
    straight = str(tmp_path / "straight")
    done = subprocess.run(command(straight, data, sentence_vocab_file, *extra),
                          env=training_environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = str(tmp_path / "killed")
    process = subprocess.Popen(command(killed, data, sentence_vocab_file, *extra),
                               env=training_environment(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    checkpoints = os.path.join(killed, "checkpoints")
    # a checkpoint counts once its state file names it (the .index comes first: a kill
    # between the two, likelier on a busy machine, leaves no checkpoint to resume from)
    while tf.train.latest_checkpoint(checkpoints) is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    interrupted_at = tf.train.latest_checkpoint(checkpoints)
    assert interrupted_at, "the run never saved a checkpoint"
    assert int(interrupted_at.rsplit("-", 1)[1]) < STEPS, "killed too late to test resuming"

    resumed = subprocess.run(command(killed, data, sentence_vocab_file, *extra),
                             env=training_environment(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "steps " in resumed.stdout and f"-> {STEPS}" in resumed.stdout

    # The same batches, in the same order, for every step ...
    expected = dict(fingerprints(straight))
    assert sorted(expected) == list(range(1, STEPS + 1))
    for step, fingerprint in fingerprints(killed):
        assert fingerprint == expected[step], f"step {step} saw different data"
    losses = {row["step"]: row["total"] for row in log_rows(straight)}
    assert {row["step"]: row["total"] for row in log_rows(killed)} == losses
    # One log row per step: rows past the checkpoint were dropped on resume.
    assert [step for step, _ in fingerprints(killed)] == list(range(1, STEPS + 1))
    # ... and the same weights at the end: nothing repeated, nothing skipped.
    a, b = final_weights(straight), final_weights(killed)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=1e-6, err_msg=name)


def closed_loopback_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tpu_flag_is_checked_before_any_connection(tmp_path, capsys):
    port = closed_loopback_port()
    started = time.time()
    code = main([f"--tpu=grpc://127.0.0.1:{port}", f"--model_dir={tmp_path}",
                 "--train_data=x"])
    assert code == 2 and time.time() - started < 30
    assert f"no TPU worker answers at 127.0.0.1:{port}" in capsys.readouterr().err
    with pytest.raises(TPUUnavailableError, match="no TPU devices"):
        check_tpu_flag("local")
    with pytest.raises(TPUUnavailableError, match="not of the form"):
        check_tpu_flag("grpc://127.0.0.1")
    with pytest.raises(TPUUnavailableError, match="is empty"):
        check_tpu_flag(" ")
    product = pathlib.Path("/sys/class/dmi/id/product_name")
    if not product.exists() or "Google" not in product.read_text():
        with pytest.raises(TPUUnavailableError, match="not a Google Cloud VM"):
            check_tpu_flag("my-tpu")


def test_tpu_flag_accepts_a_worker_that_answers_grpc():
    """A loopback peer that answers the HTTP/2 preface with a SETTINGS frame, as a
    gRPC (TPU) worker does, passes; nothing leaves 127.0.0.1."""
    import threading

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def answer():
            connection, _ = server.accept()
            with connection:
                connection.recv(64)
                connection.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")

        threading.Thread(target=answer, daemon=True).start()
        address = f"grpc://127.0.0.1:{server.getsockname()[1]}"
        assert check_tpu_flag(address) == address


def test_tpu_flag_refuses_a_silent_listener_in_seconds():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        started = time.time()
        with pytest.raises(TPUUnavailableError, match="does not answer as a gRPC"):
            check_tpu_flag(f"grpc://127.0.0.1:{server.getsockname()[1]}", connect_timeout=1.0)
        assert time.time() - started < 10


def test_train_cli_refuses_a_silent_listener_in_seconds(tmp_path, capsys):
    """`train --tpu=grpc://...` at a loopback listener that accepts connections but
    never answers (not a TPU worker): one line and exit 2 within seconds, no hang."""
    import threading

    server, accepted, stop = socket.socket(), [], threading.Event()

    def accept_and_stay_silent():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:  # the poll's timeout, or the socket closed
                continue
            accepted.append(connection)

    listener = threading.Thread(target=accept_and_stay_silent, daemon=True)
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(0.1)
        listener.start()
        port = server.getsockname()[1]
        started = time.time()
        code = main([f"--tpu=grpc://127.0.0.1:{port}", f"--model_dir={tmp_path / 'm'}",
                     "--train_data=x"])
        elapsed = time.time() - started
        assert_one_line_stderr(code, capsys.readouterr().err, f"127.0.0.1:{port}",
                               "does not answer as a gRPC (TPU) worker", "--tpu")
        assert elapsed < 15, elapsed
        assert accepted, "the probe never reached the listener"
        assert not os.path.exists(tmp_path / "m"), "nothing is written before the probe"
    finally:
        stop.set()
        if listener.is_alive():
            listener.join(5)
        server.close()
        for connection in accepted:
            connection.close()


def test_cli_errors_are_messages_not_tracebacks(tiny_parallel_dir, sentence_vocab_file,
                                                tmp_path, capsys):
    base = [f"--model_dir={tmp_path / 'm'}", f"--train_data={tiny_parallel_dir}"]
    assert main(base) == 2
    assert "--vocab_file is required" in capsys.readouterr().err
    assert main(base + [f"--vocab_file={sentence_vocab_file}"]) == 2
    assert "needs a teacher" in capsys.readouterr().err
    assert main(base + [f"--vocab_file={sentence_vocab_file}", "--objective=ams",
                        "--loss_weights=fd=3"]) == 2
    assert "not in the objective" in capsys.readouterr().err
    assert main(base + [f"--vocab_file={sentence_vocab_file}", "--preset=nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(base + [f"--vocab_file={sentence_vocab_file}", "--preset=dimension_reduction",
                        "--encoder_overrides=num_layers=2"]) == 2
    assert "do not apply to dimension_reduction" in capsys.readouterr().err
    # An embeddings output (id, embedding) is not a pair file: said, not a traceback.
    from lealla_tf.records import embedding_example, write_tfrecord

    embeddings = tmp_path / "embeddings" / "deu-eng-00000-of-00001.tfrecord"
    embeddings.parent.mkdir()
    with open(embeddings, "wb") as handle:
        write_tfrecord(handle, embedding_example("1", np.ones(4, np.float32), "Hallo"))
    assert main([f"--model_dir={tmp_path / 'e'}", f"--train_data={embeddings.parent}",
                 f"--vocab_file={sentence_vocab_file}", "--objective=ams"]) == 2
    error = capsys.readouterr().err
    assert "not a training-pair TFRecord" in error and "embedding" in error
    assert "Traceback" not in error


def test_resume_with_other_flags_is_refused(tiny_parallel_dir, sentence_vocab_file, tmp_path,
                                            capsys):
    args = command(str(tmp_path / "m"), tiny_parallel_dir, sentence_vocab_file)[3:]
    args = [a for a in args if not a.startswith("--train_steps")] + ["--train_steps=1"]
    assert main(args) == 0
    assert main(args + ["--margin=0.2"]) == 2
    assert "loss.margin" in capsys.readouterr().err
    assert main([a for a in args if a != "--train_steps=1"] + ["--train_steps=2"]) == 0


def test_parse_overrides():
    assert parse_overrides("num_layers=4,embedding_dim=none,dropout=0.2,pooling=mean") == {
        "num_layers": 4, "embedding_dim": None, "dropout": 0.2, "pooling": "mean"}
    with pytest.raises(ValueError):
        parse_overrides("num_layers")


def test_every_count_flag_is_positive_or_its_help_says_what_0_means():
    """An integer flag either refuses 0 (before any training) or its --help
    defines 0; --seed aside (0 is a seed like any other)."""
    from lealla_tf.cli.train import build_parser, check_flags, config_from_flags
    from lealla_tf.train.resolution import validate_train_config

    parser = build_parser()
    for action in parser._actions:
        if action.type is not int or action.dest == "seed":
            continue
        flag = action.option_strings[0]
        args = parser.parse_args(["--model_dir=m", f"{flag}=0"])
        try:
            check_flags(args)
            validate_train_config(config_from_flags(args))
        except ValueError as error:
            assert flag in str(error), error
            continue
        assert "0:" in (action.help or ""), f"{flag} takes 0; its help does not say what 0 means"


def test_the_cooldown_flags_reach_the_loss_config():
    from lealla_tf.cli.train import build_parser, config_from_flags

    parser = build_parser()
    loss = config_from_flags(parser.parse_args(
        ["--model_dir=m", "--margin=0.15", "--cooldown_margin=0.3",
         "--cooldown_distilled_rows=1"])).loss
    assert (loss.margin, loss.cooldown_margin, loss.cooldown_distilled_rows) == (0.15, 0.3, 1.0)
    assert config_from_flags(parser.parse_args(["--model_dir=m"])).loss.cooldown_margin is None


def test_tpu_flag_accepts_a_real_tensorflow_grpc_server():
    server = tf.distribute.Server.create_local_server()
    address = server.target  # grpc://localhost:PORT
    port = address.rsplit(":", 1)[1]
    assert check_tpu_flag(f"grpc://127.0.0.1:{port}") == f"grpc://127.0.0.1:{port}"


def test_a_cluster_connection_that_hangs_times_out():
    from lealla_tf.train.distribution import _within

    started = time.time()
    with pytest.raises(TPUUnavailableError, match="did not initialise"):
        _within(0.5, lambda: time.sleep(30), "the TPU at x did not initialise within 0.5 s")
    assert time.time() - started < 5
    assert _within(5, lambda: 42, "unused") == 42


@pytest.mark.slow
def test_a_compiled_run_exports_a_student_that_scores_as_the_uncompiled_one(
        tiny_parallel_dir, tiny_tatoeba_dir, sentence_vocab_file, tmp_path):
    """`python -m lealla_tf.train --jit_compile` trains a tiny student, which
    exports and scores on the tiny dev set within 0.5 P@1 (points) of the same
    run without it (dropout off: the two differ by round-off and padding only)."""
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    from lealla_tf.cli.export import main as export
    from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC, evaluate_tatoeba

    flags = ["--encoder_overrides=num_layers=2,hidden_dim=16,num_heads=2,intermediate_dim=32,"
             "dropout=0", "--train_steps=30", "--checkpoint_every=30", "--global_batch_size=8",
             "--learning_rate=2e-3"]
    scores = {}
    for name, extra in (("compiled", ["--jit_compile"]), ("uncompiled", [])):
        model_dir = str(tmp_path / name)
        args = [a for a in command(model_dir, tiny_parallel_dir, sentence_vocab_file)
                if not a.startswith(("--encoder_overrides", "--train_steps", "--checkpoint",
                                     "--global_batch_size"))] + flags + extra
        args[2] = "lealla_tf.train"  # python -m lealla_tf.train, as a user runs it
        done = subprocess.run(args, env=training_environment(), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(pathlib.Path(model_dir, "train_summary.json").read_text())
        assert summary["jit_compile"] is bool(extra) and summary["final_step"] == 30
        assert export([f"--model_dir={model_dir}", f"--export_path={tmp_path / name}_export"]) == 0
        model = tf.saved_model.load(str(tmp_path / f"{name}_export"))
        scores[name] = 100 * evaluate_tatoeba(model, tiny_tatoeba_dir)[TATOEBA_PRIMARY_METRIC]
    assert abs(scores["compiled"] - scores["uncompiled"]) <= 0.5, scores


# === Mistakes and faults: each is one line naming the flag or file, exit 2 ===

@pytest.fixture()
def train_args(sentence_vocab_file, tiny_parallel_dir, tmp_path):
    def make(*extra, data=tiny_parallel_dir, model_dir=None):
        return [f"--model_dir={model_dir or tmp_path / 'm'}", f"--train_data={data}",
                f"--vocab_file={sentence_vocab_file}", "--objective=ams",
                "--encoder_overrides=num_layers=1,hidden_dim=8,num_heads=2,intermediate_dim=8",
                "--global_batch_size=4", "--train_steps=1", "--max_seq_length=16",
                "--no_progress", *extra]
    return make


@pytest.mark.parametrize("flag,needle", [
    ("--train_steps=0", "--train_steps"), ("--train_steps=-5", "--train_steps"),
    ("--checkpoint_every=0", "--checkpoint_every"), ("--log_every=0", "--log_every"),
    ("--global_batch_size=0", "--global_batch_size"),
    ("--global_batch_size=-4", "--global_batch_size"),
    ("--max_seq_length=600", "--max_seq_length"), ("--learning_rate=-1", "--learning_rate"),
    ("--encoder_overrides=bogus=1", "bogus"), ("--loss_weights=ams=x", "--loss_weights"),
    ("--language_alpha=2", "--language_alpha"), ("--cooldown_margin=1.5", "--cooldown_margin")])
def test_train_flag_mistakes(train_args, capsys, flag, needle):

    args = [a for a in train_args() if not a.startswith(flag.split("=")[0] + "=")] + [flag]
    assert_one_line_error(capsys, main(args), needle)


@pytest.mark.parametrize("flag", ["--time_budget_minutes=nan", "--time_budget_minutes=inf",
                                  "--seed=-1"])
def test_train_flags_with_no_meaning_are_refused_naming_them(train_args, capsys, flag):
    """A budget of nan or inf minutes trained on (nan stops nothing); a negative
    seed failed in Keras with a message naming no flag."""

    args = [a for a in train_args() if not a.startswith(flag.split("=")[0] + "=")] + [flag]
    assert_one_line_error(capsys, main(args), flag.split("=")[0])


def test_train_data_faults_name_the_file(train_args, tmp_path, capsys):
    from lealla_tf.train.data import write_pairs_tfrecord

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "deu-eng.tsv").write_text("no tab here\n\tonly English\n")
    assert_one_line_error(capsys, main(train_args(data=str(empty))), "no well-formed pairs",
                          "deu-eng.tsv")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    data = gzip.compress(("Hund\tdog\n" * 2000).encode())
    (corrupt / "deu-eng.tsv.gz").write_bytes(data[:len(data) // 2] + b"\x00" * 64)
    assert_one_line_error(capsys, main(train_args(data=str(corrupt))), "deu-eng.tsv.gz")
    truncated = tmp_path / "records"
    truncated.mkdir()
    path = str(truncated / "deu-eng.tfrecord")
    write_pairs_tfrecord(path, [("Hund", "dog")] * 50)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    assert_one_line_error(capsys, main(train_args(data=str(truncated))), "deu-eng.tfrecord")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_one_line_error(capsys, main(train_args(model_dir=str(a_file))), "--model_dir")


def test_a_model_dir_below_a_file_is_one_line(train_args, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_one_line_error(capsys, main(train_args(model_dir=str(a_file / "sub"))),
                          "--model_dir", "is a file")


def test_a_failed_first_run_does_not_block_the_corrected_rerun(train_args, tmp_path, capsys):

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "fra-eng.tsv").write_text("")
    assert_one_line_error(capsys, main(train_args(data=str(empty))), "no well-formed pairs",
                          "fra-eng.tsv")
    assert not (tmp_path / "m" / "config.json").exists()
    assert main(train_args("--margin=0.2")) == 0


def test_zero_learning_rate_is_kept(train_args, tmp_path):
    from lealla_tf.configs import read_json

    assert main(train_args("--learning_rate=0")) == 0
    assert read_json(str(tmp_path / "m" / "config.json"))["optimizer"]["learning_rate"] == 0.0


def test_a_checkpoint_write_cut_by_a_kill_is_cleaned_on_resume(train_args, tmp_path):

    assert main(train_args()) == 0
    leftover = tmp_path / "m" / "checkpoints" / "ckpt-2_temp" / "part-00000-of-00001"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half a checkpoint")
    assert main([a for a in train_args() if a != "--train_steps=1"] + ["--train_steps=2"]) == 0
    assert not leftover.parent.exists()


MODEL_DIR_HOLDER = """
import sys, time
from lealla_tf.folder_lock import hold_folder
hold_folder(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_a_model_dir_has_one_writer(train_args, tmp_path, capsys):
    """Two trainings into one --model_dir logged every step twice and wrote the
    same checkpoints: the second is refused in one line naming the first's pid,
    and a killed run's lock blocks nobody."""

    model_dir = tmp_path / "m"
    holder = subprocess.Popen([sys.executable, "-c", MODEL_DIR_HOLDER, str(model_dir)],
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_one_line_error(capsys, main(train_args(model_dir=model_dir)),
                              f"--model_dir={model_dir}", f"pid {holder.pid}")
        assert not (model_dir / "config.json").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert main(train_args(model_dir=model_dir)) == 0
    assert (model_dir / "config.json").exists()


def test_precomputed_english_only_vectors_are_not_silently_used_both_ways(
        sentence_vocab_file, tmp_path, capsys):

    from lealla_tf.train.data import write_pairs_tfrecord

    (tmp_path / "records").mkdir()
    write_pairs_tfrecord(str(tmp_path / "records" / "deu-eng.tfrecord"), [("Hund", "dog")] * 8,
                         teacher_target=np.ones((8, 4), np.float32))
    args = [f"--model_dir={tmp_path / 'm'}", f"--train_data={tmp_path / 'records'}",
            f"--vocab_file={sentence_vocab_file}", "--objective=ams+fd"]
    assert_one_line_error(capsys, main(args), "--teacher_english_only")


# === Issue 62 ===

def test_train_prints_the_lines_it_skips_by_kind(train_args, tmp_path, capsys):
    """A file of 40 pairs and 20 bad lines trained on 50 "pairs" (a third column
    in the English side, bytes that are not UTF-8 as they were), said nothing,
    and weighed the language by 40. The main job's `corpus:` line says it now."""
    data = tmp_path / "odd"
    data.mkdir()
    lines = [f"Hund {i}\tdog {i}\n".encode() for i in range(40)]
    lines += [f"kein Tab {i}\n".encode() for i in range(5)]
    lines += [f"Katze {i}\tcat {i}\t0.9\n".encode() for i in range(5)]
    lines += [f"Gr\xfc\xdfe {i}\tgreetings {i}\n".encode("latin-1") for i in range(5)]
    lines += [f"\tbird {i}\n".encode() for i in range(5)]
    (data / "deu-eng.tsv").write_bytes(b"".join(lines[i] for i in np.random.default_rng(
        0).permutation(len(lines))))
    assert main(train_args(data=str(data))) == 0
    out = capsys.readouterr().out
    assert ("corpus: 40 pairs from 1 file; 20 lines skipped in 1 file: 5 with no tab, 5 with "
            "more than two columns, 5 with an empty side, 5 not UTF-8 (deu-eng.tsv: 20)") in out


def test_help_points_a_cpu_user_to_the_main_job(capsys):
    """--help gave the paper's step count and no word of the command sized for
    the machine it runs on."""
    with pytest.raises(SystemExit):
        main(["--help"])
    description = capsys.readouterr().out.split("\noptions:")[0]
    pointer = next((p for p in description.split("\n\n") if "lealla_tf.recipe" in p), "")
    assert "python -m lealla_tf.recipe" in pointer and "make main" in pointer
    assert "--data_dir" in pointer and "CPU" in pointer
    assert not any(c.isdigit() for c in pointer)  # no timings: they go stale
