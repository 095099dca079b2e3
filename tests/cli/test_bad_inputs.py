"""Every command line, driven through the user mistakes and faults found by probing.

Each case must end with exit code 2 and ONE line on stderr, `error: ...`, naming
the flag or file at fault; never a traceback, never a silently wrong result.
"""

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO_ROOT, assert_one_line_stderr, dead_pid, write_embedding_output


def assert_one_line_error(capsys, code, *needles):
    assert_one_line_stderr(code, capsys.readouterr().err, *needles)


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
    ("--language_alpha=2", "--language_alpha")])
def test_train_flag_mistakes(train_args, capsys, flag, needle):
    from lealla_tf.cli.train import main

    args = [a for a in train_args() if not a.startswith(flag.split("=")[0] + "=")] + [flag]
    assert_one_line_error(capsys, main(args), needle)


def test_train_data_faults_name_the_file(train_args, tmp_path, capsys):
    from lealla_tf.cli.train import main
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


def test_a_failed_first_run_does_not_block_the_corrected_rerun(train_args, tmp_path, capsys):
    from lealla_tf.cli.train import main

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "fra-eng.tsv").write_text("")
    assert_one_line_error(capsys, main(train_args(data=str(empty))), "no well-formed pairs",
                          "fra-eng.tsv")
    assert not (tmp_path / "m" / "config.json").exists()
    assert main(train_args("--margin=0.2")) == 0


def test_zero_learning_rate_is_kept(train_args, tmp_path):
    from lealla_tf.cli.train import main
    from lealla_tf.configs import read_json

    assert main(train_args("--learning_rate=0")) == 0
    assert read_json(str(tmp_path / "m" / "config.json"))["optimizer"]["learning_rate"] == 0.0


def test_a_checkpoint_write_cut_by_a_kill_is_cleaned_on_resume(train_args, tmp_path):
    from lealla_tf.cli.train import main

    assert main(train_args()) == 0
    leftover = tmp_path / "m" / "checkpoints" / "ckpt-2_temp" / "part-00000-of-00001"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half a checkpoint")
    assert main([a for a in train_args() if a != "--train_steps=1"] + ["--train_steps=2"]) == 0
    assert not leftover.parent.exists()


def test_vocab_faults(tmp_path, capsys):
    from lealla_tf.cli.vocab import main

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "deu-eng.tsv").write_text("only one column\n")
    out = str(tmp_path / "v.txt")
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'd'}", "--vocab_size=100",
                                        f"--output={out}"]), "no well-formed pairs")
    # SentencePiece used to end in its own RuntimeError here.
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'd'}", "--vocab_size=100",
                                        "--sentencepiece", f"--output={tmp_path / 'sp.model'}"]),
                          "no well-formed pairs", "deu-eng.tsv")
    (tmp_path / "d" / "deu-eng.tsv").unlink()
    (tmp_path / "d" / "fra-eng.tsv.gz").write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'd'}", "--vocab_size=100",
                                        f"--output={out}"]), "fra-eng.tsv.gz")


