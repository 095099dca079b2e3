"""lealla_tf.pipelines.embed_corpus on Beam's local runner (and a dask cluster),
with a model our exporter made: every line embedded or dead-lettered, safe
reruns, one writer an output."""

import gzip
import json
import os
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import CORPUS_SENTENCES

from lealla_tf.configs import DataConfig, EncoderConfig
from lealla_tf.mining.run_folders import read_manifest
from lealla_tf.mining.shards import read_embeddings
from lealla_tf.models.encoder import build_encoder
from lealla_tf.pipelines import corpus_steps
from lealla_tf.pipelines.embed_corpus import embed_corpus
from lealla_tf.pipelines.options import partition_of
from lealla_tf.tokenizers.tokenizer import Tokenizer
from lealla_tf.train.data import find_training_files, pair_dataset, teacher_dimension_of


@pytest.fixture()
def corpus(tmp_path):
    (tmp_path / "in").mkdir()
    lines = CORPUS_SENTENCES[:4] + [""] + CORPUS_SENTENCES[4:]
    (tmp_path / "in" / "a.txt").write_bytes(
        ("\n".join(lines[:3]) + "\n").encode() + b"\xff\xfe not utf-8\n" + (
            "\n".join(lines[3:]) + "\n").encode())
    (tmp_path / "in" / "b.txt.gz").write_bytes(gzip.compress(b"   \nThe dog is nice.\n"))
    return tmp_path


def test_embeds_every_valid_line_and_dead_letters_the_rest(corpus_model, corpus):
    path, reference = corpus_model
    output = str(corpus / "out")
    manifest = embed_corpus([str(corpus / "in" / "*")], path, output, num_shards=3)
    counts = manifest["counts"]
    assert counts == {"lines_read": 11, "embedded": 8, "dead_lettered": 3}
    assert counts["lines_read"] == counts["embedded"] + counts["dead_lettered"]
    ids, vectors, texts = read_embeddings(output, with_text=True)
    assert ids[:3] == ["a.txt:1", "a.txt:2", "a.txt:3"] and len(ids) == 8
    for text, vector in zip(texts, vectors):
        np.testing.assert_allclose(vector, reference[text], atol=1e-5)
    dead = [json.loads(line) for f in manifest["files"] if "dead_letter" in f
            for line in pathlib.Path(output, f).read_text().splitlines()]
    assert sorted(d["reason"] for d in dead) == ["empty", "empty", "invalid_utf8"]
    assert {(os.path.basename(d["file"]), d["line"]) for d in dead} == {
        ("a.txt", 4), ("a.txt", 6), ("b.txt.gz", 1)}
    # Where the time went: each stage inside the pipeline's run, in order.
    timeline = manifest["timeline"]
    stages = timeline["stages"]
    assert list(stages) == ["read", "model", "embed", "write"]
    for span in stages.values():
        assert 0 <= span["from"] <= span["to"] <= timeline["seconds"] + 1e-3
        assert span["busy"] >= 0
    assert stages["read"]["from"] <= stages["embed"]["from"] <= stages["write"]["to"]


def test_the_timeline_is_told_in_the_stages_order():
    """A manifest read back has its keys sorted; the line keeps the run's order."""
    from lealla_tf.pipelines.embed_corpus import describe_timeline

    span = {"from": 1.0, "to": 2.0, "busy": 1.0}
    line = describe_timeline({"seconds": 3.0, "stages": {"embed": span, "read": span,
                                                         "write": span}})
    assert line == ("3.0 s: read 1.0-2.0 s (busy 1.0 s); embed 1.0-2.0 s (busy 1.0 s); "
                    "write 1.0-2.0 s (busy 1.0 s)")


def test_an_int8_tflite_export_embeds_a_corpus(corpus_model, corpus, sentence_vocab_file,
                                                tmp_path):
    from lealla_tf.inference.formats import export_int8_tflite

    tokenizer = Tokenizer(sentence_vocab_file)
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=16, intermediate_dim=16,
                                          pooling="mean"))
    path = export_int8_tflite(encoder, tokenizer, str(tmp_path / "int8"))
    manifest = embed_corpus([str(corpus / "in" / "a.txt")], path, str(tmp_path / "out"))
    assert manifest["counts"] == {"lines_read": 9, "embedded": 7, "dead_lettered": 2}
    ids, vectors, texts = read_embeddings(str(tmp_path / "out"), with_text=True)
    want = encoder(tokenizer(tf.constant(texts)))["sentence_embedding"].numpy()
    assert np.sum(vectors * want, axis=1).min() > 0.98


