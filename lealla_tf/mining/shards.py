"""Reading the embedding shards of an `embed_corpus` output: whole, into memory
(`read_embeddings`), or as memory-mapped copies (`mmap_embeddings`) for mining
beyond memory. Only the files of the output's last complete run are read (its
MANIFEST.json, `lealla_tf.mining.run_folders`); the records are
`lealla_tf.records`' embedding records.
"""

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import struct
from typing import NamedTuple

import google_crc32c
import numpy as np
import tensorflow as tf

from lealla_tf.mining.run_folders import (
    MANIFEST,
    host_tag,
    manifest_files,
    remove_dead_leftovers,
)
from lealla_tf.records import EMBEDDING_ID, EMBEDDING_TEXT, EMBEDDING_VECTOR, embedding_features

log = logging.getLogger(__name__)


def _embedding_files(output_dir: str) -> list[str]:
    return [f for f in manifest_files(output_dir) if os.path.basename(f).startswith(
        "embeddings")]


def _parsed_batches(files: list[str], batch_size: int):
    """The embedding records of `files`, parsed `batch_size` at a time, in file order."""
    features = embedding_features()
    return tf.data.TFRecordDataset(files, compression_type="GZIP").batch(batch_size).map(
        lambda r: tf.io.parse_example(r, features))


def read_embeddings(output_dir: str, with_text: bool = False):
    """(ids, float32 `[n, d]`[, texts]) of an `embed_corpus` output, in natural id order."""
    files = _embedding_files(output_dir)
    if not files:
        raise FileNotFoundError(f"no embedding shards listed in {output_dir}/{MANIFEST}")
    ids, vectors, texts = [], [], []
    for batch in _parsed_batches(files, 4096):
        ids += [i.decode("utf-8") for i in batch[EMBEDDING_ID].numpy()]
        texts += [t.decode("utf-8") for t in batch[EMBEDDING_TEXT].numpy()]
        vectors.append(np.frombuffer(b"".join(batch[EMBEDDING_VECTOR].numpy()), dtype="<f4"))
    if not ids:
        empty = ([], np.zeros((0, 0), np.float32))
        return empty + ([],) if with_text else empty
    matrix = np.concatenate(vectors).reshape(len(ids), -1).astype(np.float32)
    order = sorted(range(len(ids)), key=lambda i: natural_key(ids[i]))
    result = ([ids[i] for i in order], matrix[order])
    return result + ([texts[i] for i in order],) if with_text else result


