"""lealla_tf.mining.shards: an embed_corpus output read whole or as memory-mapped
copies, which are checked before use and rebuilt when they do not match."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT, write_embedding_output

from lealla_tf.mining.neighbours import Rows
from lealla_tf.mining.run_folders import DamagedManifestError, host_tag
from lealla_tf.mining.shards import mmap_embeddings, natural_key, read_embeddings


def test_read_embeddings_gives_every_row_in_natural_id_order(tmp_path):
    vectors = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
    write_embedding_output(tmp_path / "out", vectors, shards=3)
    ids, read, texts = read_embeddings(str(tmp_path / "out"), with_text=True)
    assert ids == [f"s:{row}" for row in range(12)]  # s:2 before s:10
    np.testing.assert_array_equal(read, vectors)
    assert texts == [f"text s {row}" for row in range(12)]
    assert sorted(["doc:10", "doc:2", "a"], key=natural_key) == ["a", "doc:2", "doc:10"]
    write_embedding_output(tmp_path / "empty", np.zeros((0, 4)), shards=1)
    ids, read = read_embeddings(str(tmp_path / "empty"))
    assert ids == [] and read.shape == (0, 0)


@pytest.mark.parametrize("damage", ["truncated", "not_an_object"])
def test_a_damaged_manifest_is_named_by_both_readers(tmp_path, damage):
    output = tmp_path / "out"
    write_embedding_output(output, np.random.default_rng(0).normal(size=(6, 4)), shards=2)
    manifest = output / "MANIFEST.json"
    manifest.write_bytes({"truncated": manifest.read_bytes()[:25],
                          "not_an_object": b"[1, 2]"}[damage])
    for read in (read_embeddings, mmap_embeddings):
        with pytest.raises(DamagedManifestError) as caught:
            read(str(output))
        assert caught.value.path == str(manifest) and "rerun embed_corpus" in str(caught.value)
    manifest.unlink()
    with pytest.raises(FileNotFoundError, match="MANIFEST"):
        read_embeddings(str(output))


def test_memory_mapped_copies_hold_the_shards(tmp_path):
    vectors = np.random.default_rng(1).normal(size=(50, 8)).astype(np.float32)
    write_embedding_output(tmp_path / "out", vectors)
    mapped = mmap_embeddings(str(tmp_path / "out"))
    assert (mapped.rows, mapped.dim, len(mapped.shards)) == (50, 8, 3)
    rows = Rows(mapped.parts, "mapped")
    ids, texts = mapped.ids(np.arange(50)), mapped.texts(np.arange(50))
    order = [int(i.split(":")[1]) for i in ids]
    np.testing.assert_array_equal(rows.read(0, 50), vectors[order])
    assert texts == [f"text s {row}" for row in order]
    assert sorted(order) == list(range(50))
    assert mapped.ids([order.index(7), order.index(3)]) == ["s:7", "s:3"]  # any order
    # Made once, beside the shards (the run folder), then reused as they are.
    vector_file = mapped.parts[0][0]
    assert os.path.dirname(os.path.dirname(vector_file)).endswith(
        json.loads((tmp_path / "out" / "MANIFEST.json").read_text())["run"])
    stamp = os.stat(vector_file).st_mtime_ns
    assert os.stat(mmap_embeddings(str(tmp_path / "out")).parts[0][0]).st_mtime_ns == stamp
    elsewhere = mmap_embeddings(str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    assert all(part[0].startswith(str(tmp_path / "cache")) for part in elsewhere.parts)
    with pytest.raises(ValueError, match="remote: pass a local cache_dir"):
        mmap_embeddings("gs://bucket/out")


def copy_folders(directory):
    return sorted(str(path) for path in pathlib.Path(directory).glob("run-*/*.mmap"))


def mapped_content(output):
    mapped = mmap_embeddings(str(output))
    rows = np.arange(mapped.rows)
    return mapped.ids(rows), mapped.texts(rows), Rows(mapped.parts, "mapped").read(0, len(rows))


@pytest.mark.parametrize("damage", ["random_bytes", "truncated_vectors", "truncated_ids_ends",
                                    "missing_texts", "garbage_meta", "older_version"])
def test_a_damaged_memory_mapped_copy_is_rebuilt(tmp_path, damage, caplog):
    """The copy is checked against what its meta.json records (sizes and
    CRC32Cs of its files, the shard's size and mtime) and rebuilt when it does
    not match: the same rows as before, never wrong ones or a traceback."""
    write_embedding_output(tmp_path / "out", np.random.default_rng(2).normal(size=(40, 8)))
    ids, texts, vectors = mapped_content(tmp_path / "out")
    folder = pathlib.Path(copy_folders(tmp_path / "out")[0])
    path = {"random_bytes": "vectors.f32", "truncated_vectors": "vectors.f32",
            "truncated_ids_ends": "ids.ends", "missing_texts": "texts.bin",
            "garbage_meta": "meta.json", "older_version": "meta.json"}[damage]
    data = (folder / path).read_bytes()
    stat = os.stat(folder / path)
    if damage == "random_bytes":  # same size, same mtime: only the checksum tells
        (folder / path).write_bytes(np.random.default_rng(1).bytes(len(data)))
        os.utime(folder / path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif damage.startswith("truncated"):
        (folder / path).write_bytes(data[:len(data) // 2 - 3])
    elif damage == "missing_texts":
        (folder / path).unlink()
    elif damage == "garbage_meta":
        (folder / path).write_bytes(b"\x00{not json")
    else:  # a copy made before meta.json recorded checksums
        meta = json.loads(data)
        (folder / path).write_text(json.dumps({key: meta[key] for key in (
            "rows", "dim", "shard", "stamp")}))
    caplog.clear()
    again = mapped_content(tmp_path / "out")
    assert again[:2] == (ids, texts)
    np.testing.assert_array_equal(again[2], vectors)
    warned = [r.getMessage() for r in caplog.records if "does not match its shard" in
              r.getMessage()]
    assert len(warned) == 1 and str(folder) in warned[0], warned
    assert (folder / path).read_bytes() == data if damage != "older_version" else True
    # Rebuilt once: the next run reuses the copy as it is.
    stamp = os.stat(folder / "vectors.f32").st_mtime_ns
    mmap_embeddings(str(tmp_path / "out"))
    assert os.stat(folder / "vectors.f32").st_mtime_ns == stamp


def test_a_column_truncated_while_in_use_is_a_one_line_error_naming_the_file(tmp_path):
    write_embedding_output(tmp_path / "out", np.ones((10, 4), np.float32), shards=1)
    mapped = mmap_embeddings(str(tmp_path / "out"))
    ends = pathlib.Path(copy_folders(tmp_path / "out")[0]) / "ids.ends"
    ends.write_bytes(ends.read_bytes()[:8 * 5 + 3])  # was a struct.error
    assert mapped.ids([0, 4]) == ["s:0", "s:4"]
    with pytest.raises(ValueError, match=f"{ends} is truncated") as error:
        mapped.ids([7])
    assert "\n" not in str(error.value)


KILLED_CONVERSION = """
import os, signal, sys
from lealla_tf.mining import shards
def write_then_die(path, folder, batch_size):
    with open(os.path.join(folder, "vectors.f32"), "wb") as half:
        half.write(b"half a copy")
    os.kill(os.getpid(), signal.SIGKILL)
shards._write_mapped = write_then_die
shards.mmap_embeddings(sys.argv[1])
"""


def test_a_killed_conversions_half_copy_is_removed_by_the_next_run_and_nothing_else(tmp_path):
    """A conversion killed (SIGKILL) mid-copy leaves `<copy>.tmp-<pid>-<host>`:
    the next run removes it; a live process's, another host's and folders not
    named by us stay."""
    write_embedding_output(tmp_path / "out", np.ones((6, 4), np.float32), shards=1)
    killed = subprocess.run([sys.executable, "-c", KILLED_CONVERSION, str(tmp_path / "out")],
                            cwd=REPO_ROOT, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert killed.returncode == -9
    run_dir = next((tmp_path / "out").glob("run-*"))
    (left,) = [p.name for p in run_dir.iterdir() if ".mmap.tmp-" in p.name]
    shard = next(run_dir.glob("*.tfrecord.gz")).name
    dead = int(left.split(".tmp-")[1].split("-")[0])
    assert left == f"{shard}.mmap.tmp-{dead}-{host_tag()}"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        removed = [f"{shard}.mmap.tmp-{dead}", left]  # the first: as earlier versions named it
        (run_dir / removed[0]).mkdir()
        kept = [f"{shard}.mmap.tmp-{live.pid}-{host_tag()}", f"{shard}.mmap.tmp-{dead}-elsewhere",
                f"{shard}.mmap.tmp-notes", "notes.mmap.tmp-1"]
        for name in kept:
            (run_dir / name).mkdir()
        assert mmap_embeddings(str(tmp_path / "out")).rows == 6
        names = {p.name for p in run_dir.iterdir()}
        assert not names & set(removed) and set(kept) <= names
    finally:
        live.kill()
        live.wait()
