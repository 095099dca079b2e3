"""lealla_tf.records: the pair and embedding records, written in TFRecord framing
that tf.data reads back (gzip'd, as the pipelines write them)."""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.records import (
    EMBEDDING_ID,
    EMBEDDING_TEXT,
    EMBEDDING_VECTOR,
    PAIR_SOURCE,
    PAIR_TARGET,
    PAIR_TEACHER_SOURCE,
    PAIR_TEACHER_TARGET,
    embedding_example,
    embedding_features,
    pair_example,
    pair_features,
    write_tfrecord,
)


def write_records(path, records):
    with gzip.open(path, "wb") as handle:
        for record in records:
            write_tfrecord(handle, record)


def read_records(path):
    return list(tf.data.TFRecordDataset([str(path)], compression_type="GZIP").as_numpy_iterator())


def test_tfrecord_framing_is_what_tf_data_reads(tmp_path):
    """Lengths and masked CRC32Cs as TensorFlow's own writer frames them: tf.data
    reads every record back, and a flipped byte is a DataLossError, not data."""
    records = [b"", b"x", bytes(range(256)) * 40]
    write_records(tmp_path / "a.tfrecord.gz", records)
    assert read_records(tmp_path / "a.tfrecord.gz") == records
    with tf.io.TFRecordWriter(str(tmp_path / "b.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    with open(tmp_path / "c.tfrecord", "wb") as handle:
        for record in records:
            write_tfrecord(handle, record)
    assert (tmp_path / "c.tfrecord").read_bytes() == (tmp_path / "b.tfrecord").read_bytes()
    damaged = bytearray((tmp_path / "c.tfrecord").read_bytes())
    damaged[20] ^= 0xFF
    (tmp_path / "d.tfrecord").write_bytes(bytes(damaged))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset([str(tmp_path / "d.tfrecord")]))


@pytest.mark.parametrize("has_source", [True, False])
def test_pair_records_parse_with_their_spec(tmp_path, has_source):
    source_vector, target_vector = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    record = pair_example("Der Hund.", "The dog.", source_vector if has_source else None,
                          target_vector)
    parsed = tf.io.parse_single_example(record, pair_features(3, has_source))
    assert parsed[PAIR_SOURCE].numpy().decode() == "Der Hund."
    assert parsed[PAIR_TARGET].numpy().decode() == "The dog."
    np.testing.assert_array_equal(parsed[PAIR_TEACHER_TARGET].numpy(), target_vector)
    assert (PAIR_TEACHER_SOURCE in parsed) == has_source
    if has_source:
        np.testing.assert_array_equal(parsed[PAIR_TEACHER_SOURCE].numpy(), source_vector)
    # Without a teacher dimension the spec reads the sentences alone.
    assert set(pair_features()) == {PAIR_SOURCE, PAIR_TARGET}
    plain = tf.io.parse_single_example(pair_example("a", "b"), pair_features())
    assert plain[PAIR_TARGET].numpy() == b"b"


def test_embedding_records_keep_id_vector_and_text(tmp_path):
    vectors = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    write_records(tmp_path / "e.tfrecord.gz", [
        embedding_example("doc:1", vectors[0], text="Straße"),
        embedding_example("doc:2", vectors[1]),
        embedding_example("doc:3", vectors[2].astype(np.float64), text="")])
    parsed = tf.io.parse_example(read_records(tmp_path / "e.tfrecord.gz"), embedding_features())
    assert [i.decode() for i in parsed[EMBEDDING_ID].numpy()] == ["doc:1", "doc:2", "doc:3"]
    assert [t.decode() for t in parsed[EMBEDDING_TEXT].numpy()] == ["Straße", "", ""]
    read = np.frombuffer(b"".join(parsed[EMBEDDING_VECTOR].numpy()), "<f4").reshape(3, 5)
    np.testing.assert_array_equal(read, vectors)  # float32, little-endian, whatever was passed
