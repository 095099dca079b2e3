"""Embedding shards and pair shards on disk, and the manifest that makes reruns safe.

A pipeline output directory looks like

    output/
      MANIFEST.json          the last COMPLETE run: its files and counts
      run-<timestamp>/       shards of that run (TFRecord, gzip)

A run writes into a fresh `run-*` folder and only then replaces the manifest
(atomically) and removes older runs, so rerunning into the same path never
mixes shards of two runs and a failed run leaves the previous result intact.

The two record schemas live here and nowhere else:

- embedding records: `tf.train.Example` with `id` (bytes), `embedding` (float32
  little-endian bytes) and optionally `text`;
- pair records (training pairs): `src_raw`, `tgt_raw` (bytes) and the teacher
  vectors `teacher_src` (x^t, absent for an English-only teacher) and
  `teacher_tgt` (y^t) as float lists.
"""

import contextlib
import datetime
import json
import os
import struct
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from lealla_tf.json_files import read_json_or_none

try:
    import fcntl
except ImportError:  # not POSIX: no flock, so stale-lock takeovers go unguarded
    fcntl = None

MANIFEST = "MANIFEST.json"

# The pair-record schema (training pairs with precomputed teacher vectors).
PAIR_SOURCE, PAIR_TARGET = "src_raw", "tgt_raw"
PAIR_TEACHER_SOURCE, PAIR_TEACHER_TARGET = "teacher_src", "teacher_tgt"


def pair_example(source: str, target: str, teacher_source=None, teacher_target=None) -> bytes:
    """A serialized pair record (see the module docstring)."""
    import tensorflow as tf

    def text(value):
        value = value.encode("utf-8") if isinstance(value, str) else value
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def floats(values):
        return tf.train.Feature(float_list=tf.train.FloatList(
            value=np.asarray(values, np.float32).tolist()))

    feature = {PAIR_SOURCE: text(source), PAIR_TARGET: text(target)}
    if teacher_source is not None:
        feature[PAIR_TEACHER_SOURCE] = floats(teacher_source)
    if teacher_target is not None:
        feature[PAIR_TEACHER_TARGET] = floats(teacher_target)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def pair_features(teacher_dimension=None, has_source: bool = True) -> dict:
    """The `tf.io.parse_single_example` spec of pair records."""
    import tensorflow as tf

    features = {PAIR_SOURCE: tf.io.FixedLenFeature([], tf.string),
                PAIR_TARGET: tf.io.FixedLenFeature([], tf.string)}
    if teacher_dimension:
        features[PAIR_TEACHER_TARGET] = tf.io.FixedLenFeature([teacher_dimension], tf.float32)
        if has_source:
            features[PAIR_TEACHER_SOURCE] = tf.io.FixedLenFeature([teacher_dimension],
                                                                  tf.float32)
    return features


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


def write_atomically(path: str, write) -> None:
    """Writes the file `path` through `write(handle)` under a temporary name in
    the same folder, then renames it into place.

    Any Beam filesystem (local, gs://, ...). A reader never sees a partial file,
    and a task that is retried (a worker killed mid-write) replaces the file,
    never adds a second or a partial one; a failed write leaves the previous
    file, if any, untouched (its temporary file may stay behind).
    """
    import uuid

    from apache_beam.io.filesystems import FileSystems

    temporary = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with FileSystems.create(temporary) as handle:
        write(handle)
    FileSystems.rename([temporary], [path])


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
    return read_json_or_none(os.path.join(output_dir, MANIFEST))


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


class OutputLockedError(RuntimeError):
    """Another live run is writing into the same output directory."""


LOCK_FILE = ".lock"
# A lock file with no readable pid belongs to a writer caught between creating
# it and writing the pid (only on filesystems without hard links, or by older
# versions of this module): held while younger than this, stale after.
UNREADABLE_LOCK_SECONDS = 30.0
GUARD_TIMEOUT_SECONDS = 10.0
# Tokens of the locks this process holds or is taking, so that its own threads
# (one pid) exclude each other as processes do.
_HELD_TOKENS = set()


