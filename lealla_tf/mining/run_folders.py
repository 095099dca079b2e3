"""A pipeline output's run folders and the manifest that makes reruns safe.

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
removed: a `run-important/` of the user's stays, whatever its name. A run does
all this holding the output's lock (`lealla_tf.folder_lock.one_writer`), which
proves that no live run writes there.

Readers find the files of the last complete run through `manifest_files`.
Other leftovers of killed runs (temporary files and folders named after their
process and host) are removed by `remove_dead_leftovers`.
"""

import contextlib
import datetime
import json
import logging
import os
import re
import shutil
import socket

from lealla_tf.json_files import read_json_or_none

MANIFEST = "MANIFEST.json"
RUNS_RECORD = ".lealla_tf_runs.json"  # the run folders this output's runs made
RUN_FOLDER = r"run-\d{8}T\d{12}Z"  # new_run_directory's names
log = logging.getLogger(__name__)


class DamagedManifestError(ValueError):
    """An output's MANIFEST.json is not a manifest (cut short, or something
    else); `path` is the file."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path} is damaged ({reason}), so its output cannot be read: rerun "
                         f"embed_corpus into {os.path.dirname(path) or '.'} to write it again")
        self.path = path


def read_manifest(output_dir: str) -> dict | None:
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


def manifest_files(output_dir: str, suffix: str = ".tfrecord.gz") -> list[str]:
    """The shard files of the last complete run (FileNotFoundError if none,
    DamagedManifestError if its manifest is damaged)."""
    manifest = read_manifest(output_dir)
    if manifest is None:
        raise FileNotFoundError(f"{output_dir} has no {MANIFEST}: not a finished pipeline output")
    return [os.path.join(output_dir, f) for f in manifest["files"] if f.endswith(suffix)]


def new_run_directory(output_dir: str) -> str:
    """A fresh `run-<timestamp>` folder name inside `output_dir`."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return os.path.join(output_dir, f"run-{stamp}")


@contextlib.contextmanager
def run_directory(output_dir: str):
    """A fresh run folder (its name: see `new_run_directory`), recorded as this
    output's and made, for a run that holds the output's lock. The recorded run
    folders that never committed (killed or refused runs) are removed first,
    and this one is removed when the run raises before it commits; remote
    outputs are neither recorded nor cleaned."""
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


def commit_run(output_dir: str, run_dir: str, files: list[str], **details) -> dict:
    """Points the manifest at `run_dir` (atomically), then deletes the runs
    this output made before: the one the old manifest named and the ones its
    record lists. A folder neither names is not ours and stays. Returns the
    manifest: the run, its `files` (relative to `output_dir`) and `details`."""
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


def remove_abandoned_runs(output_dir: str) -> list[str]:
    """Removes the run folders that the record of `output_dir` lists and its
    manifest does not name: runs of this output that were killed or refused
    before they committed (a folder the record does not list is not ours and
    stays). Call it holding the output's lock, which proves that no live run
    writes there (`run_directory` does). Local outputs only; returns the
    removed paths."""
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


def _recorded_runs(output_dir: str) -> list[str]:
    """The run folders the record of `output_dir` lists ([] for none, or for an
    unreadable record: a run it no longer knows is left, never guessed at)."""
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


def _record_runs(output_dir: str, runs: list[str]) -> None:
    """Replaces the record of `output_dir` (atomically) with `runs`."""
    path = os.path.join(output_dir, RUNS_RECORD)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump({"runs": sorted(set(runs))}, f)
    os.replace(temporary, path)


def _remove_runs(output_dir: str, names: list[str]) -> list[str]:
    """Removes the run folders `names` of `output_dir` (names that are not run
    folders' and symbolic links are left); returns the removed paths."""
    removed = []
    for name in names:
        path = os.path.join(output_dir, name)
        if re.fullmatch(RUN_FOLDER, name) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def file_in_the_way(path: str) -> str | None:
    """The nearest existing folder above the local `path` when it is no folder
    (a file a run could not write below), else None; None for remote paths."""
    if "://" in path:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return None if os.path.isdir(parent) else parent


# === Leftovers of killed runs ===

def host_tag() -> str:
    """This host's name as it goes into the names of temporary files and folders."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"


def remove_dead_leftovers(directory: str, pattern: str) -> list[str]:
    """Removes the leftovers of killed runs from the local folder `directory`:
    the entries whose whole name matches `pattern` and whose run is over.

    The pattern's group `pid` is the process that made the entry; its group
    `host`, where it has one, that process's `host_tag()`. An entry is removed
    only when that process is gone from this host: an entry of another host
    (a shared disk: its pid means nothing here), of a live process, or of this
    process (one of its threads may be using it) is left alone; a name without
    a host (earlier versions) is taken as this host's. Returns the removed paths.
    """
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