def test_rerun_into_the_same_output_is_safe(corpus_model, corpus):
    path, _ = corpus_model
    output = str(corpus / "out")
    first = embed_corpus([str(corpus / "in" / "a.txt")], path, output)
    ids_first, vectors_first = read_embeddings(output)
    second = embed_corpus([str(corpus / "in" / "a.txt")], path, output, num_shards=2)
    assert first["run"] != second["run"]
    assert [d for d in os.listdir(output) if d.startswith("run-")] == [second["run"]]
    ids_second, vectors_second = read_embeddings(output)
    assert ids_first == ids_second
    np.testing.assert_allclose(vectors_first, vectors_second, atol=1e-6)


def test_tsv_input_keeps_the_given_ids(corpus_model, tmp_path):
    path, reference = corpus_model
    (tmp_path / "ids.tsv").write_text("doc-10\tThe dog is nice.\ndoc-2\tI like tea.\nno id\n")
    manifest = embed_corpus([str(tmp_path / "ids.tsv")], path, str(tmp_path / "out"),
                            input_format="tsv")
    assert manifest["counts"] == {"lines_read": 3, "embedded": 2, "dead_lettered": 1}
    ids, vectors = read_embeddings(str(tmp_path / "out"))
    assert ids == ["doc-2", "doc-10"]
    np.testing.assert_allclose(vectors[1], reference["The dog is nice."], atol=1e-5)


def test_pairs_mode_writes_training_records_with_teacher_vectors(corpus_model, tmp_path):
    path, reference = corpus_model
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "deu-eng.tsv.gz").write_bytes(gzip.compress(
        b"Der Hund ist nett.\tThe dog is nice.\nIch mag Tee.\tI like tea.\nbroken line\n"
))
    output = str(tmp_path / "pairs")
    manifest = embed_corpus([str(tmp_path / "in" / "*.tsv.gz")], path, output, pairs=True,
                            english_only=True)
    assert manifest["counts"] == {"lines_read": 3, "embedded": 2, "dead_lettered": 1}
    files = find_training_files([output])
    assert {f.language for f in files} == {"deu"}
    assert teacher_dimension_of(files) == 16
    pairs, _ = pair_dataset(DataConfig([output], shuffle_buffer=1), 1, teacher_dim=16,
                            teacher_source=False)
    seen = {}
    for pair in pairs.take(2):
        seen[pair["tgt_raw"].numpy().decode()] = pair["teacher_tgt"].numpy()
    for english, vector in seen.items():
        np.testing.assert_allclose(vector, reference[english], atol=1e-5)


@pytest.mark.slow
def test_several_worker_processes(corpus_model, corpus):
    path, _ = corpus_model
    manifest = embed_corpus([str(corpus / "in" / "*")], path, str(corpus / "multi"),
                            pipeline_args=["--direct_num_workers=2",
                                           "--direct_running_mode=multi_processing"])
    assert manifest["counts"] == {"lines_read": 11, "embedded": 8, "dead_lettered": 3}




def test_a_token_cap_cuts_smaller_batches_with_the_same_vectors(corpus_model, corpus):
    path, reference = corpus_model
    output = str(corpus / "capped")
    inputs = [str(corpus / "in" / "*")]
    with pytest.raises(ValueError, match="--model_max_tokens must be at least 0"):
        embed_corpus(inputs, path, output, model_max_tokens=-1)
    # 8 padded tokens a call: every sentence alone or with one other
    embed_corpus(inputs, path, output, model_max_tokens=8, num_shards=1)
    ids, vectors, texts = read_embeddings(output, with_text=True)
    assert len(ids) == 8
    for text, vector in zip(texts, vectors):
        np.testing.assert_allclose(vector, reference[text], atol=1e-5)



def test_same_file_name_in_two_folders_gives_two_ids(corpus_model, tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "deu.txt").write_text("Der Hund.\n")
    embed_corpus([str(tmp_path / "*" / "deu.txt")], corpus_model[0], str(tmp_path / "out"))
    ids, _ = read_embeddings(str(tmp_path / "out"))
    assert sorted(ids) == ["a/deu.txt:1", "b/deu.txt:1"]


def test_missing_input_is_an_error(corpus_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="no input files match"):
        embed_corpus([str(tmp_path / "none*.txt")], corpus_model[0], str(tmp_path / "o"))


