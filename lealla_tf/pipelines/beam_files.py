"""Files the pipelines write through Beam's filesystems (local, gs://, any
other): each written whole or not at all (`write_atomically`), and the gzip'd
TFRecord shards of `lealla_tf.records`' records (`write_gzip_tfrecords`)."""

import gzip
import os
import uuid

from apache_beam.io.filesystems import FileSystems

from lealla_tf.records import write_tfrecord


def write_atomically(path: str, write) -> None:
    """Writes the file `path` through `write(handle)` under a temporary name in
    the same folder, then renames it into place.

    A reader never sees a partial file, and a task that is retried (a worker
    killed mid-write) replaces the file, never adds a second or a partial one;
    a failed write leaves the previous file, if any, untouched and removes its
    temporary file `<path>.tmp-<pid>-<8 hex>` (a killed writer's stays behind,
    for the next run to remove).
    """
    temporary = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with FileSystems.create(temporary) as handle:
            write(handle)
        FileSystems.rename([temporary], [path])
    except BaseException:
        try:
            if FileSystems.exists(temporary):
                FileSystems.delete([temporary])
        except Exception:  # the write's own error is the one to report
            pass
        raise


def write_gzip_tfrecords(handle, records) -> None:
    """Writes the serialized `records` into the open binary `handle` as one
    gzip'd TFRecord file (what `tf.data.TFRecordDataset(...,
    compression_type="GZIP")` reads). At gzip's fastest level: float32 vectors
    barely compress, so a higher level costs the writer time and saves almost no
    bytes."""
    with gzip.GzipFile(fileobj=handle, mode="wb", compresslevel=1) as compressed:
        for record in records:
            write_tfrecord(compressed, record)