@contextlib.contextmanager
def output_lock(output_dir: str):
    """Holds `output_dir/.lock` while a run writes there.

    Two runs into one output would each delete the other's run folder when
    they commit; the second is refused instead (OutputLockedError, naming the
    holder's pid). The lock is complete the moment it exists: "<pid> <token>"
    is written to a temporary file in the same folder, which is then
    hard-linked to `.lock`; the link fails if `.lock` exists, so exactly one
    run wins and no reader ever sees a lock without its holder. A lock whose
    pid is gone (a killed run) is taken over: the check and the removal happen
    under an exclusive `flock` of the folder (released by the kernel if the
    taker dies), so two runs that find the same stale lock cannot both take
    it, and a live holder's lock is never removed. A lock with no readable
    pid is held for `UNREADABLE_LOCK_SECONDS`, then stale. Threads of one
    process exclude each other too.

    Local paths only: remote outputs (gs://, any `scheme://`) have no atomic
    create and are NOT locked, so two runs must not share a remote --output.
    """
    if "://" in output_dir:
        yield
        return
    import uuid

    path = os.path.join(output_dir, LOCK_FILE)
    token = uuid.uuid4().hex
    temporary = os.path.join(output_dir, f"{LOCK_FILE}.{os.getpid()}-{token[:12]}.tmp")
    content = f"{os.getpid()} {token}\n".encode()
    _HELD_TOKENS.add(token)  # before the lock exists: a sibling thread reads it as held
    try:
        with open(temporary, "wb") as f:
            f.write(content)
        try:
            _take_lock(output_dir, path, temporary, content)
        finally:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
    except BaseException:
        _HELD_TOKENS.discard(token)
        raise
    try:
        yield
    finally:
        try:
            if _read_lock(path)[1] == token:  # still ours (a live lock is never taken)
                os.unlink(path)
        except (OSError, ValueError):
            pass
        _HELD_TOKENS.discard(token)


def _take_lock(output_dir: str, path: str, temporary: str, content: bytes) -> None:
    """Places the lock, taking over a stale one; OutputLockedError if it is held."""
    for _ in range(5):
        if _create_lock(temporary, path, content):
            return
        with _folder_guard(output_dir):
            # Under the guard no other taker acts, and nobody can create `.lock`
            # while it exists, so the lock read here is the lock removed here.
            holder, held = _lock_holder(path)
            if held:
                raise OutputLockedError(
                    f"{output_dir} is being written by another run "
                    f"({f'pid {holder}' if holder else f'its {LOCK_FILE} has no pid yet'}); "
                    "wait for it to finish or pass another --output")
            try:
                os.unlink(path)  # stale: its run was killed
            except FileNotFoundError:
                pass
            if _create_lock(temporary, path, content):
                return
    raise OutputLockedError(f"could not lock {output_dir}: its {LOCK_FILE} keeps changing; "
                            "is another run starting there?")


def _create_lock(temporary: str, path: str, content: bytes) -> bool:
    """Places the complete lock file at `path` atomically; False if one exists."""
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a filesystem without hard links: exclusive create, then write
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(descriptor, content)
        finally:
            os.close(descriptor)
        return True


def _read_lock(path: str) -> Tuple[int, Optional[str]]:
    """(pid, token or None) of a lock file; ValueError when it holds no pid."""
    with open(path, "rb") as f:
        fields = f.read(256).decode("ascii", "replace").split()
    if not fields:
        raise ValueError(f"{path} is empty")
    return int(fields[0]), (fields[1] if len(fields) > 1 else None)


