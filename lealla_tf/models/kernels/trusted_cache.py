"""Where the kernel library is kept, and whether a file there may be loaded.

Loading a library runs its code, and its name is predictable, so nothing is
loaded from where another user could have put it. Before anything is opened,
the cache folder and every folder above it must belong to this user or root,
and no other user may write the cache folder (nor a folder above it, unless its
sticky bit is set, as /tmp's is): otherwise `trusted_folder` refuses it with one
line naming the folder. In the cache, the library and its checksum must be
regular files of this user (or root) that no other user can write, opened
without following a symlink, and the library's size and sha256 must match those
written beside it when it was built (`<library>.sha256`); `open_verified` gives
the descriptor that was checked and hashed, so that the very file checked is the
one loaded. A build installs a library with `install` (its checksum first), and
`remove_partial_builds` clears what killed builds left.
"""

import errno
import hashlib
import os
import pathlib
import re
import stat

CACHE = "LEALLA_TF_KERNEL_CACHE"
# A build compiles into `<BUILD_PREFIX><pid>-<random>.so` beside the library, then
# renames it; a killed build leaves that file, removed by the next build.
BUILD_PREFIX = "fused_layers-build-"
# Older versions compiled into mkstemp's `tmpXXXXXXXX.so`.
_LEGACY_PARTIAL = re.compile(r"^tmp[A-Za-z0-9_]{8}\.so$")


class KernelBuildError(RuntimeError):
    """The fused kernels could not be compiled or loaded here (the message says why)."""


class NotLoadable(Exception):
    """Why a cached library is not loaded (a phrase: "<library> {why}")."""


