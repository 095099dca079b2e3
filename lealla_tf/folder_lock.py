"""One writer a folder: `hold_folder(folder, subject)` when a run starts writing
there, `release_folder` when it ends (or `one_writer(folder, subject)` around
the block that writes); `check_folder(path, subject)` before, for a path that
cannot be a folder.

Two runs writing one folder at once (the main job's --work_dir, a training
--model_dir, an embed_corpus --output) would log every step twice, overwrite
each other's checkpoints and exports, or delete each other's run folders, and
both exit 0. The run that comes second is refused instead, in one line naming
the first one's pid (`FolderInUseError`). A run that writes one file
(mine_bitext's --output) locks `<file>.lock` beside it instead (`lock_name`),
so that runs writing other files of that folder go on.

The lock is an exclusive `flock` of `<folder>/.lealla_tf.lock`, held on an
open descriptor: the kernel drops it when its holder ends, however it ends
(kill -9 included), so a lock left by a dead run never blocks: the lock never
depends on a pid. The holder writes its pid into the file for the message of the
run it refuses, and empties it when it lets go; the file itself stays (removing
it would let two runs lock two different files of one name). A killed holder's
pid stays in the file until the next holder writes its own, so the message
names a pid only once it is a live process's.

Every descriptor locks on its own: a second `hold_folder` of one folder in the
same process, another thread's included, is refused too (naming this pid).
Local folders only: a remote one (gs://, any `scheme://`) is not locked, so two
runs must not share a remote output; nor is one on a file system that cannot
`flock` (then the run goes on unguarded).

May import: nothing else of lealla_tf.
"""

import contextlib
import errno
import os
import time

try:
    import fcntl
except ImportError:  # not POSIX: no flock, so no lock
    fcntl = None

LOCK_FILE = ".lealla_tf.lock"
# How long a refused run waits for the holder's pid to appear in the file (a
# holder writes it right after it takes the lock, unless a busy machine stalls it).
PID_WAIT_SECONDS = 5.0


class FolderInUseError(RuntimeError):
    """Another live run (or this process) is writing the folder."""


def hold_folder(folder: str, subject: str | None = None,
                lock_name: str = LOCK_FILE) -> int | None:
    """Takes the lock of `folder` (created if missing; its lock file is
    `lock_name` there) and returns its descriptor: the lock lasts until
    `release_folder(descriptor)` or this process's end. None: not locked (a
    remote folder, or no flock here).

    Raises FolderInUseError when another run holds it: "<subject> is being
    written by another run (pid N): ..."; `subject` is what the message calls
    the folder (e.g. "--work_dir=runs/recipe"; default: the folder).
    ValueError (naming the lock file) when the folder cannot hold a lock: it
    is below a file, not writable, or the lock's name is a symlink.
    """
    if "://" in folder or fcntl is None:
        return None
    path = os.path.join(folder, lock_name)
    try:
        os.makedirs(folder, exist_ok=True)
        # O_NOFOLLOW: a symlink planted in the lock's place is refused, not followed.
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:  # under a file, not writable, a symlink as the lock
        raise ValueError(f"{subject or folder}: cannot lock {path}: "
                         f"{error.strerror or error}") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(descriptor)
        os.close(descriptor)
        raise FolderInUseError(
            f"{subject or folder} is being written by another run "
            f"({f'pid {holder}' if holder else 'its pid not yet written'}); one run writes "
            f"{'a folder' if lock_name == LOCK_FILE else 'an output'} at a time: wait for it "
            f"to end, or pass another {'folder' if lock_name == LOCK_FILE else 'one'}") from None
    except OSError as error:
        if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(descriptor)  # a file system that cannot lock: unguarded
            return None
        os.close(descriptor)
        raise
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor


@contextlib.contextmanager
def one_writer(folder: str, subject: str | None = None, lock_name: str = LOCK_FILE):
    """Holds the lock of `folder` (see `hold_folder`) while the block runs."""
    descriptor = hold_folder(folder, subject, lock_name)
    try:
        yield
    finally:
        release_folder(descriptor)


def release_folder(descriptor: int | None) -> None:
    """Lets go of a lock `hold_folder` took (its pid emptied out first)."""
    if descriptor is None:
        return
    try:
        os.ftruncate(descriptor, 0)
    finally:
        os.close(descriptor)  # releases the flock


def check_folder(path: str, subject: str) -> None:
    """ValueError (one line, naming `subject`, e.g. "--model_dir=runs/m") when
    `path` cannot be a folder a run writes: it is a file, a broken symlink, or
    it cannot be created (below a file, or in a folder that is not writable).
    Remote paths (`scheme://`) pass."""
    if "://" in path:
        return
    if os.path.islink(path) and not os.path.exists(path):
        raise ValueError(f"{subject} is a symlink to {os.readlink(path)}, which does not exist")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{subject} is a file, not a directory; pass a new or existing "
                         "directory")
    if os.path.isdir(path):
        return
    ancestor = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor) or not os.access(ancestor, os.W_OK | os.X_OK):
        reason = "is a file" if not os.path.isdir(ancestor) else "is not writable"
        raise ValueError(f"{subject} cannot be created: {ancestor} {reason}; pass a directory "
                         "in a writable place")


def _holder(descriptor: int) -> int | None:
    """The pid in a held lock file (waiting briefly for a holder that has just
    taken it, whose file may still hold a killed holder's pid), or None."""
    deadline = time.monotonic() + PID_WAIT_SECONDS
    while True:
        text = os.pread(descriptor, 64, 0).decode("ascii", "replace").strip()
        if text.isdigit() and _alive(int(text)):
            return int(text)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OverflowError:  # no pid at all
        return False
    return True