# A run killed (SIGKILL) after it made its run folder and started a shard.
KILLED_RUN = """
import os, signal, sys
from lealla_tf.folder_lock import one_writer
from lealla_tf.mining.run_folders import run_directory
with one_writer(sys.argv[1]), run_directory(sys.argv[1]) as run_dir:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "embeddings-00000-of-00004.tfrecord.gz.tmp-1-0123abcd"),
              "wb") as f:
        f.write(b"half")
    print(os.path.basename(run_dir), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def kill_a_run(output) -> str:
    """The run folder a run into `output` made before it was killed."""
    import subprocess

    result = subprocess.run([sys.executable, "-c", KILLED_RUN, str(output)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == -9, result.stderr
    return result.stdout.strip()


def test_refused_and_killed_runs_leave_no_run_folder(corpus_model, tmp_path):
    """A refused run (duplicate ids) removes its own run folder at once; the
    folder of a killed run (never committed) is removed by the next run, which
    holds the lock. The committed run, and folders that are not run folders
    of ours (even one named as ours), stay."""
    path, _ = corpus_model
    (tmp_path / "ok.txt").write_text("The dog is nice.\n")
    (tmp_path / "ids.tsv").write_text("a\tThe dog.\nb\tThe cat.\na\tA house.\n")
    output = tmp_path / "out"
    committed = embed_corpus([str(tmp_path / "ok.txt")], path, str(output))["run"]
    killed = kill_a_run(output)
    assert (output / killed).is_dir()
    not_ours = ["run-notes", "notes", "run-20240101T000000123456Z"]  # the last named as ours
    for folder in not_ours:
        (output / folder).mkdir()
    with pytest.raises(RuntimeError, match="more than once"):
        embed_corpus([str(tmp_path / "ids.tsv")], path, str(output), input_format="tsv")
    assert sorted(p.name for p in output.iterdir() if not p.name.startswith(".")) == sorted(
        [committed, "MANIFEST.json"] + not_ours)
    assert read_manifest(str(output))["run"] == committed
    ids, _ = read_embeddings(str(output))
    assert ids == ["ok.txt:1"]


def test_a_commit_removes_only_the_runs_this_output_made(corpus_model, tmp_path):
    """Committing a run removes the run it replaces and nothing of the user's:
    `run-important/`, and a folder named as a run of ours that no run of this
    output made, stay as they were. A truncated MANIFEST.json does not stop
    the rerun that repairs it, and the run it named is still removed."""
    path, _ = corpus_model
    (tmp_path / "ok.txt").write_text("The dog is nice.\n")
    output = tmp_path / "out"
    args = ([str(tmp_path / "ok.txt")], path, str(output))
    first = embed_corpus(*args)["run"]
    users = {"run-important": "my notes\n", "run-20240101T000000123456Z": "mine too\n"}
    for folder, text in users.items():
        (output / folder).mkdir()
        (output / folder / "keep.txt").write_text(text)
    second = embed_corpus(*args)["run"]
    assert not (output / first).exists()
    manifest = output / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:20])  # truncated
    third = embed_corpus(*args)["run"]
    assert sorted(p.name for p in output.iterdir() if not p.name.startswith(".")) == sorted(
        [third, "MANIFEST.json", *users])
    assert second != third
    for folder, text in users.items():
        assert (output / folder / "keep.txt").read_text() == text
    assert read_embeddings(str(output))[0] == ["ok.txt:1"]



# === The same pipeline on a dask.distributed cluster (loopback only) ===

def read_dead_letters(output):
    manifest = read_manifest(output)
    return sorted(line for f in manifest["files"] if "dead_letter" in f
                  for line in pathlib.Path(output, f).read_text().splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("pairs", [False, True])
def test_dask_runner_equals_the_fn_api_runner(corpus_model, corpus, dask_cluster, tmp_path, pairs):
    path, _ = corpus_model
    if pairs:
        (corpus / "pairs").mkdir()
        (corpus / "pairs" / "deu-eng.tsv.gz").write_bytes(gzip.compress(
            "\n".join(f"Der Hund {i}.\tThe dog {i}." for i in range(40)).encode()
            + b"\nbroken line\n"))
        inputs = [str(corpus / "pairs" / "*")]
    else:
        inputs = [str(corpus / "in" / "*")]
    import distributed

    outputs = {}
    for runner, flags in (("fnapi", []), ("dask", [
            "--runner=DaskRunner", f"--dask_client_address={dask_cluster.scheduler_address}"])):
        outputs[runner] = str(tmp_path / runner)
        with distributed.Client(dask_cluster.scheduler_address) as client, \
                distributed.get_task_stream(client) as stream:
            workers = sorted(client.scheduler_info()["workers"])
            manifest = embed_corpus(inputs, path, outputs[runner], num_shards=3, pairs=pairs,
                                    pipeline_args=flags)
        assert manifest["counts"]["lines_read"] == (manifest["counts"]["embedded"]
                                                    + manifest["counts"]["dead_lettered"])
    # On the DaskRunner each partition's tasks (a shard's among them) ran where
    # `PartitionWorkers` put them: partition i on the i-th worker modulo two (dask's
    # work stealing may move a few, so nine in ten; unplaced, about half would be).
    placed = [(partition_of(task["key"]), task["worker"]) for task in stream.data]
    placed = [(partition, worker) for partition, worker in placed if partition is not None]
    assert len(workers) == 2 and len(placed) > 10
    where_put = [worker == workers[partition % 2] for partition, worker in placed]
    assert sum(where_put) >= 0.9 * len(placed), placed
    assert read_manifest(outputs["fnapi"])["counts"] == read_manifest(outputs["dask"])["counts"]
    assert read_dead_letters(outputs["fnapi"]) == read_dead_letters(outputs["dask"])
    if pairs:
        def records(output):
            files = find_training_files([output])
            rows, _ = pair_dataset(DataConfig([output], shuffle_buffer=1), 1, teacher_dim=16,
                                   files=files)
            return {r["tgt_raw"].numpy(): (r["teacher_src"].numpy(), r["teacher_tgt"].numpy())
                    for r in rows.take(40)}
        a, b = records(outputs["fnapi"]), records(outputs["dask"])
        assert a.keys() == b.keys() and len(a) == 40
        for key in a:
            np.testing.assert_allclose(a[key][0], b[key][0], atol=1e-6)
            np.testing.assert_allclose(a[key][1], b[key][1], atol=1e-6)
    else:
        ids_a, vectors_a = read_embeddings(outputs["fnapi"])
        ids_b, vectors_b = read_embeddings(outputs["dask"])
        assert ids_a == ids_b
        np.testing.assert_allclose(vectors_a, vectors_b, atol=1e-6)


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(corpus_model, dask_cluster,
                                                               tmp_path):
    import signal
    import threading
    import time

    path, _ = corpus_model
    lines = [f"{CORPUS_SENTENCES[i % len(CORPUS_SENTENCES)]} {i}" for i in range(6000)]
    (tmp_path / "big.txt").write_text("\n".join(lines) + "\n")
    output = str(tmp_path / "out")
    result = {}

    def run():
        result["manifest"] = embed_corpus(
            [str(tmp_path / "big.txt")], path, output, num_shards=12, pipeline_args=[
                "--runner=DaskRunner", f"--dask_client_address={dask_cluster.scheduler_address}"])

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.time() + 300
    shards_at_kill = None
    while time.time() < deadline and thread.is_alive():
        runs = [d for d in os.listdir(output) if d.startswith("run-")] if os.path.isdir(
            output) else []
        written = [f for r in runs for f in os.listdir(os.path.join(output, r))
                   if f.startswith("embeddings") and f.endswith(".tfrecord.gz")]
        if written:
            shards_at_kill = len(written)
            import distributed

            with distributed.Client(dask_cluster.scheduler_address) as client:
                pid = next(iter(client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    thread.join(600)
    assert shards_at_kill is not None and shards_at_kill < 12, "the worker was not killed mid-run"
    assert result["manifest"]["counts"] == {"lines_read": 6000, "embedded": 6000,
                                            "dead_lettered": 0}
    ids, vectors = read_embeddings(output)
    assert sorted(ids) == sorted(f"big.txt:{i}" for i in range(1, 6001))  # once each
    assert np.all(np.isfinite(vectors))


def test_a_shard_embedded_in_chunks_gives_the_same_vectors_in_id_order(corpus_model, corpus,
                                                                        monkeypatch):
    path, reference = corpus_model
    monkeypatch.setattr(corpus_steps, "SHARD_CHUNK", 3)
    output = str(corpus / "chunked")
    embed_corpus([str(corpus / "in" / "*")], path, output, num_shards=1)
    ids, vectors, texts = read_embeddings(output, with_text=True)
    assert len(ids) == 8
    for text, vector in zip(texts, vectors):
        np.testing.assert_allclose(vector, reference[text], atol=1e-5)
