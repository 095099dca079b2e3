"""lealla_tf.pipelines.beam_files: a file is written whole or not at all, and
TFRecord shards read back with tf.data."""

import os
import pathlib

import pytest
import tensorflow as tf

from lealla_tf.pipelines.beam_files import write_atomically, write_gzip_tfrecords


def test_a_file_is_replaced_whole_and_a_failed_write_leaves_the_old_one(tmp_path):
    path = str(tmp_path / "summary.json")
    write_atomically(path, lambda handle: handle.write(b"first"))
    write_atomically(path, lambda handle: handle.write(b"second"))
    assert pathlib.Path(path).read_bytes() == b"second"

    def fail_halfway(handle):
        handle.write(b"half")
        raise RuntimeError("the worker failed")

    with pytest.raises(RuntimeError, match="the worker failed"):
        write_atomically(path, fail_halfway)
    assert pathlib.Path(path).read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["summary.json"]  # no temporary file left
    with pytest.raises(RuntimeError):
        write_atomically(str(tmp_path / "new.json"), fail_halfway)
    assert os.listdir(tmp_path) == ["summary.json"]


def test_gzip_tfrecords_read_back_in_order(tmp_path):
    path = str(tmp_path / "embeddings-00000-of-00001.tfrecord.gz")
    records = [b"a", b"", b"record three" * 100]
    write_atomically(path, lambda handle: write_gzip_tfrecords(handle, records))
    read = tf.data.TFRecordDataset([path], compression_type="GZIP").as_numpy_iterator()
    assert list(read) == records


def test_gzip_tfrecords_are_written_at_gzip_s_fastest_level(tmp_path):
    """The header's XFL byte says which level wrote it: 4 is gzip's fastest."""
    path = str(tmp_path / "fast.tfrecord.gz")
    write_atomically(path, lambda handle: write_gzip_tfrecords(handle, [b"x" * 1000]))
    assert pathlib.Path(path).read_bytes()[8] == 4
