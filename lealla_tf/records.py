"""The two record schemas the pipelines write and training and mining read, and
the TFRecord framing they are written in. They live here and nowhere else.

- pair records (training pairs): `src_raw`, `tgt_raw` (bytes) and the teacher
  vectors `teacher_src` (x^t, absent for an English-only teacher) and
  `teacher_tgt` (y^t) as float lists (`pair_example`, `pair_features`);
- embedding records: `id` (bytes), `embedding` (float32 little-endian bytes)
  and optionally `text` (`embedding_example`, `embedding_features`).

Both are `tf.train.Example`s, written by `write_tfrecord` into gzip'd TFRecord
files that `tf.data.TFRecordDataset(..., compression_type="GZIP")` reads.

May import: nothing else of lealla_tf.
"""

import struct

import google_crc32c
import numpy as np
import tensorflow as tf

PAIR_SOURCE, PAIR_TARGET = "src_raw", "tgt_raw"
PAIR_TEACHER_SOURCE, PAIR_TEACHER_TARGET = "teacher_src", "teacher_tgt"
EMBEDDING_ID, EMBEDDING_VECTOR, EMBEDDING_TEXT = "id", "embedding", "text"


def _bytes_feature(value) -> tf.train.Feature:
    value = value.encode("utf-8") if isinstance(value, str) else value
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def pair_example(source: str, target: str, teacher_source=None, teacher_target=None) -> bytes:
    """A serialized pair record; a teacher vector that is None is left out."""

    def floats(values):
        return tf.train.Feature(float_list=tf.train.FloatList(
            value=np.asarray(values, np.float32).tolist()))

    feature = {PAIR_SOURCE: _bytes_feature(source), PAIR_TARGET: _bytes_feature(target)}
    if teacher_source is not None:
        feature[PAIR_TEACHER_SOURCE] = floats(teacher_source)
    if teacher_target is not None:
        feature[PAIR_TEACHER_TARGET] = floats(teacher_target)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def pair_features(teacher_dimension=None, has_source: bool = True) -> dict:
    """The `tf.io.parse_single_example` spec of pair records: the two sentences,
    and with `teacher_dimension` the teacher's target vector (and, `has_source`,
    its source vector)."""
    features = {PAIR_SOURCE: tf.io.FixedLenFeature([], tf.string),
                PAIR_TARGET: tf.io.FixedLenFeature([], tf.string)}
    if teacher_dimension:
        features[PAIR_TEACHER_TARGET] = tf.io.FixedLenFeature([teacher_dimension], tf.float32)
        if has_source:
            features[PAIR_TEACHER_SOURCE] = tf.io.FixedLenFeature([teacher_dimension],
                                                                  tf.float32)
    return features


def embedding_example(identifier: str, vector: np.ndarray, text: str | None = None) -> bytes:
    """A serialized embedding record: id, float32 vector and (optionally) the sentence."""
    feature = {EMBEDDING_ID: _bytes_feature(identifier),
               EMBEDDING_VECTOR: _bytes_feature(np.asarray(vector, dtype="<f4").tobytes())}
    if text is not None:
        feature[EMBEDDING_TEXT] = _bytes_feature(text)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def embedding_features() -> dict:
    """The `tf.io.parse_example` spec of embedding records (a missing text reads
    as ""); the vector is raw bytes: `np.frombuffer(..., "<f4")`."""
    return {EMBEDDING_ID: tf.io.FixedLenFeature([], tf.string),
            EMBEDDING_VECTOR: tf.io.FixedLenFeature([], tf.string),
            EMBEDDING_TEXT: tf.io.FixedLenFeature([], tf.string, default_value="")}


def _masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecord(handle, record: bytes) -> None:
    """Appends one TFRecord (length, masked CRC32C of length, data, CRC) to `handle`."""
    length = struct.pack("<Q", len(record))
    handle.write(length)
    handle.write(struct.pack("<I", _masked_crc32c(length)))
    handle.write(record)
    handle.write(struct.pack("<I", _masked_crc32c(record)))