def _lock_holder(path: str) -> Tuple[int, bool]:
    """(the holder's pid or 0, whether the lock at `path` is held by a live run)."""
    import time

    try:
        pid, token = _read_lock(path)
    except FileNotFoundError:
        return 0, False
    except (OSError, ValueError):
        try:
            age = time.time() - os.stat(path).st_mtime
        except FileNotFoundError:
            return 0, False
        return 0, age < UNREADABLE_LOCK_SECONDS
    if pid <= 0:
        return 0, False
    if pid == os.getpid():  # this process: held while one of its locks has the token
        return pid, token in _HELD_TOKENS
    return pid, _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _try_flock(descriptor: int) -> str:
    """"locked", "busy" or "unsupported" (the filesystem cannot flock it)."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return "locked"
    except BlockingIOError:
        return "busy"
    except OSError:
        return "unsupported"


@contextlib.contextmanager
def _folder_guard(output_dir: str):
    """An exclusive `flock` of `output_dir` (of `.lock.guard` in it where the
    filesystem cannot lock a folder, e.g. NFS) that serialises takeovers of a
    stale lock. The kernel drops it when its holder dies, so it is never stale."""
    import time

    if fcntl is None:  # no flock on this platform: unguarded
        yield
        return
    openers = (lambda: os.open(output_dir, os.O_RDONLY),
               lambda: os.open(os.path.join(output_dir, f"{LOCK_FILE}.guard"),
                               os.O_RDWR | os.O_CREAT, 0o644))
    descriptor, state = None, "unsupported"
    for opener in openers:
        descriptor = opener()
        state = _try_flock(descriptor)
        if state != "unsupported":
            break
        os.close(descriptor)
        descriptor = None
    try:
        deadline = time.monotonic() + GUARD_TIMEOUT_SECONDS
        while state == "busy":
            if time.monotonic() > deadline:
                raise OutputLockedError(
                    f"could not lock {output_dir}: another run has been taking over its "
                    f"{LOCK_FILE} for {GUARD_TIMEOUT_SECONDS:g} s")
            time.sleep(0.01)
            state = _try_flock(descriptor)
        yield  # "locked", or "unsupported" everywhere: unguarded
    finally:
        if descriptor is not None:
            os.close(descriptor)  # releases the flock


# === Memory-mappable copies of embedding shards (mining beyond memory) ===

MAPPED_SUFFIX = ".mmap"
_VECTORS, _META = "vectors.f32", "meta.json"


class StringColumn:
    """Strings kept as one UTF-8 blob and their int64 end offsets; `lookup` reads
    only the strings asked for (positioned reads), never the whole column."""

    def __init__(self, directory: str, name: str):
        self._data, self._ends = (os.path.join(directory, f"{name}.{suffix}")
                                  for suffix in ("bin", "ends"))

    def lookup(self, indices) -> List[str]:
        with open(self._data, "rb") as data, open(self._ends, "rb") as ends:
            strings = []
            for i in np.asarray(indices, np.int64).tolist():
                start, end = (struct.unpack("<2q", os.pread(ends.fileno(), 16, 8 * (i - 1)))
                              if i else (0, struct.unpack("<q", os.pread(ends.fileno(), 8, 0))[0]))
                strings.append(os.pread(data.fileno(), end - start, start).decode("utf-8"))
            return strings


class MappedShard(NamedTuple):
    vectors: Tuple[str, int, int]  # (path, rows, dim) of raw little-endian float32
    ids: StringColumn
    texts: StringColumn


class MappedEmbeddings:
    """An embed_corpus output as memory-mappable shards: `parts` go to
    `mining.Rows`; `ids` / `texts` look up strings by global row number."""

    def __init__(self, shards: List[MappedShard]):
        self.shards = shards
        self.parts = [shard.vectors for shard in shards]
        self._starts = np.cumsum([0] + [rows for _, rows, _ in self.parts])
        self.rows = int(self._starts[-1])
        dims = {dim for _, rows, dim in self.parts if rows}
        self.dim = dims.pop() if len(dims) == 1 else (0 if not dims else None)

    def _lookup(self, column: str, indices) -> List[str]:
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

    def ids(self, indices) -> List[str]:
        return self._lookup("ids", indices)

    def texts(self, indices) -> List[str]:
        return self._lookup("texts", indices)


def mmap_embeddings(output_dir: str, cache_dir: Optional[str] = None,
                    batch_size: int = 4096) -> MappedEmbeddings:
    """The embedding shards of an `embed_corpus` output as memory-mappable files.

    Gzip'd TFRecords cannot be mapped, so each shard is converted once, streaming
    `batch_size` records at a time, into a folder `<shard>.mmap/` beside it
    (vectors.f32: raw float32 rows; ids / texts: UTF-8 blobs with end offsets).
    A committed run folder never changes and is deleted with its run, so the copy
    stays valid and goes with it. `cache_dir` puts the copies elsewhere (needed
    for remote outputs, gs://...). Shards keep their record order.
    """
    files = [f for f in manifest_files(output_dir) if os.path.basename(f).startswith(
        "embeddings")]
    if cache_dir is None and "://" in output_dir:
        raise ValueError(f"{output_dir} is remote: pass a local cache_dir (--cache_dir) for "
                         "the memory-mapped copies of its shards")
    shards = []
    for path in files:
        if cache_dir is None:
            folder = path + MAPPED_SUFFIX
        else:
            import hashlib

            digest = hashlib.sha1(path.encode("utf-8")).hexdigest()[:16]
            folder = os.path.join(cache_dir, f"{digest}-{os.path.basename(path)}{MAPPED_SUFFIX}")
        meta = read_json_or_none(os.path.join(folder, _META))
        if meta is None or meta.get("stamp") != _stamp(path):
            _map_shard(path, folder, batch_size)
            meta = read_json_or_none(os.path.join(folder, _META))
        shards.append(MappedShard((os.path.join(folder, _VECTORS), meta["rows"], meta["dim"]),
                                  StringColumn(folder, "ids"), StringColumn(folder, "texts")))
    return MappedEmbeddings(shards)


def _stamp(path: str) -> List[int]:
    """Size and modification time of a shard: a copy made of another file is redone."""
    if "://" in path:
        import tensorflow as tf

        stat = tf.io.gfile.stat(path)
        return [int(stat.length), int(stat.mtime_nsec)]
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns]


def _map_shard(path: str, folder: str, batch_size: int) -> None:
    """Streams one embedding shard into `folder` (written aside, then renamed in)."""
    import shutil

    temporary = f"{folder}.tmp-{os.getpid()}"
    os.makedirs(temporary, exist_ok=True)
    try:
        stamp = _stamp(path)
        rows, dim = _write_mapped(path, temporary, batch_size)
        with open(os.path.join(temporary, _META), "w") as f:
            json.dump({"rows": rows, "dim": dim, "shard": os.path.basename(path),
                       "stamp": stamp}, f)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)  # a stale copy
    try:
        os.rename(temporary, folder)
    except OSError:  # another process mapped it first
        shutil.rmtree(temporary, ignore_errors=True)


def _write_mapped(path: str, folder: str, batch_size: int) -> Tuple[int, int]:
    """Writes the vectors, ids and texts of shard `path` into `folder`: (rows, dim)."""
    import tensorflow as tf

    features = {"id": tf.io.FixedLenFeature([], tf.string),
                "embedding": tf.io.FixedLenFeature([], tf.string),
                "text": tf.io.FixedLenFeature([], tf.string, default_value="")}
    dataset = tf.data.TFRecordDataset([path], compression_type="GZIP").batch(batch_size).map(
        lambda r: tf.io.parse_example(r, features))
    rows, dim, ends = 0, 0, {"id": 0, "text": 0}
    names = {"vectors": _VECTORS, "id": "ids", "text": "texts"}
    with contextlib.ExitStack() as stack:
        files = {name: stack.enter_context(open(os.path.join(folder, name), "wb"))
                 for name in (_VECTORS, "ids.bin", "ids.ends", "texts.bin", "texts.ends")}
        try:
            for batch in dataset:
                vectors = b"".join(batch["embedding"].numpy())
                count = len(batch["id"])
                dim = dim or len(vectors) // (4 * count)
                if len(vectors) != 4 * dim * count:
                    raise ValueError(f"{path} holds embeddings of different dimensions")
                files[names["vectors"]].write(vectors)
                for column in ("id", "text"):
                    values = batch[column].numpy()
                    lengths = np.cumsum([len(v) for v in values], dtype=np.int64) + ends[column]
                    files[f"{names[column]}.bin"].write(b"".join(values))
                    files[f"{names[column]}.ends"].write(lengths.astype("<i8").tobytes())
                    ends[column] = int(lengths[-1])
                rows += count
        except tf.errors.OpError as error:
            raise ValueError(f"{path} is unreadable ({type(error).__name__}); rerun "
                             "embed_corpus into its output") from None
    return rows, dim
