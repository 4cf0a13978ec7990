"""Trees the operator is removing, set aside under the storage root until they are gone:
`<root>/.slurmjob-removing/<entry>` (issue 42).

Why a rename into a directory of the operator's own, and not "the checkpoint directories of
SlurmJobs that no longer exist": a rename is atomic and costs one call whatever the tree
holds, so the deletion can go on at once; after it the tree is reachable from no path the job
or its tenant knows (the directory is the operator's, mode 0700); and after a restart the
sweep finds every leftover by listing one directory, without reading any SlurmJob or walking
the tenants' trees. The name cannot be a namespace's directory: a namespace is a DNS label,
which never starts with a dot.

The trash lives on the storage root's filesystem; a tree on another one (a namespace's
directory mounted from elsewhere) cannot be renamed into it (`EXDEV`) and is removed where
it is (`set_aside` returns None).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from slurmjob_operator.core.removal import PassBounds, PassOutcome
from slurmjob_operator.storage.nofollow import UnsafePath, open_dir, open_root
from slurmjob_operator.storage.removal import remove_pass

log = logging.getLogger(__name__)

TRASH_DIR = ".slurmjob-removing"
TRASH_MODE = 0o700


@contextlib.contextmanager
def opened(root: Path, *, make: bool = False) -> Iterator[int]:
    """A descriptor of the trash (the operator's own directory, no link followed; made when
    `make`); FileNotFoundError when there is none."""
    top = open_root(root)
    try:
        if make:
            with contextlib.suppress(FileExistsError):
                os.mkdir(TRASH_DIR, TRASH_MODE, dir_fd=top)
        fd = open_dir(top, TRASH_DIR, {os.geteuid()}, str(root / TRASH_DIR))
    finally:
        os.close(top)
    try:
        yield fd
    finally:
        os.close(fd)


def set_aside(root: Path, parent: int, name: str, label: str) -> str | None:
    """Rename `name` of directory `parent` into the trash as `<label>.<random>`: its name
    there, or None when it cannot be moved (another filesystem, a refusal): the caller then
    removes it where it is. Raises nothing else than what opening the trash raises."""
    entry = f"{label}.{secrets.token_hex(4)}"
    try:
        with opened(root, make=True) as trash:
            os.rename(name, entry, src_dir_fd=parent, dst_dir_fd=trash)
            os.fsync(trash)
    except UnsafePath as exc:
        log.warning("not using the trash: %s", exc)  # not the operator's own directory
        return None
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EACCES, errno.EPERM, errno.EBUSY, errno.EROFS):
            return None
        raise
    return entry


def entries(root: Path, limit: int) -> list[str]:
    """At most `limit` names in the trash (none when there is no trash): the sweep's scan,
    bounded like a pass."""
    try:
        with opened(root) as trash, os.scandir(trash) as listing:
            return [e.name for e in itertools.islice(listing, limit)]
    except FileNotFoundError:
        return []


def removal_pass(
    root: Path, entry: str, bounds: PassBounds, *, shown: str | None = None
) -> PassOutcome:
    """One pass on a trash entry (problems name paths from `shown`, else its path in the
    trash); a directory too deep for one pass becomes an entry of its own (`storage.removal`)."""
    with opened(root) as trash:
        where = shown if shown is not None else str(root / TRASH_DIR / entry)
        return remove_pass(trash, entry, bounds, spill=trash, shown=where)
