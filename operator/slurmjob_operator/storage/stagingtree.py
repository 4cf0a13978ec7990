"""Whether the staging tree can take an attempt at all, asked before the attempt is recorded.

A directory on the way to the attempt that belongs to someone else, or that the operator may
not write in, is the site's to fix: the operator cannot repair it and must not work around it
(no chmod of a directory it does not own, no path followed). Such a tree fails every attempt
the same way, so it is found before the write-ahead record (the phase stays Pending instead of
passing through Submitting on every try) and reported as `StagingNotWritable`, naming the
directory, its owner and mode, the uid the operator runs as and the uid the job runs as.

The check walks the directories that exist below the storage root, the same way staging does
(from the parent's descriptor, no link followed, owner checked), and asks the kernel whether
the deepest of them takes a new entry. It creates nothing: a missing directory is made by
`staging.stage_attempt`, which raises the same error should the tree change in between.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurmjob_operator.config import Settings
from slurmjob_operator.storage.nofollow import (
    UnsafePath,
    below,
    dir_owners,
    job_owner,
    open_dir,
    open_root,
)


class StagingError(RuntimeError):
    """The staging directory cannot be (re)written as asked; the message says why."""


class StagingNotWritable(StagingError):
    """The staging tree refuses the attempt for a reason only the site can change."""


def staging_uids(settings: Settings, job_uid: int | None) -> tuple[int, int]:
    """(the uid staging directories may belong to besides the operator's, the uid the job
    runs as): a tenant's own uid in ACL mode, else SLURMJOB_STAGING_OWNER, else the
    operator's own uid."""
    if job_uid is not None:
        return os.geteuid(), job_uid
    uid = job_owner(settings)
    return uid, uid


def _described(parent: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link owned by {st.st_uid}:{st.st_gid}"
    return f"is owned by {st.st_uid}:{st.st_gid} with mode {stat.S_IMODE(st.st_mode):04o}"


def not_writable(where: Path, found: str, settings: Settings, job_uid: int | None) -> str:
    """The message of a StagingNotWritable: what was found and what the admin can change."""
    owner, runs_as = staging_uids(settings, job_uid)
    euid = os.geteuid()
    allowed = f"uid {euid}" if owner == euid else f"uid {euid} or {owner}"
    return (
        f"staging directory {where} {found}; the operator runs as uid {euid} and the job as "
        f"uid {runs_as}, so the directory must be owned by {allowed} and writable by its "
        f"owner: change its owner or mode, or remove it (the operator makes it), or set "
        f"SLURMJOB_STAGING_OWNER to the uid:gid that owns it; `slurmjob-operator doctor` "
        f"checks the storage root"
    )


def check_tree(settings: Settings, staging_dir: Path, *, job_uid: int | None = None) -> None:
    """Raise StagingNotWritable when the directories on the way to `staging_dir` cannot take
    it (see the module docstring); the attempt directory itself is left to staging."""
    root = settings.storage_root
    try:
        parts = below(root, staging_dir)
    except UnsafePath as exc:
        raise StagingError(str(exc)) from None
    owner, _ = staging_uids(settings, job_uid)
    owners = dir_owners(owner)
    try:
        fds = [open_root(root)]
    except OSError as exc:
        raise StagingNotWritable(
            not_writable(root, f"cannot be opened ({exc.strerror})", settings, job_uid)
        ) from None
    where = root
    try:
        for part in parts[:-1]:
            try:
                fds.append(open_dir(fds[-1], part, owners, str(where / part)))
            except FileNotFoundError:
                break
            except (UnsafePath, PermissionError):
                found = _described(fds[-1], part)
                raise StagingNotWritable(
                    not_writable(where / part, found, settings, job_uid)
                ) from None
            where = where / part
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=fds[-1], effective_ids=True):
            st = os.fstat(fds[-1])
            found = (
                f"is owned by {st.st_uid}:{st.st_gid} with mode "
                f"{stat.S_IMODE(st.st_mode):04o}, which does not let the operator add to it"
            )
            raise StagingNotWritable(not_writable(where, found, settings, job_uid))
    finally:
        for fd in reversed(fds):
            os.close(fd)