def test_vocab_outputs_sizes_and_binary_inputs(tmp_path, capsys, monkeypatch):
    """A directory --output failed after the vocabulary was learned; a --vocab_size
    below the character count and a binary --input ended in SentencePiece's
    RuntimeError traceback."""
    from lealla_tf.cli.vocab import main
    from lealla_tf.tokenizers import vocabulary

    data = tmp_path / "d"
    data.mkdir()
    (data / "deu-eng.tsv").write_text("Der Hund ist nett.\tThe dog is nice.\n"
                                      "Die Katze ist groß.\tThe cat is big.\n" * 3)
    (tmp_path / "out").mkdir()
    (tmp_path / "sp.model").mkdir()
    with monkeypatch.context() as patched:
        for name in ("count_words", "read_sentences"):
            patched.setattr(vocabulary, name, lambda *_, **__: pytest.fail("learned first"))
        for args, needles in (
                ([f"--output={tmp_path / 'out'}"], [f"--output={tmp_path / 'out'}",
                                                     "is a directory"]),
                ([f"--output={tmp_path / 'sp'}", "--sentencepiece"],
                 [f"--output={tmp_path / 'sp'}: {tmp_path / 'sp.model'} is a directory"]),
                ([f"--output={tmp_path / 'v.txt'}", f"--report_json={tmp_path / 'out'}"],
                 ["--report_json", "is a directory"])):
            assert_one_line_error(capsys, main([f"--input={data}", "--vocab_size=100", *args]),
                                  *needles)
    for extra in ([], ["--sentencepiece"]):
        assert_one_line_error(capsys, main([f"--input={data}", "--vocab_size=12", *extra,
                                            f"--output={tmp_path / 'small.model'}"]),
                              "--vocab_size=12 is below the", "characters",
                              "--character_coverage")
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "fra-eng.tsv").write_bytes(bytes(range(256)) * 64)
    for given in (binary, "/bin/ls"):
        for extra in ([], ["--sentencepiece"]):
            assert_one_line_error(capsys, main([f"--input={given}", "--vocab_size=1000", *extra,
                                                f"--output={tmp_path / 'b.model'}"]),
                                  "is a binary file, not text")
    assert not list(tmp_path.glob("small*")) and not list(tmp_path.glob("b.*"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, sentence_vocab_file):
    from lealla_tf.configs import EncoderConfig, TokenizerConfig
    from lealla_tf.inference.export import export_lealla_model
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.models.model_dir import save_encoder_checkpoint, write_model_config
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("exported")
    tokenizer = Tokenizer(sentence_vocab_file)
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=8, intermediate_dim=8,
                                          pooling="mean"))
    write_model_config(str(root / "model"), encoder.encoder_config,
                       TokenizerConfig(max_seq_length=16), source_vocab_file=sentence_vocab_file)
    save_encoder_checkpoint(str(root / "model"), encoder)
    return {"model_dir": str(root / "model"),
            "export": export_lealla_model(encoder, tokenizer, str(root / "export"))}


def test_evaluate_faults(exported, tiny_tatoeba_dir, tmp_path, capsys):
    from lealla_tf.cli.evaluate import main

    base = [f"--model={exported['export']}", f"--tatoeba_dir={tiny_tatoeba_dir}",
            "--no_progress"]
    assert_one_line_error(capsys, main(base + ["--max_pairs=-1",
                                               f"--output_json={tmp_path / 'e.json'}"]),
                          "--max_pairs")
    assert_one_line_error(capsys, main(base + [f"--output_json={tmp_path}"]), "--output_json")
    empty = tmp_path / "tatoeba"
    empty.mkdir()
    (empty / "tatoeba.xho-eng.xho").write_text("")
    (empty / "tatoeba.xho-eng.eng").write_text("")
    assert_one_line_error(capsys, main([f"--model={exported['export']}",
                                        f"--tatoeba_dir={empty}", "--no_progress",
                                        f"--output_json={tmp_path / 'e.json'}"]),
                          "tatoeba.xho-eng.xho")
    # --max_pairs=1 keeps exactly one pair a language (not "all but the last").
    assert main(base + ["--max_pairs=1", f"--output_json={tmp_path / 'one.json'}"]) == 0
    metrics = json.load(open(tmp_path / "one.json"))["metrics"]
    assert {v for k, v in metrics.items() if k.endswith("/pairs")} == {1}


