"""The main job's --work_dir: whose it is, and its one writer.

`claim_work_dir` makes a new or empty folder the job's (its `JOB_MARKER` records
the folder's own identity), resumes a folder a job made, takes the folder's
one-writer lock (`lealla_tf.folder_lock`), and with --fresh deletes what a job
writes there (`WORK_DIR_ENTRIES`) and nothing else, only where the marker proves
the folder. A folder without a marker that is not empty is never adopted.
"""

import json
import os
import shutil
import uuid

from lealla_tf.folder_lock import LOCK_FILE, check_folder, hold_folder, release_folder
from lealla_tf.recipe.settings import COMPARISON, STUDENT

JOB_MARKER = ".lealla_tf_main_job"
# Everything a main job writes in its --work_dir (besides JOB_MARKER and the
# lock): what --fresh deletes, and all it deletes. The job writes its export
# into export/, a folder a user may keep models of their own in: only its own
# export is listed (a folder named by a nested entry holds nothing else, or
# --fresh is refused naming what else it holds).
WORK_DIR_ENTRIES = ("stages", "teacher", "vocab.model", "vocab.txt", "sample", "news",
                    "pairs_teacher", STUDENT, COMPARISON, "export/lealla_small", "bucc",
                    "report", JOB_MARKER + ".tmp")


def claim_work_dir(work: str, fresh: bool) -> int | None:
    """Makes `work` this job's, and this job its one writer: returns the
    descriptor of its lock (`lealla_tf.folder_lock`), which the job releases
    when it ends; FolderInUseError (naming the pid) while another job writes it.

    A new or empty folder becomes this job's: its `JOB_MARKER` records the
    folder's own identity (real path, device, inode) and a job id. A folder
    with a marker is resumed; so is a copy of a job's folder, its marker
    rewritten for the copy. Any other folder that holds something, a stages/
    included, is refused with or without --fresh: adopted, its marker would
    later let --fresh delete files the user kept there. (The marker came with
    the stages that record their flags: no job's stages/ without one could be
    resumed.) `--fresh` deletes what a job writes (`WORK_DIR_ENTRIES`) and
    nothing else, and only in a folder whose marker records that very folder
    and that holds nothing a job does not write: an empty or copied marker
    proves nothing. A symlink in a stage folder's place is never followed,
    and --fresh never deletes through a symlinked --work_dir. Each refusal is
    one line (ValueError) naming the folder."""
    subject = f"--work_dir={work}"
    if fresh and os.path.islink(work):
        target = os.path.realpath(work)
        raise ValueError(f"{subject} is a symlink (to {target}): --fresh deletes only a real "
                         f"folder; pass --work_dir={target}")
    check_folder(work, subject)
    _check_work_dir(work, fresh)  # before the lock: a folder refused gets no lock file
    descriptor = hold_folder(work, subject)
    try:
        proven = _check_work_dir(work, fresh)  # again, as its one writer
        if fresh:
            for name in WORK_DIR_ENTRIES:
                path = os.path.join(work, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                elif os.path.lexists(path):
                    os.unlink(path)
            for parent in _shared_folders():  # emptied: the check allowed nothing else
                path = os.path.join(work, parent)
                if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
                    os.rmdir(path)
        if fresh or not proven:
            identity = _folder_identity(work)
            identity["job"] = uuid.uuid4().hex
            temporary = os.path.join(work, JOB_MARKER + ".tmp")
            with open(temporary, "w") as f:
                json.dump(identity, f, indent=2)
            os.replace(temporary, os.path.join(work, JOB_MARKER))
    except BaseException:
        release_folder(descriptor)
        raise
    return descriptor


def _shared_folders() -> dict:
    """{folder: the names a job writes in it}, for the nested `WORK_DIR_ENTRIES`."""
    shared = {}
    for entry in WORK_DIR_ENTRIES:
        if "/" in entry:
            parent, name = entry.split("/")
            shared.setdefault(parent, set()).add(name)
    return shared


def _job_paths(work: str, names: set) -> tuple:
    """The paths in `work` that a job writes and that exist (a nested entry's
    folder included), and those it does not write (relative, sorted); the
    marker is neither."""
    shared = _shared_folders()
    top = {entry.split("/")[0] for entry in WORK_DIR_ENTRIES}
    ours, foreign = [], sorted(names - top - {JOB_MARKER})
    for name in sorted(names & top):
        folder = os.path.join(work, name)
        if name in shared and not os.path.islink(folder):
            if not os.path.isdir(folder):  # a job writes a folder there
                foreign.append(name)
                continue
            inside = set(os.listdir(folder))
            ours += [f"{name}/{child}" for child in sorted(inside & shared[name])]
            foreign += [f"{name}/{child}" for child in sorted(inside - shared[name])]
        ours.append(name)
    return ours, sorted(foreign)


def _folder_identity(work: str) -> dict:
    status = os.stat(work)
    return {"folder": os.path.realpath(work), "device": status.st_dev,
            "inode": status.st_ino}


def _check_work_dir(work: str, fresh: bool) -> bool:
    """Whether `work`'s marker proves that a job made this very folder;
    ValueError for a folder this job may not write, or --fresh not delete."""
    subject = f"--work_dir={work}"
    try:
        names = set(os.listdir(work)) - {LOCK_FILE} if os.path.isdir(work) else set()
    except OSError as error:
        raise ValueError(f"{subject} cannot be read: {error.strerror}") from None
    if not names:
        return False
    try:
        ours, foreign = _job_paths(work, names)
    except OSError as error:
        raise ValueError(f"{subject}: {error.filename} cannot be read: "
                         f"{error.strerror}") from None
    links = [path for path in ours if os.path.islink(os.path.join(work, path))]
    if links:
        raise ValueError(f"{subject}: {links[0]} is a symlink (to "
                         f"{os.path.realpath(os.path.join(work, links[0]))}); a job writes "
                         "only folders of its own in its work dir: remove the link, or pass "
                         "another --work_dir")
    marker = os.path.join(work, JOB_MARKER)
    if not os.path.isfile(marker) and "stages" in names:
        raise ValueError(f"{subject} holds stages/ but no {JOB_MARKER}, so no main job made "
                         "it (an older lealla_tf's stages recorded no flags and cannot be "
                         "resumed): a job adopts no folder of unknown files; delete it "
                         "yourself, or pass a new or empty directory")
    if not os.path.isfile(marker):
        raise ValueError(f"{subject} holds files that no main job made (no {JOB_MARKER}); "
                         "pass a new or empty directory"
                         + (": --fresh deletes only a job's own work dir" if fresh else ""))
    try:
        with open(marker) as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        recorded = None
    here = _folder_identity(work)
    # The same inode on the same device (a moved folder stays proven), or at
    # the same path (a device number can change across restarts).
    proven = (isinstance(recorded, dict) and recorded.get("inode") == here["inode"]
              and (recorded.get("device") == here["device"]
                   or recorded.get("folder") == here["folder"]))
    if not fresh:
        return proven
    if not proven:
        reason = (f"its {JOB_MARKER} is empty or not a marker (an older lealla_tf's, "
                  "or a copy)" if not isinstance(recorded, dict)
                  else f"its {JOB_MARKER} was made for another folder "
                       f"({recorded.get('folder')}): a copy")
        raise ValueError(f"{subject}: --fresh deletes only a folder a main job made, and "
                         f"nothing proves this one is: {reason}; delete it yourself, or pass "
                         "another --work_dir")
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise ValueError(f"{subject} holds {foreign[0]}{more}, which no main job writes: "
                         "--fresh deletes only a job's own files; move it out, or pass "
                         "another --work_dir")
    return proven