def cache_dir() -> pathlib.Path:
    """`$LEALLA_TF_KERNEL_CACHE`, or lealla_tf/kernels under the user's cache folder."""
    if os.environ.get(CACHE):
        return pathlib.Path(os.environ[CACHE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "lealla_tf" / "kernels"


def checksum_path(path: pathlib.Path) -> pathlib.Path:
    """Where the size and sha256 of a built library are written, beside it."""
    return path.with_name(path.name + ".sha256")


def fingerprint_fd(fd: int) -> str:
    """The sha256 and size ("<sha256> <size>") of the file open at `fd`."""
    digest, offset = hashlib.sha256(), 0
    while True:
        block = os.pread(fd, 1 << 20, offset)
        if not block:
            return f"{digest.hexdigest()} {offset}"
        digest.update(block)
        offset += len(block)


def fingerprint(path: pathlib.Path) -> str:
    """The sha256 and size ("<sha256> <size>") of the file at `path`, as a
    library's checksum file holds them."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fingerprint_fd(fd)
    finally:
        os.close(fd)


# === Trust: nothing is loaded from where another user could have put it ===

def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _folder_problem(directory: str, info: os.stat_result, itself: bool) -> str | None:
    """Why another user could change what `directory` holds (None: nobody can).
    A folder above the cache may be writable by others when its sticky bit keeps
    them from renaming what is not theirs (/tmp)."""
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a folder"
    if not _trusted_owner(info.st_uid):
        return (f"{directory} belongs to uid {info.st_uid}, not to this user "
                f"(uid {os.geteuid()}) or root")
    if info.st_mode & 0o022 and (itself or not info.st_mode & stat.S_ISVTX):
        return (f"other users can write {directory} "
                f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def _untrusted(folder, problem: str) -> KernelBuildError:
    return KernelBuildError(
        f"refusing to load code from the kernel cache {folder}: {problem}, so a library "
        f"there could be anyone's; make it yours alone (chmod go-w) or set {CACHE} to a "
        "folder only you can write")


def trusted_folder(folder) -> pathlib.Path:
    """The real path of the cache `folder`, created (mode 0700) where missing,
    once it and every folder above it are this user's or root's and no other
    user can change what it holds (see `_folder_problem`). KernelBuildError
    naming the folder otherwise, before anything in it is opened."""
    real = pathlib.Path(os.path.realpath(folder))
    missing, existing = [], real
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    for directory in [existing, *existing.parents]:
        try:
            info = os.lstat(directory)
        except OSError as error:
            raise unwritable(folder, error) from None
        if directory == real and not stat.S_ISDIR(info.st_mode):
            raise unwritable(folder, NotADirectoryError(errno.ENOTDIR, "not a folder"))
        problem = _folder_problem(str(directory), info, itself=directory == real)
        if problem:
            raise _untrusted(folder, problem)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass  # a concurrent build made it: checked as any other below
        except OSError as error:
            raise unwritable(folder, error) from None
        problem = _folder_problem(str(directory), os.lstat(directory),
                                  itself=directory == real)
        if problem:
            raise _untrusted(folder, problem)
    return real


def _file_problem(info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if not _trusted_owner(info.st_uid):
        return f"belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _open_checked(path) -> int:
    """A descriptor of `path`, opened without following a symlink, once it is a
    regular file of this user (or root) that no other user can write;
    `NotLoadable` saying why not otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NotLoadable("is missing") from None
    except OSError as error:
        raise NotLoadable("is a symbolic link" if error.errno == errno.ELOOP
                          else f"cannot be read ({error.strerror})") from None
    problem = _file_problem(os.fstat(fd))
    if problem:
        os.close(fd)
        raise NotLoadable(problem)
    return fd


def open_verified(path: pathlib.Path) -> int:
    """A descriptor of the library at `path` once it passes `_open_checked` and
    its size and sha256 match those written beside it (by a file that passes
    `_open_checked` too); `NotLoadable` saying why not otherwise."""
    try:
        checksum = _open_checked(checksum_path(path))
    except NotLoadable as problem:
        raise NotLoadable("has no checksum beside it" if str(problem) == "is missing"
                          else f"has a checksum beside it that {problem}") from None
    try:
        expected = os.pread(checksum, 4096, 0).decode("ascii", "replace").split()[:2]
    finally:
        os.close(checksum)
    fd = _open_checked(path)
    if len(expected) != 2 or fingerprint_fd(fd) != " ".join(expected):
        os.close(fd)
        raise NotLoadable(
            "does not match the size and sha256 written beside it when it was built")
    return fd


def why_not_loadable(path: pathlib.Path) -> str | None:
    """Why the library at `path` is not loaded (see `open_verified`); None when it may be."""
    try:
        os.close(open_verified(path))
    except NotLoadable as problem:
        return str(problem)
    return None


def valid(path: pathlib.Path) -> bool:
    """Whether `path` is the library a build wrote: a regular file of this user
    that no other user can write, whose size and sha256 match those written
    beside it. A truncated library killed the process that loaded it (SIGBUS),
    a foreign one failed later, and a planted one ran its code; none is loaded."""
    return why_not_loadable(pathlib.Path(path)) is None


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (ours or another user's)?
    except OSError as error:
        return error.errno == errno.EPERM
    return True


def remove_partial_builds(folder: pathlib.Path) -> None:
    """Removes the partial libraries of killed builds (called holding the build
    lock): ours by name, and only where the pid in the name runs no more. An
    older version's `tmpXXXXXXXX.so` is taken as ours when it is empty (the
    compiler had not written yet) or names our ops."""
    for entry in folder.iterdir():
        name = entry.name
        if name.startswith(BUILD_PREFIX) and name.endswith(".so"):
            pid = name[len(BUILD_PREFIX):].split("-", 1)[0]
            if not pid.isdigit() or _pid_running(int(pid)):
                continue
        elif _LEGACY_PARTIAL.match(name):
            try:
                if entry.stat().st_size and b"LeallaAttention" not in entry.read_bytes():
                    continue
            except OSError:
                continue
        else:
            continue
        try:
            entry.unlink()
        except OSError:
            pass


def unwritable(folder: pathlib.Path, error: OSError) -> KernelBuildError:
    """The error for a cache `folder` that cannot be written (`error` says why)."""
    return KernelBuildError(f"cannot write the kernel cache {folder} ({error}); "
                            f"set {CACHE} to a writable folder")


def install(partial: pathlib.Path, path: pathlib.Path) -> None:
    """Moves a compiled library into place, its checksum first: a library that is
    there is loaded only once the checksum beside it matches. Both are made
    writable by this user alone, whatever the umask."""
    checksum = checksum_path(path)
    staged = checksum.with_name(f"{checksum.name}.{os.getpid()}.tmp")
    try:
        os.chmod(partial, 0o755)
        if staged.exists():
            staged.unlink()
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, (fingerprint(partial) + "\n").encode("ascii"))
        finally:
            os.close(fd)
        os.replace(staged, checksum)
        os.replace(partial, path)
    except OSError as error:
        raise unwritable(path.parent, error) from None
    finally:
        if staged.exists():
            staged.unlink()