def test_evaluate_input_faults_are_named_before_the_model_loads(exported, tiny_tatoeba_dir,
                                                                tmp_path, capsys, monkeypatch):
    """An incomplete Tatoeba language was dropped from the average, gold ids that
    are in no sentence file halved recall, a missing .gold file scored 0: all
    with exit 0. Each is one line naming the file, before the model is loaded."""
    import shutil

    from lealla_tf.cli.evaluate import main
    from lealla_tf.evaluation.retrieval import write_bucc_split
    from lealla_tf.inference import embedder

    monkeypatch.setattr(embedder, "load_embedder", lambda *_: pytest.fail("model loaded"))
    tatoeba = tmp_path / "tatoeba"
    shutil.copytree(tiny_tatoeba_dir, tatoeba)
    (tatoeba / "tatoeba.deu-eng.eng").unlink()
    base = [f"--model={exported['export']}", "--no_progress",
            f"--output_json={tmp_path / 'e.json'}"]
    assert_one_line_error(capsys, main(base + [f"--tatoeba_dir={tatoeba}"]),
                          "tatoeba.deu-eng.eng is missing")
    rows = [("de-0", "Hund"), ("de-1", "Katze")], [("en-0", "dog"), ("en-1", "cat")]
    for split in ("training", "test"):
        write_bucc_split(str(tmp_path / "bucc"), "deu", split, *rows, [("de-0", "en-0")])
    bucc = base + [f"--tatoeba_dir={tiny_tatoeba_dir}", f"--bucc_dir={tmp_path / 'bucc'}",
                   "--bucc_languages=deu"]
    gold = tmp_path / "bucc" / "deu-en.test.gold"
    gold.write_text("de-0\ten-0\nde-5\ten-1\n")
    assert_one_line_error(capsys, main(bucc), str(gold), "line 2: source id 'de-5' unknown")
    gold.unlink()
    assert_one_line_error(capsys, main(bucc), str(gold), "not found")
    assert not (tmp_path / "e.json").exists()


def test_a_model_that_does_not_embed_strings_is_one_line(exported, tiny_tatoeba_dir, tmp_path,
                                                        capsys):
    """The encoder half of a LaBSE/2-format pair gave a 30-line signature dump; a
    model directory whose config.json is {} a KeyError."""
    import shutil

    from lealla_tf.cli.evaluate import main
    from lealla_tf.inference.embedder import load_embedder
    from lealla_tf.inference.export import export_model_dir

    export_model_dir(exported["model_dir"], str(tmp_path / "pair"), "labse")
    empty_config = tmp_path / "empty_config"
    shutil.copytree(exported["model_dir"], empty_config)
    (empty_config / "config.json").write_text("{}")
    base = [f"--tatoeba_dir={tiny_tatoeba_dir}", "--no_progress",
            f"--output_json={tmp_path / 'e.json'}"]
    for model, message in (
            (tmp_path / "pair" / "encoder",
             f"{tmp_path / 'pair' / 'encoder'} is the encoder half of the LaBSE/2-format pair "
             f"{tmp_path / 'pair'}: pass --model={tmp_path / 'pair'}"),
            (empty_config,
             f"{empty_config / 'config.json'} has no 'encoder' section: {empty_config} is not a "
             "complete lealla_tf model directory (written by `python -m lealla_tf.train` or "
             "`export/import_checkpoint.py`)")):
        with pytest.raises(ValueError) as raised:
            load_embedder(str(model))
        assert str(raised.value) == message
        assert_one_line_error(capsys, main([f"--model={model}", *base]), message)


def test_export_with_a_missing_checkpoint(exported, tmp_path):
    result = subprocess.run(
        [sys.executable, "export/export_tfhub.py", f"--model_dir={exported['model_dir']}",
         f"--export_path={tmp_path / 'x'}", "--checkpoint=/nonexistent/ckpt-7"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore"))
    assert_one_line_stderr(result.returncode, result.stderr,
                           "checkpoint /nonexistent/ckpt-7 not found")


def test_embed_corpus_faults(exported, tmp_path, capsys):
    from lealla_tf.pipelines.embed_corpus import main

    (tmp_path / "ids.tsv").write_text("a\tThe dog.\nb\tThe cat.\na\tA house.\n")
    base = [f"--model={exported['export']}", f"--output={tmp_path / 'out'}"]
    # The message names the duplicated id and where it occurs.
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'ids.tsv'}", "--format=tsv",
                                        *base]), "1 id occurs more than once",
                          "'a' (2x: ids.tsv:1, ids.tsv:3)")
    assert not (tmp_path / "out" / "MANIFEST.json").exists()  # nothing committed
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'ids.tsv'}",
                                        "--model_batch_size=0", *base]), "--model_batch_size")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "out").mkdir(exist_ok=True)
        (tmp_path / "out" / ".lock").write_text(str(holder.pid))
        assert_one_line_error(capsys, main([f"--input={tmp_path / 'ids.tsv'}", *base]),
                              "another run", str(holder.pid))
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone: its stale lock is taken over.
    assert main([f"--input={tmp_path / 'ids.tsv'}", *base]) == 0
    assert not (tmp_path / "out" / ".lock").exists()
    # A --model that is no model is refused before any worker starts.
    assert_one_line_error(capsys, main([f"--input={tmp_path / 'ids.tsv'}",
                                        f"--model={tmp_path / 'no_model'}",
                                        f"--output={tmp_path / 'out2'}"]), "no_model")
    assert not (tmp_path / "out2").exists()


