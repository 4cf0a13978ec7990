"""Opening what lies below the storage root without following a link on the way.

Jobs write below the root, and a job owns its staging directory: it can replace any file or
directory there with a symbolic link (to the ServiceAccount token, the JWT or its signing key,
/proc/self/environ), a hard link to someone else's file, a FIFO that blocks its reader, or a
device. So nothing below the root is opened by path. The root itself (`Settings.storage_root`,
set by the admin) is trusted and opened as named; from there each directory is opened relative
to its parent's descriptor with O_NOFOLLOW | O_DIRECTORY, and a file is first lstat'ed (no
open at all of a FIFO, socket or device: opening some devices has effects) and then opened
with O_NOFOLLOW | O_NONBLOCK and accepted only when `fstat` of that descriptor shows:

- a regular file (S_ISREG), the same inode the lstat saw (nothing swapped in between);
- exactly one link (st_nlink == 1): not a hard link to a file that lives elsewhere;
- the expected owner.

Owners (`job_owner`). The job user writes the logs, and the operator creates every staging
directory and file as that same user: the uid of `SLURMJOB_STAGING_OWNER` when it is set (the
operator runs as another user and hands them over), else the operator's own uid (it then runs
as the job user, the chart's advice: the job must write into the attempt directory, mode 0755,
that the operator made). So a log or a staged file must belong to `job_owner`; a directory on
the way may also belong to the operator's own uid (one the operator or the admin made without
handing it over). Anything owned by another uid (root's files, another tenant's, even a hard
link whose other name was removed so that st_nlink is 1 again) is refused with `UnsafePath`,
an OSError, whose message names the path and the reason, never the content.

What this cannot do: every job of every namespace runs as the one job user (docs/security.md),
so a job can still move another job's log, a regular file of that same owner, into its own
directory. Trust domains that must not see each other need their own operator, Slurm user and
storage root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path, PurePosixPath

from slurmjob_operator.config import Settings, parse_owner

__all__ = [
    "UnsafePath",
    "below",
    "dir_owners",
    "job_owner",
    "kind",
    "lstat_at",
    "open_dir",
    "open_file",
    "open_root",
    "read_at_most",
    "walk",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1024 * 1024


class UnsafePath(OSError):
    """Something below the storage root is not what the operator made or expects there."""


def job_owner(settings: Settings) -> int:
    """The uid every staged file and log must belong to (see the module docstring)."""
    owner = parse_owner(settings.staging_owner)
    return owner[0] if owner is not None else os.geteuid()


def dir_owners(owner: int) -> frozenset[int]:
    """Who may own a directory below the root: the job user or the operator itself."""
    return frozenset({owner, os.geteuid()})


def below(root: Path, path: Path) -> tuple[str, ...]:
    """The components of `path` below `root` (UnsafePath when it is not below it, or goes
    through `.` or `..`)."""
    try:
        relative = PurePosixPath(path).relative_to(PurePosixPath(root))
    except ValueError:
        raise UnsafePath(f"{path}: not below the storage root {root}") from None
    parts = relative.parts
    if not parts or any(p in {"", ".", ".."} for p in parts):
        raise UnsafePath(f"{path}: not a path below the storage root {root}")
    return parts


def kind(mode: int) -> str:
    """What a file is, in words, for messages."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _refused(parent: int, name: str, where: str) -> UnsafePath:
    """Why `name` could not be opened as a directory (Linux says ENOTDIR for a link too)."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        return UnsafePath(f"{where}: is not a directory")
    if stat.S_ISLNK(mode):
        return UnsafePath(f"{where}: is a symbolic link; not followed")
    return UnsafePath(f"{where}: is {kind(mode)}, not a directory")


def open_dir(parent: int, name: str, owners: Collection[int], where: str) -> int:
    """Open directory `name` of `parent` without following a link; FileNotFoundError when it
    is missing, UnsafePath when it is a link, not a directory or not owned by `owners`."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refused(parent, name, where) from None
        raise
    st = os.fstat(fd)
    if st.st_uid not in owners:
        os.close(fd)
        raise UnsafePath(f"{where}: owned by uid {st.st_uid}, not by {sorted(owners)}")
    return fd


@contextlib.contextmanager
def walk(root: Path, parts: Sequence[str], owners: Collection[int]) -> Iterator[int]:
    """A descriptor of the directory `root/parts...`, each component below the root opened
    by `open_dir` (no link followed, owner checked); closed on exit. FileNotFoundError when
    a component is missing, UnsafePath when one is refused."""
    fds = [open_root(root)]
    try:
        where = root
        for part in parts:
            where = where / part
            fds.append(open_dir(fds[-1], part, owners, str(where)))
        yield fds[-1]
    finally:
        for fd in reversed(fds):
            os.close(fd)


def open_root(root: Path) -> int:
    """The storage root itself: trusted (the admin's setting), so a link there is followed."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def lstat_at(parent: int, name: str) -> os.stat_result | None:
    """The entry itself (a link is not followed); None when it does not exist."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_file(parent: int, name: str, owner: int, where: str) -> int:
    """Open `name` of `parent` for reading: a regular file with one link, owned by `owner`
    (see the module docstring). FileNotFoundError when missing, UnsafePath when refused."""
    before = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISREG(before.st_mode):
        raise UnsafePath(f"{where}: is {kind(before.st_mode)}; only regular files are read")
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # swapped since the lstat
            raise UnsafePath(f"{where}: changed while it was opened") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (
            before.st_dev,
            before.st_ino,
        ):
            raise UnsafePath(f"{where}: changed while it was opened")
        if st.st_nlink != 1:
            raise UnsafePath(f"{where}: has {st.st_nlink} hard links; only a file with one is read")
        if st.st_uid != owner:
            raise UnsafePath(f"{where}: owned by uid {st.st_uid}, not by the job user {owner}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at_most(fd: int, limit: int, offset: int = 0) -> bytes:
    """Up to `limit` bytes from `offset` (fewer only at the end of the file)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.pread(fd, min(left, _CHUNK), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        left -= len(chunk)
    return b"".join(chunks)
