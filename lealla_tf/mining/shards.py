"""Embedding shards and pair shards on disk, and the manifest that makes reruns safe.

A pipeline output directory looks like

    output/
      MANIFEST.json          the last COMPLETE run: its files and counts
      run-<timestamp>/       shards of that run (TFRecord, gzip)
      .lealla_tf_runs.json   the run folders this output's runs made and
                             have not removed yet (killed runs' among them)

A run records its `run-*` folder, writes into it, and only then replaces the
manifest (atomically) and removes the older runs, so rerunning into the same
path never mixes shards of two runs and a failed run leaves the previous result
intact. Only run folders that the manifest names or the record lists are ever
removed: a `run-important/` of the user's stays, whatever its name.

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
import logging
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
log = logging.getLogger(__name__)

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
    file, if any, untouched and removes its temporary file (a killed writer's
    stays behind, for the next run to remove).
    """
    import uuid

    from apache_beam.io.filesystems import FileSystems

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


@contextlib.contextmanager
def run_directory(output_dir: str):
    """A fresh run folder (its name: see `new_run_directory`), recorded as this
    output's and made, for a run that holds `output_lock(output_dir)`. The
    recorded run folders that never committed (killed or refused runs) are
    removed first, and this one is removed when the run raises before it
    commits; remote outputs are neither recorded nor cleaned."""
    import shutil

    run_dir = new_run_directory(output_dir)
    if "://" not in output_dir:
        remove_abandoned_runs(output_dir)
        _record_runs(output_dir, _recorded_runs(output_dir) + [os.path.basename(run_dir)])
        os.makedirs(run_dir)
    try:
        yield run_dir
    except BaseException:
        if "://" not in run_dir and not _committed(output_dir, run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
            _record_runs(output_dir, [name for name in _recorded_runs(output_dir)
                                      if name != os.path.basename(run_dir)])
        raise


def _committed(output_dir: str, run_dir: str) -> bool:
    """Whether the manifest of `output_dir` names `run_dir` (a commit that
    failed after it replaced the manifest must not lose its run)."""
    try:
        manifest = read_manifest(output_dir)
    except DamagedManifestError:
        return False
    return manifest is not None and manifest["run"] == os.path.basename(run_dir)


def commit_run(output_dir: str, run_dir: str, files: List[str], **details) -> dict:
    """Points the manifest at `run_dir` (atomically), then deletes the runs
    this output made before: the one the old manifest named and the ones its
    record lists. A folder neither names is not ours and stays."""
    try:
        previous = read_manifest(output_dir)
    except DamagedManifestError:  # being repaired now; the record still knows its run
        previous = None
    manifest = {"run": os.path.basename(run_dir),
                "files": sorted(os.path.relpath(f, output_dir) for f in files), **details}
    temporary = os.path.join(output_dir, MANIFEST + ".tmp")
    with open(temporary, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    os.replace(temporary, os.path.join(output_dir, MANIFEST))
    ours = _recorded_runs(output_dir) + ([previous["run"]] if previous else [])
    _remove_runs(output_dir, [name for name in ours if name != manifest["run"]])
    _record_runs(output_dir, [manifest["run"]])
    return manifest


RUNS_RECORD = ".lealla_tf_runs.json"  # the run folders this output's runs made
RUN_FOLDER = r"run-\d{8}T\d{12}Z"  # new_run_directory's names


def _recorded_runs(output_dir: str) -> List[str]:
    """The run folders the record of `output_dir` lists ([] for none, or for an
    unreadable record: a run it no longer knows is left, never guessed at)."""
    import re

    path = os.path.join(output_dir, RUNS_RECORD)
    try:
        with open(path, "rb") as f:
            runs = json.loads(f.read().decode("utf-8"))["runs"]
        return [name for name in runs if isinstance(name, str) and re.fullmatch(RUN_FOLDER, name)]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("%s is unreadable (%s): the run folders it listed are left as they are",
                    path, error)
        return []


def _record_runs(output_dir: str, runs: List[str]) -> None:
    """Replaces the record of `output_dir` (atomically) with `runs`."""
    path = os.path.join(output_dir, RUNS_RECORD)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump({"runs": sorted(set(runs))}, f)
    os.replace(temporary, path)


def _remove_runs(output_dir: str, names: List[str]) -> List[str]:
    """Removes the run folders `names` of `output_dir` (names that are not run
    folders' and symbolic links are left); returns the removed paths."""
    import re
    import shutil

    removed = []
    for name in names:
        path = os.path.join(output_dir, name)
        if re.fullmatch(RUN_FOLDER, name) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class DamagedManifestError(ValueError):
    """An output's MANIFEST.json is not a manifest (cut short, or something
    else); `path` is the file."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path} is damaged ({reason}), so its output cannot be read: rerun "
                         f"embed_corpus into {os.path.dirname(path) or '.'} to write it again")
        self.path = path


def read_manifest(output_dir: str) -> Optional[dict]:
    """The manifest of a pipeline output directory, or None when it has none;
    DamagedManifestError (naming the file) when it is cut short or no manifest."""
    path = os.path.join(output_dir, MANIFEST)
    try:
        manifest = read_json_or_none(path)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise DamagedManifestError(path, f"not JSON: {' '.join(str(error).split())}") from None
    if manifest is None:
        return None
    if not isinstance(manifest, dict):
        raise DamagedManifestError(path, f"a JSON {type(manifest).__name__}, not an object")
    for key in ("run", "files"):
        if key not in manifest:
            raise DamagedManifestError(path, f"no {key!r}")
    if not isinstance(manifest["run"], str) or not (
            isinstance(manifest["files"], list)
            and all(isinstance(name, str) for name in manifest["files"])):
        raise DamagedManifestError(path, "its 'run' or 'files' is not a name or list of names")
    return manifest


def manifest_files(output_dir: str, suffix: str = ".tfrecord.gz") -> List[str]:
    """The shard files of the last complete run (FileNotFoundError if none,
    DamagedManifestError if its manifest is damaged)."""
    manifest = read_manifest(output_dir)
    if manifest is None:
        raise FileNotFoundError(f"{output_dir} has no {MANIFEST}: not a finished pipeline output")
    return [os.path.join(output_dir, f) for f in manifest["files"] if f.endswith(suffix)]


def file_in_the_way(path: str) -> Optional[str]:
    """The nearest existing folder above the local `path` when it is no folder
    (a file a run could not write below), else None; None for remote paths."""
    if "://" in path:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return None if os.path.isdir(parent) else parent


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
def output_lock(output_dir: str, lock_name: str = LOCK_FILE, subject: Optional[str] = None):
    """Holds `output_dir/<lock_name>` (default `.lock`) while a run writes there.

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

    A run that writes one file (mine_bitext) locks `<file>.lock` beside it:
    `lock_name` is that name, `subject` what the messages call the output
    (default: `output_dir`).

    Local paths only: remote outputs (gs://, any `scheme://`) have no atomic
    create and are NOT locked, so two runs must not share a remote --output.
    """
    if "://" in output_dir:
        yield
        return
    import uuid

    path = os.path.join(output_dir, lock_name)
    token = uuid.uuid4().hex
    temporary = os.path.join(output_dir, f"{lock_name}.{os.getpid()}-{token[:12]}.tmp")
    content = f"{os.getpid()} {token}\n".encode()
    _HELD_TOKENS.add(token)  # before the lock exists: a sibling thread reads it as held
    try:
        with open(temporary, "wb") as f:
            f.write(content)
        try:
            _take_lock(output_dir, path, temporary, content, subject or output_dir)
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


def _take_lock(output_dir: str, path: str, temporary: str, content: bytes,
               subject: str) -> None:
    """Places the lock, taking over a stale one; OutputLockedError if it is held."""
    for _ in range(5):
        if _create_lock(temporary, path, content):
            return
        with _folder_guard(output_dir):
            # Under the guard no other taker acts, and nobody can create `.lock`
            # while it exists, so the lock read here is the lock removed here.
            holder, held = _lock_holder(path)
            if held:
                name = os.path.basename(path)
                raise OutputLockedError(
                    f"{subject} is being written by another run "
                    f"({f'pid {holder}' if holder else f'its {name} has no pid yet'}); "
                    "wait for it to finish or pass another --output")
            try:
                os.unlink(path)  # stale: its run was killed
            except FileNotFoundError:
                pass
            if _create_lock(temporary, path, content):
                return
    raise OutputLockedError(f"could not lock {subject}: its {os.path.basename(path)} keeps "
                            "changing; is another run starting there?")


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


def host_tag() -> str:
    """This host's name as it goes into the names of temporary files and folders."""
    import re
    import socket

    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"


def remove_dead_leftovers(directory: str, pattern: str) -> List[str]:
    """Removes the leftovers of killed runs from the local folder `directory`:
    the entries whose whole name matches `pattern` and whose run is over.

    The pattern's group `pid` is the process that made the entry; its group
    `host`, where it has one, that process's `host_tag()`. An entry is removed
    only when that process is gone from this host: an entry of another host
    (a shared disk: its pid means nothing here), of a live process, or of this
    process (one of its threads may be using it) is left alone; a name without
    a host (earlier versions) is taken as this host's. Returns the removed paths.
    """
    import re
    import shutil

    try:
        names = os.listdir(directory)
    except OSError:  # no folder yet (nothing left over), or unreadable
        return []
    removed = []
    for name in names:
        match = re.fullmatch(pattern, name)
        if match is None:
            continue
        pid, host = int(match.group("pid")), match.groupdict().get("host")
        if (host is not None and host != host_tag()) or pid == os.getpid() or _alive(pid):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        removed.append(path)
    if removed:
        log.info("removed %d leftover(s) of killed runs in %s: %s", len(removed), directory,
                 ", ".join(os.path.basename(path) for path in removed))
    return removed


def remove_abandoned_runs(output_dir: str) -> List[str]:
    """Removes the run folders that the record of `output_dir` lists and its
    manifest does not name: runs of this output that were killed or refused
    before they committed (a folder the record does not list is not ours and
    stays). Call it holding `output_lock(output_dir)`, which proves that no
    live run writes there (`run_directory` does). Local outputs only; returns
    the removed paths."""
    if "://" in output_dir or not os.path.isdir(output_dir):
        return []
    try:
        manifest = read_manifest(output_dir)
    except DamagedManifestError:  # which run is committed is unknown: remove nothing
        return []
    committed = None if manifest is None else manifest["run"]
    recorded = _recorded_runs(output_dir)
    removed = _remove_runs(output_dir, [name for name in recorded if name != committed])
    if any(name != committed for name in recorded):
        _record_runs(output_dir, [name for name in recorded if name == committed])
    if removed:
        log.info("removed %d run folder(s) that never committed from %s", len(removed),
                 output_dir)
    return removed


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

    def lookup(self, indices) -> List[str]:
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

    A copy is used only while it matches: its meta.json names the shard's size
    and modification time and each file's size and CRC32C, checked before use
    (the CRCs once per process while the files stay unchanged). A copy that
    does not match (a changed shard, a truncated or overwritten file, one made
    by an older version) is rebuilt, with a warning. The half-made copies of
    killed conversions (`<copy>.tmp-<pid>-<host>`) are removed.
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
        import re

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


def _mapped_copy(path: str, folder: str) -> Tuple[Optional[dict], Optional[str]]:
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
    import google_crc32c

    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            crc = google_crc32c.extend(crc, chunk)
    return crc


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
        import google_crc32c

        self._handle.write(data)
        self.size += len(data)
        self.crc = google_crc32c.extend(self.crc, data)


def _write_mapped(path: str, folder: str, batch_size: int) -> Tuple[int, int, dict]:
    """Writes the vectors, ids and texts of shard `path` into `folder`: (rows, dim,
    {file name: [size, CRC32C]})."""
    import tensorflow as tf

    features = {"id": tf.io.FixedLenFeature([], tf.string),
                "embedding": tf.io.FixedLenFeature([], tf.string),
                "text": tf.io.FixedLenFeature([], tf.string, default_value="")}
    dataset = tf.data.TFRecordDataset([path], compression_type="GZIP").batch(batch_size).map(
        lambda r: tf.io.parse_example(r, features))
    rows, dim, ends = 0, 0, {"id": 0, "text": 0}
    names = {"vectors": _VECTORS, "id": "ids", "text": "texts"}
    with contextlib.ExitStack() as stack:
        files = {name: _ChecksummedFile(stack.enter_context(open(os.path.join(folder, name),
                                                                  "wb")))
                 for name in _COLUMN_FILES}
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
    return rows, dim, {name: [file.size, file.crc] for name, file in files.items()}