def test_model_and_export_paths_that_cannot_be_written(train_args, tmp_path, capsys):
    from lealla_tf.cli.train import main
    from lealla_tf.inference.export import export_model_dir

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_one_line_error(capsys, main(train_args(model_dir=str(a_file / "sub"))),
                          "--model_dir", "is a file")
    with pytest.raises(ValueError, match="--export_path=.* is a file"):
        export_model_dir(str(tmp_path / "any"), str(a_file))


@pytest.mark.parametrize("flag", ["--time_budget_minutes=nan", "--time_budget_minutes=inf",
                                  "--seed=-1"])
def test_train_flags_with_no_meaning_are_refused_naming_them(train_args, capsys, flag):
    """A budget of nan or inf minutes trained on (nan stops nothing); a negative
    seed failed in Keras with a message naming no flag."""
    from lealla_tf.cli.train import main

    args = [a for a in train_args() if not a.startswith(flag.split("=")[0] + "=")] + [flag]
    assert_one_line_error(capsys, main(args), flag.split("=")[0])


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
    from lealla_tf.cli.train import main

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
    assert main(train_args(model_dir=model_dir)) == 0
    assert (model_dir / "config.json").exists()


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale_lock"])
def test_output_lock_has_one_winner_among_racing_threads(tmp_path, stale):
    """Threads (one pid) race for one output, free or holding a killed run's lock:
    exactly one wins each round, every other one gets OutputLockedError."""
    from lealla_tf.mining.shards import OutputLockedError, output_lock

    contenders, dead = 8, dead_pid()
    for round_number in range(25):
        folder = tmp_path / f"round{round_number}"
        folder.mkdir()
        if stale:
            (folder / ".lock").write_text(str(dead))
        start, outcomes = threading.Barrier(contenders), []

        def contend(folder=str(folder), start=start, outcomes=outcomes):
            start.wait()
            try:
                with output_lock(folder):
                    outcomes.append("won")
                    deadline = time.time() + 20  # hold until every other one has tried
                    while len(outcomes) < contenders and time.time() < deadline:
                        time.sleep(0.001)
            except OutputLockedError as error:
                outcomes.append(str(error))

        threads = [threading.Thread(target=contend) for _ in range(contenders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(outcomes) == contenders and outcomes.count("won") == 1, outcomes
        assert all("being written by another run" in outcome
                   for outcome in outcomes if outcome != "won"), outcomes
        # Released, and no temporary lock file left behind.
        assert [name for name in os.listdir(folder) if name != ".lock.guard"] == []


LOCK_CONTENDER = """
import os, sys, time
from lealla_tf.mining.shards import OutputLockedError, output_lock
folder, signals, contenders = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(os.path.join(signals, f"ready-{os.getpid()}"), "w").close()
while not os.path.exists(os.path.join(signals, "go")):
    time.sleep(0.001)
def report(outcome):
    with open(os.path.join(signals, f"result-{os.getpid()}"), "w") as f:
        f.write(outcome)
try:
    with output_lock(folder):
        report("won")
        deadline = time.time() + 60  # hold until every other one has tried
        while (sum(n.startswith("result-") for n in os.listdir(signals)) < contenders
               and time.time() < deadline):
            time.sleep(0.01)
except OutputLockedError as error:
    report(str(error))
"""


def test_output_lock_has_one_winner_among_racing_processes(tmp_path):
    """Processes race for an output that holds a killed run's lock: exactly one
    takes it over, the others are refused naming the winner's pid."""
    folder, signals, contenders = tmp_path / "out", tmp_path / "signals", 4
    folder.mkdir()
    signals.mkdir()
    (folder / ".lock").write_text(str(dead_pid()))
    processes = [subprocess.Popen([sys.executable, "-c", LOCK_CONTENDER, str(folder),
                                   str(signals), str(contenders)], cwd=REPO_ROOT)
                 for _ in range(contenders)]
    try:
        deadline = time.time() + 120
        while (sum(name.startswith("ready-") for name in os.listdir(signals)) < contenders
               and time.time() < deadline):
            time.sleep(0.01)
        (signals / "go").touch()
        for process in processes:
            assert process.wait(timeout=120) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    outcomes = {int(path.name.split("-")[1]): path.read_text()
                for path in signals.glob("result-*")}
    winners = [pid for pid, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == contenders and len(winners) == 1, outcomes
    for pid, outcome in outcomes.items():
        if pid != winners[0]:
            assert "another run" in outcome and f"pid {winners[0]}" in outcome, outcome
    assert [name for name in os.listdir(folder) if name != ".lock.guard"] == []


def test_output_lock_takes_over_only_a_stale_lock(tmp_path):
    from lealla_tf.mining.shards import UNREADABLE_LOCK_SECONDS, OutputLockedError, output_lock

    lock = tmp_path / ".lock"
    # A killed run's lock (its pid is gone) is taken over; the new lock names its pid.
    lock.write_text(str(dead_pid()))
    with output_lock(str(tmp_path)):
        assert lock.read_text().split()[0] == str(os.getpid())
    assert not lock.exists()
    # A lock with no pid yet is a run starting: held while young, stale once old.
    lock.write_text("")
    with pytest.raises(OutputLockedError, match="another run"):
        with output_lock(str(tmp_path)):
            pass
    assert lock.exists()
    old = time.time() - UNREADABLE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    with output_lock(str(tmp_path)):
        pass
    assert not lock.exists()
    # The same process again (another thread, or nested): refused, the lock kept.
    with output_lock(str(tmp_path)):
        with pytest.raises(OutputLockedError, match=f"pid {os.getpid()}"):
            with output_lock(str(tmp_path)):
                pass
        assert lock.exists()
    assert not lock.exists()
    # Remote outputs are not locked (documented): nothing is written.
    with output_lock("gs://no-bucket/out"):
        pass


def test_same_file_name_in_two_folders_gives_two_ids(exported, tmp_path):
    from lealla_tf.mining.shards import read_embeddings
    from lealla_tf.pipelines.embed_corpus import embed_corpus

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "deu.txt").write_text("Der Hund.\n")
    embed_corpus([str(tmp_path / "*" / "deu.txt")], exported["export"], str(tmp_path / "out"))
    ids, _ = read_embeddings(str(tmp_path / "out"))
    assert sorted(ids) == ["a/deu.txt:1", "b/deu.txt:1"]


def test_mine_bitext_faults(tmp_path, capsys):
    from lealla_tf.pipelines.mine_bitext import main

    assert_one_line_error(capsys, main([f"--source={tmp_path}", f"--target={tmp_path}",
                                        f"--output={tmp_path / 'm.tsv'}", "--k=0"]), "--k")
    assert_one_line_error(capsys, main([f"--source={tmp_path}", f"--target={tmp_path}",
                                        f"--output={tmp_path / 'm.tsv'}"]), "MANIFEST")
    assert_one_line_error(capsys, main([f"--source={tmp_path}", f"--target={tmp_path}",
                                        f"--output={tmp_path / 'm.tsv'}", "--threshold=nan"]),
                          "--threshold")


def test_mine_bitext_script_with_k_zero_exits_2_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "beam_pipelines/mine_bitext.py", f"--source={tmp_path}",
         f"--target={tmp_path}", f"--output={tmp_path / 'm.tsv'}", "--k=0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert_one_line_stderr(result.returncode, result.stderr, "--k must be at least 1, got 0")


def test_mine_bitext_input_faults(tmp_path, capsys):
    import numpy as np

    from lealla_tf.pipelines.mine_bitext import main

    rng = np.random.default_rng(0)
    write_embedding_output(tmp_path / "d8", rng.normal(size=(30, 8)))
    write_embedding_output(tmp_path / "d6", rng.normal(size=(30, 6)))
    write_embedding_output(tmp_path / "empty", np.zeros((0, 8)), shards=1)

    def mine_args(source="d8", target="d8", *extra):
        return [f"--source={tmp_path / source}", f"--target={tmp_path / target}",
                f"--output={tmp_path / 'm.tsv'}", *extra]

    for args, needles in [
            (mine_args("d8", "d6"), ["--source and --target", "differ in dimension (8 vs 6)"]),
            (mine_args("empty", "d8"), ["--source=", "has no embeddings"]),
            (mine_args("d8", "empty"), ["--target=", "has no embeddings"]),
            (mine_args("d8", "d8", "--k=-3"), ["--k"]),
            (mine_args("d8", "d8", "--memory_budget_gb=0.001"), ["memory_budget_gb=0.001"]),
            (mine_args("d8", "d8", "--memory_budget_gb=-1"), ["memory_budget_gb"]),
            (mine_args("d8", "d8", "--index=ivfpq"), ["ivfpq needs at least 256"]),
            (mine_args("d8", "d8", "--index=ivf", "--nprobe=0"), ["nprobe"])]:
        assert_one_line_error(capsys, main(args), *needles)
    assert not (tmp_path / "m.tsv").exists()
    shard = next((tmp_path / "d6").glob("run-*/embeddings-00000-*.tfrecord.gz"))
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    assert_one_line_error(capsys, main(mine_args("d8", "d6")), shard.name, "unreadable")


def listing(folder):
    """Every path under `folder`, relative to it."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("command", ["embed_corpus", "mine_bitext"])
def test_an_output_of_the_wrong_kind_is_one_line_and_nothing_is_written(command, request,
                                                                         tmp_path, capsys):
    """embed_corpus writes a folder, mine_bitext a file: an --output of the
    other kind, or one below a file, is one line naming the flag, checked
    before anything is written (no `.tmp-*`, no lock, no copy of a shard);
    what is there stays as it was."""
    import importlib

    import numpy as np

    main = importlib.import_module(f"lealla_tf.pipelines.{command}").main
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "mined").mkdir()
    if command == "embed_corpus":
        (tmp_path / "ok.txt").write_text("The dog is nice.\n")
        inputs = [f"--input={tmp_path / 'ok.txt'}",
                  f"--model={request.getfixturevalue('exported')['export']}"]
        wrong_kind = ("notes.txt", "is a file")
    else:
        write_embedding_output(tmp_path / "d8", np.random.default_rng(0).normal(size=(30, 8)))
        inputs = [f"--source={tmp_path / 'd8'}", f"--target={tmp_path / 'd8'}"]
        wrong_kind = ("mined", "is a folder")
    before = listing(tmp_path)
    for output, needle in [wrong_kind, ("notes.txt/out", "notes.txt is a file")]:
        assert_one_line_error(capsys, main([*inputs, f"--output={tmp_path / output}"]),
                              f"--output={tmp_path / output}", needle)
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    assert listing(tmp_path) == before


def test_a_truncated_manifest_is_named_by_mine_bitext(tmp_path, capsys):
    import numpy as np

    from lealla_tf.pipelines.mine_bitext import main

    write_embedding_output(tmp_path / "d8", np.random.default_rng(0).normal(size=(30, 8)))
    write_embedding_output(tmp_path / "cut", np.random.default_rng(1).normal(size=(30, 8)))
    manifest = tmp_path / "cut" / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:30])
    for source, target in [("d8", "cut"), ("cut", "d8")]:
        assert_one_line_error(capsys, main([f"--source={tmp_path / source}",
                                            f"--target={tmp_path / target}",
                                            f"--output={tmp_path / 'm.tsv'}"]),
                              str(manifest), "rerun embed_corpus")
    assert not (tmp_path / "m.tsv").exists()


def test_precomputed_english_only_vectors_are_not_silently_used_both_ways(
        sentence_vocab_file, tmp_path, capsys):
    import numpy as np

    from lealla_tf.cli.train import main
    from lealla_tf.train.data import write_pairs_tfrecord

    (tmp_path / "records").mkdir()
    write_pairs_tfrecord(str(tmp_path / "records" / "deu-eng.tfrecord"), [("Hund", "dog")] * 8,
                         teacher_target=np.ones((8, 4), np.float32))
    args = [f"--model_dir={tmp_path / 'm'}", f"--train_data={tmp_path / 'records'}",
            f"--vocab_file={sentence_vocab_file}", "--objective=ams+fd"]
    assert_one_line_error(capsys, main(args), "--teacher_english_only")


# === What the command lines print (issue 46, item 4) ===

# TensorFlow's and absl's C++ log lines (the oneDNN and CPU-feature notices, the
# failed cuInit of a machine without a GPU), Python logging's INFO lines (Beam's),
# and tensorflow_hub's pkg_resources warning.
START_UP_NOISE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages|INFO:|"
                            r"To enable the following instructions)|cuInit|pkg_resources")


def run_as_a_user(*args, progress_seconds="0"):
    """A command line as a user starts it: without the suite's quieting variables
    (TF_CPP_MIN_LOG_LEVEL, CUDA_VISIBLE_DEVICES), stdout and stderr piped (not a
    terminal, as in a log file), a progress line at every update."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "PYTHONWARNINGS")
           and not name.startswith("TQDM_")}
    env["LEALLA_TF_PROGRESS_SECONDS"] = progress_seconds
    done = subprocess.run([sys.executable, *map(str, args)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    noise = [line for line in (done.stdout + done.stderr).splitlines()
             if START_UP_NOISE.search(line)]
    assert not noise, noise
    return done


@pytest.mark.slow
def test_embed_corpus_and_mine_bitext_print_progress_lines_and_a_summary(exported, tmp_path):
    (tmp_path / "in.txt").write_text("The dog is nice.\n\nDer Hund ist nett.\nI like tea.\n")
    output = tmp_path / "embeddings"
    done = run_as_a_user("beam_pipelines/embed_corpus.py", f"--input={tmp_path / 'in.txt'}",
                         f"--model={exported['export']}", f"--output={output}")
    assert "\r" not in done.stderr
    steps = done.stderr.splitlines()
    assert steps and all(line.startswith(("reading: ", "embedding: ")) for line in steps), steps
    assert steps[-1].startswith("embedding: 100% (3/3)")
    assert "4 lines read from 1 file" in done.stdout and "dead-lettered  1 line -> " in done.stdout
    assert f"output         {output}" in done.stdout
    assert f"ids, vectors = read_embeddings({str(output)!r})" in done.stdout

    mined = tmp_path / "mined.tsv"
    done = run_as_a_user("beam_pipelines/mine_bitext.py", f"--source={output}",
                         f"--target={output}", f"--output={mined}", "--k=1")
    assert "\r" not in done.stderr
    steps = done.stderr.splitlines()
    assert steps and all(line.startswith("mine_bitext: ") for line in steps), steps
    assert any("forward search done" in line for line in steps), steps
    assert "pairs mined from 3 source x 3 target sentences" in done.stdout
    assert f"output         {mined} (TSV" in done.stdout and str(mined) + ".dead_letter.jsonl" \
        in done.stdout
    namespace = {}
    exec(done.stdout.split("read it in Python:\n")[1].strip(), namespace)
    assert [row[1] for row in namespace["rows"]] == [row[2] for row in namespace["rows"]]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["evaluate", "export", "train", "kernels"])
def test_command_lines_start_without_tensorflow_start_up_lines(command, exported, train_args,
                                                               tiny_tatoeba_dir, tmp_path):
    """No TensorFlow start-up lines on a machine without a GPU (nor on one with
    it), and progress in a log file as whole lines."""
    args = {
        "evaluate": ["-m", "lealla_tf.cli.evaluate", f"--model={exported['export']}",
                     f"--tatoeba_dir={tiny_tatoeba_dir}", f"--output_json={tmp_path / 'e.json'}"],
        "export": ["export/export_tfhub.py", f"--model_dir={exported['model_dir']}",
                   f"--export_path={tmp_path / 'x'}"],
        # The trainer's own bar is not yet this helper's (trainer.py): --no_progress.
        "train": ["-m", "lealla_tf.cli.train", *train_args()],
        "kernels": ["-m", "lealla_tf.models.kernels"],
    }[command]
    done = run_as_a_user(*args)
    if command != "train":
        assert "\r" not in done.stderr