def natural_key(identifier: str):
    """Sort key that orders "doc:2" before "doc:10"."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", identifier)]


# === Memory-mappable copies of embedding shards (mining beyond memory) ===

MAPPED_SUFFIX = ".mmap"
_VECTORS, _META = "vectors.f32", "meta.json"
_COLUMN_FILES = (_VECTORS, "ids.bin", "ids.ends", "texts.bin", "texts.ends")
_MAPPED_FORMAT = 2  # meta.json records each file's size and CRC32C
# A copy's files as validated by this process ({folder: their size, mtime, ctime and
# inode}): their checksums are read again only when one of them changed.
_VALIDATED = {}


class StringColumn:
    """Strings kept as one UTF-8 blob and their int64 end offsets; `lookup` reads
    only the strings asked for (positioned reads), never the whole column."""

    def __init__(self, directory: str, name: str):
        self._data, self._ends = (os.path.join(directory, f"{name}.{suffix}")
                                  for suffix in ("bin", "ends"))

    def lookup(self, indices) -> list[str]:
        with open(self._data, "rb") as data, open(self._ends, "rb") as ends:
            strings = []
            for i in np.asarray(indices, np.int64).tolist():
                offsets = os.pread(ends.fileno(), 16 if i else 8, 8 * (i - 1) if i else 0)
                if len(offsets) != (16 if i else 8):
                    raise ValueError(f"{self._ends} is truncated (no end offset for row {i}): "
                                     "delete its folder and rerun to rebuild the copy")
                start, end = struct.unpack("<2q", offsets) if i else (0, *struct.unpack(
                    "<q", offsets))
                text = os.pread(data.fileno(), max(0, end - start), start)
                if start < 0 or len(text) != end - start:
                    raise ValueError(f"{self._data} is truncated or {self._ends} corrupt (row "
                                     f"{i}): delete its folder and rerun to rebuild the copy")
                strings.append(text.decode("utf-8"))
            return strings


class MappedShard(NamedTuple):
    vectors: tuple[str, int, int]  # (path, rows, dim) of raw little-endian float32
    ids: StringColumn
    texts: StringColumn


class MappedEmbeddings:
    """An embed_corpus output as memory-mappable shards: `parts` go to
    `lealla_tf.mining.neighbours.Rows`; `ids` / `texts` look up strings by
    global row number."""

    def __init__(self, shards: list[MappedShard]):
        self.shards = shards
        self.parts = [shard.vectors for shard in shards]
        self._starts = np.cumsum([0] + [rows for _, rows, _ in self.parts])
        self.rows = int(self._starts[-1])
        dims = {dim for _, rows, dim in self.parts if rows}
        self.dim = dims.pop() if len(dims) == 1 else (0 if not dims else None)

    def _lookup(self, column: str, indices) -> list[str]:
        indices = np.asarray(indices, np.int64)
        shard = np.searchsorted(self._starts, indices, side="right") - 1
        out = [None] * len(indices)
        for number in np.unique(shard).tolist():
            where = np.flatnonzero(shard == number)
            strings = getattr(self.shards[number], column).lookup(
                indices[where] - self._starts[number])
            for position, string in zip(where.tolist(), strings):
                out[position] = string
        return out

    def ids(self, indices) -> list[str]:
        return self._lookup("ids", indices)

    def texts(self, indices) -> list[str]:
        return self._lookup("texts", indices)


def mmap_embeddings(output_dir: str, cache_dir: str | None = None,
                    batch_size: int = 4096) -> MappedEmbeddings:
    """The embedding shards of an `embed_corpus` output as memory-mappable files.

    Gzip'd TFRecords cannot be mapped, so each shard is converted once, streaming
    `batch_size` records at a time, into a folder `<shard>.mmap/` beside it
    (vectors.f32: raw float32 rows; ids / texts: UTF-8 blobs with end offsets).
    A committed run folder never changes and is deleted with its run, so the copy
    stays valid and goes with it. `cache_dir` puts the copies elsewhere (needed
    for remote outputs, gs://...). Shards keep their record order.

    A copy is used only while it matches: its meta.json names the shard's size
    and modification time and each file's size and CRC32C, checked before use
    (the CRCs once per process while the files stay unchanged). A copy that
    does not match (a changed shard, a truncated or overwritten file, one made
    by an older version) is rebuilt, with a warning. The half-made copies of
    killed conversions (`<copy>.tmp-<pid>-<host>`) are removed.
    """
    if cache_dir is None and "://" in output_dir:
        raise ValueError(f"{output_dir} is remote: pass a local cache_dir (--cache_dir) for "
                         "the memory-mapped copies of its shards")
    files = _embedding_files(output_dir)
    shards = []
    for path in files:
        if cache_dir is None:
            folder = path + MAPPED_SUFFIX
        else:
            digest = hashlib.sha1(path.encode("utf-8")).hexdigest()[:16]
            folder = os.path.join(cache_dir, f"{digest}-{os.path.basename(path)}{MAPPED_SUFFIX}")
        remove_dead_leftovers(os.path.dirname(folder), re.escape(os.path.basename(folder))
                              + r"\.tmp-(?P<pid>\d+)(?:-(?P<host>[A-Za-z0-9_]+))?")
        meta, problem = _mapped_copy(path, folder)
        if problem is not None:
            if problem != "there is none":
                log.warning("the memory-mapped copy %s does not match its shard (%s): "
                            "rebuilding it", folder, problem)
            _map_shard(path, folder, batch_size)
            meta, problem = _mapped_copy(path, folder)
            if problem is not None:
                raise ValueError(f"the memory-mapped copy {folder} of {path} does not match "
                                 f"it right after it was made ({problem}); is another run "
                                 "rewriting it?")
        shards.append(MappedShard((os.path.join(folder, _VECTORS), meta["rows"], meta["dim"]),
                                  StringColumn(folder, "ids"), StringColumn(folder, "texts")))
    return MappedEmbeddings(shards)


def _mapped_copy(path: str, folder: str) -> tuple[dict | None, str | None]:
    """(meta, None) when the copy in `folder` matches shard `path`, else (None, why not)."""
    try:
        with open(os.path.join(folder, _META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None, "there is none"
    except (OSError, ValueError):
        return None, f"its {_META} is unreadable"
    try:
        rows, dim, recorded = int(meta["rows"]), int(meta["dim"]), meta["files"]
        if meta.get("format") != _MAPPED_FORMAT:
            raise KeyError("format")
        expected = {name: [int(size), int(crc)] for name, (size, crc) in recorded.items()}
        if set(expected) != set(_COLUMN_FILES):
            raise KeyError("files")
    except (KeyError, TypeError, ValueError):
        return None, f"its {_META} is from an older version or damaged"
    if meta.get("stamp") != _stamp(path):
        return None, "the shard changed since it was made"
    sizes = {_VECTORS: 4 * rows * dim, "ids.ends": 8 * rows, "texts.ends": 8 * rows}
    signature = []
    for name in _COLUMN_FILES:
        try:
            stat = os.stat(os.path.join(folder, name))
        except FileNotFoundError:
            return None, f"{name} is missing"
        if stat.st_size != expected[name][0] or stat.st_size != sizes.get(name, stat.st_size):
            return None, f"{name} holds {stat.st_size} bytes, not {expected[name][0]}"
        # ctime: any write or utime moves it, so an overwrite is never taken as checked
        signature.append((stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino))
    if _VALIDATED.get(folder) != signature:
        for name in _COLUMN_FILES:
            if _file_crc32c(os.path.join(folder, name)) != expected[name][1]:
                return None, f"{name} does not match its checksum"
        _VALIDATED[folder] = signature
    return meta, None


def _file_crc32c(path: str, block: int = 16 * 2 ** 20) -> int:
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            crc = google_crc32c.extend(crc, chunk)
    return crc


def _stamp(path: str) -> list[int]:
    """Size and modification time of a shard: a copy made of another file is redone."""
    if "://" in path:
        stat = tf.io.gfile.stat(path)
        return [int(stat.length), int(stat.mtime_nsec)]
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns]


def _map_shard(path: str, folder: str, batch_size: int) -> None:
    """Streams one embedding shard into `folder` (written aside, then renamed in)."""
    temporary = f"{folder}.tmp-{os.getpid()}-{host_tag()}"
    try:
        os.makedirs(temporary, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cannot write the memory-mapped copy of {path} at {folder} "
                         f"({error.strerror}): pass a writable --cache_dir") from None
    try:
        stamp = _stamp(path)
        rows, dim, files = _write_mapped(path, temporary, batch_size)
        with open(os.path.join(temporary, _META), "w") as f:
            json.dump({"rows": rows, "dim": dim, "shard": os.path.basename(path),
                       "stamp": stamp, "format": _MAPPED_FORMAT, "files": files}, f)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)  # a stale or damaged copy
    try:
        os.rename(temporary, folder)
    except OSError:  # another process mapped it first
        shutil.rmtree(temporary, ignore_errors=True)


class _ChecksummedFile:
    """A file written through `write`, keeping its size and CRC32C."""

    def __init__(self, handle):
        self._handle, self.size, self.crc = handle, 0, 0

    def write(self, data: bytes) -> None:
        self._handle.write(data)
        self.size += len(data)
        self.crc = google_crc32c.extend(self.crc, data)


def _write_mapped(path: str, folder: str, batch_size: int) -> tuple[int, int, dict]:
    """Writes the vectors, ids and texts of shard `path` into `folder`: (rows, dim,
    {file name: [size, CRC32C]})."""
    rows, dim, ends = 0, 0, {EMBEDDING_ID: 0, EMBEDDING_TEXT: 0}
    names = {"vectors": _VECTORS, EMBEDDING_ID: "ids", EMBEDDING_TEXT: "texts"}
    with contextlib.ExitStack() as stack:
        files = {name: _ChecksummedFile(stack.enter_context(open(os.path.join(folder, name),
                                                                  "wb")))
                 for name in _COLUMN_FILES}
        try:
            for batch in _parsed_batches([path], batch_size):
                vectors = b"".join(batch[EMBEDDING_VECTOR].numpy())
                count = len(batch[EMBEDDING_ID])
                dim = dim or len(vectors) // (4 * count)
                if len(vectors) != 4 * dim * count:
                    raise ValueError(f"{path} holds embeddings of different dimensions")
                files[names["vectors"]].write(vectors)
                for column in (EMBEDDING_ID, EMBEDDING_TEXT):
                    values = batch[column].numpy()
                    lengths = np.cumsum([len(v) for v in values], dtype=np.int64) + ends[column]
                    files[f"{names[column]}.bin"].write(b"".join(values))
                    files[f"{names[column]}.ends"].write(lengths.astype("<i8").tobytes())
                    ends[column] = int(lengths[-1])
                rows += count
        except tf.errors.OpError as error:
            raise ValueError(f"{path} is unreadable ({type(error).__name__}); rerun "
                             "embed_corpus into its output") from None
    return rows, dim, {name: [file.size, file.crc] for name, file in files.items()}
