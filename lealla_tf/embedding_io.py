"""Embedding shards and pair shards on disk, and the manifest that makes reruns safe.

A pipeline output directory looks like

    output/
      MANIFEST.json          the last COMPLETE run: its files and counts
      run-<timestamp>/       shards of that run (TFRecord, gzip)

A run writes into a fresh `run-*` folder and only then replaces the manifest
(atomically) and removes older runs, so rerunning into the same path never
mixes shards of two runs and a failed run leaves the previous result intact.

Embedding records are `tf.train.Example`s with `id` (bytes) and `embedding`
(float32 little-endian bytes); pair records carry `src_raw`, `tgt_raw` and the
teacher vectors `teacher_src` / `teacher_tgt` as float lists.
"""

import datetime
import json
import os
import struct
from typing import List, Optional, Tuple

import numpy as np

MANIFEST = "MANIFEST.json"


def _masked_crc32c(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecord(handle, record: bytes) -> None:
    """Appends one TFRecord (length, masked CRC32C of length, data, CRC) to `handle`."""
    length = struct.pack("<Q", len(record))
    handle.write(length)
    handle.write(struct.pack("<I", _masked_crc32c(length)))
    handle.write(record)
    handle.write(struct.pack("<I", _masked_crc32c(record)))


def embedding_example(identifier: str, vector: np.ndarray, text: Optional[str] = None) -> bytes:
    """A serialized Example: id, float32 vector and (optionally) the sentence."""
    import tensorflow as tf

    def as_bytes(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    feature = {"id": as_bytes(identifier.encode("utf-8")),
               "embedding": as_bytes(np.asarray(vector, dtype="<f4").tobytes())}
    if text is not None:
        feature["text"] = as_bytes(text.encode("utf-8"))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def new_run_directory(output_dir: str) -> str:
    """A fresh `run-<timestamp>` folder name inside `output_dir`."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return os.path.join(output_dir, f"run-{stamp}")


def commit_run(output_dir: str, run_dir: str, files: List[str], **details) -> dict:
    """Points the manifest at `run_dir` (atomically) and deletes older runs."""
    import shutil

    manifest = {"run": os.path.basename(run_dir),
                "files": sorted(os.path.relpath(f, output_dir) for f in files), **details}
    temporary = os.path.join(output_dir, MANIFEST + ".tmp")
    with open(temporary, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    os.replace(temporary, os.path.join(output_dir, MANIFEST))
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if name.startswith("run-") and path != run_dir and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
    return manifest


def read_manifest(output_dir: str) -> Optional[dict]:
    """The manifest of a pipeline output directory, or None."""
    path = os.path.join(output_dir, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def manifest_files(output_dir: str, suffix: str = ".tfrecord.gz") -> List[str]:
    """The shard files of the last complete run (FileNotFoundError if none)."""
    manifest = read_manifest(output_dir)
    if manifest is None:
        raise FileNotFoundError(f"{output_dir} has no {MANIFEST}: not a finished pipeline output")
    return [os.path.join(output_dir, f) for f in manifest["files"] if f.endswith(suffix)]


def read_embeddings(output_dir: str, with_text: bool = False):
    """(ids, float32 `[n, d]`[, texts]) of an `embed_corpus` output, in natural id order."""
    import tensorflow as tf

    files = [f for f in manifest_files(output_dir) if os.path.basename(f).startswith(
        "embeddings")]
    if not files:
        raise FileNotFoundError(f"no embedding shards listed in {output_dir}/{MANIFEST}")
    features = {"id": tf.io.FixedLenFeature([], tf.string),
                "embedding": tf.io.FixedLenFeature([], tf.string),
                "text": tf.io.FixedLenFeature([], tf.string, default_value="")}
    ids, vectors, texts = [], [], []
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(4096).map(
        lambda r: tf.io.parse_example(r, features))
    for batch in dataset:
        ids += [i.decode("utf-8") for i in batch["id"].numpy()]
        texts += [t.decode("utf-8") for t in batch["text"].numpy()]
        vectors.append(np.frombuffer(b"".join(batch["embedding"].numpy()), dtype="<f4"))
    if not ids:
        empty = ([], np.zeros((0, 0), np.float32))
        return empty + ([],) if with_text else empty
    matrix = np.concatenate(vectors).reshape(len(ids), -1).astype(np.float32)
    order = sorted(range(len(ids)), key=lambda i: natural_key(ids[i]))
    result = ([ids[i] for i in order], matrix[order])
    return result + ([texts[i] for i in order],) if with_text else result


def natural_key(identifier: str):
    """Sort key that orders "doc:2" before "doc:10"."""
    import re

    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", identifier)]
