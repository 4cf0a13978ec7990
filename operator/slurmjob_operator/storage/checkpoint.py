"""A walltime chain's checkpoint directory: `<root>/<namespace>/<name>-<uid8>/checkpoint`
(`naming.checkpoint_dir`), beside the attempt directories, made with the first segment's
staging, read and written by every segment, removed with the SlurmJob and never archived.

It is the first place below the staging tree that the job's own code writes freely, so
everything here treats its content as hostile:
- it is reached from the storage root by descriptors, no link followed, each directory on the
  way owned by the operator or the job user (`nofollow`);
- the progress scan (`scan`) lstat's entries only, opens subdirectories without following a
  link, and stops at `MAX_ENTRIES` entries or `MAX_DEPTH` levels: a tree larger than that is
  "unknown", which counts as progress (the chain's own limits still end it);
- removal (`set_aside`, then `removal_pass`) renames the directory into the operator's trash
  (`storage.trash`) and removes it in bounded passes from descriptors (`storage.removal`),
  reporting what it could not remove, never raising: a deletion is not held up by files the
  job made unremovable, nor by millions of files.

All functions block: async callers run `scan` with `asyncio.to_thread` and the removal on the
removals pool (`storage.executors`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from slurmjob_operator.config import Settings, parse_owner
from slurmjob_operator.core import naming
from slurmjob_operator.core.removal import PassBounds, PassOutcome
from slurmjob_operator.core.segments import UNKNOWN_CHECKPOINT, checkpoint_digest
from slurmjob_operator.storage import acl, trash
from slurmjob_operator.storage.nofollow import (
    UnsafePath,
    below,
    dir_owners,
    job_owner,
    lstat_at,
    walk,
)
from slurmjob_operator.storage.removal import remove_pass
from slurmjob_operator.storage.staging import enter_dir
from slurmjob_operator.storage.stagingtree import StagingError

#: The most entries (files, directories, links) the progress scan looks at.
MAX_ENTRIES = 10_000
#: The deepest level below the checkpoint directory the scan enters.
MAX_DEPTH = 8
CHECKPOINT_MODE = 0o755
ACL_MODE = 0o700

_SUBDIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _resource_parts(settings: Settings, namespace: str, name: str, uid: str) -> tuple[str, ...]:
    path = naming.resource_dir(settings.storage_root, namespace, name, uid)
    return below(settings.storage_root, path)


def make(settings: Settings, resource_dir: Path, *, job_uid: int | None = None) -> None:
    """Make the checkpoint directory in `resource_dir` (a segment's staging made it, beside
    its attempt directory) as the attempt directories are made (`staging.enter_dir`): the
    staging owner's, or in ACL mode (`job_uid`) the operator's with the job's uid granted. An
    existing one is kept."""
    parts = below(settings.storage_root, resource_dir)
    owner = None if job_uid is not None else parse_owner(settings.staging_owner)
    mode = ACL_MODE if job_uid is not None else CHECKPOINT_MODE
    owners = dir_owners(owner[0] if owner is not None else os.geteuid())
    where = resource_dir / naming.CHECKPOINT_DIR
    try:
        with walk(settings.storage_root, parts, owners) as resource:
            fd, _ = enter_dir(resource, naming.CHECKPOINT_DIR, where, mode, owner, owners)
            try:
                if job_uid is not None:
                    acl.grant_dir(fd, job_uid, os.geteuid())
            finally:
                os.close(fd)
            os.fsync(resource)
    except (UnsafePath, acl.AclError) as exc:
        raise StagingError(f"{where}: {exc}; the segment is not staged") from None


def scan(settings: Settings, namespace: str, name: str, uid: str, owner: int | None) -> str:
    """The digest of what the checkpoint directory holds (`core.segments.checkpoint_digest`),
    or `UNKNOWN_CHECKPOINT` when it cannot be read in full (refused, too many entries, too
    deep). A missing directory is an empty one. `owner`: the job's uid when it is not the
    settings' job user."""
    parts = _resource_parts(settings, namespace, name, uid)
    owners = dir_owners(owner if owner is not None else job_owner(settings))
    entries: list[tuple[str, int, int, int]] = []
    try:
        with walk(settings.storage_root, (*parts, naming.CHECKPOINT_DIR), owners) as top:
            if not _scan_into(top, "", 0, entries):
                return UNKNOWN_CHECKPOINT
    except FileNotFoundError:
        return checkpoint_digest(())
    except OSError:  # UnsafePath too: a link or stranger where the directory should be
        return UNKNOWN_CHECKPOINT
    return checkpoint_digest(entries)


def _scan_into(fd: int, prefix: str, depth: int, entries: list[tuple[str, int, int, int]]) -> bool:
    """Add the entries below directory `fd`; False when a bound was reached."""
    with os.scandir(fd) as listing:
        children = []
        for entry in listing:
            st = entry.stat(follow_symlinks=False)
            path = prefix + entry.name
            entries.append((path, stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns))
            if len(entries) > MAX_ENTRIES:
                return False
            if stat.S_ISDIR(st.st_mode):
                children.append(entry.name)
    for child in children:
        if depth + 1 > MAX_DEPTH:
            return False
        try:
            sub = os.open(child, _SUBDIR_FLAGS, dir_fd=fd)
        except OSError:
            return False  # replaced by a link or removed meanwhile
        try:
            if not _scan_into(sub, prefix + child + "/", depth + 1, entries):
                return False
        finally:
            os.close(sub)
    return True


@dataclass(frozen=True)
class Removal:
    """A checkpoint directory being removed: `where` it was (for messages), its name in the
    trash (`storage.trash`), or None when it is removed where it is."""

    where: Path
    trash: str | None


def set_aside(settings: Settings, namespace: str, name: str, uid: str) -> Removal | None:
    """Start removing the checkpoint directory: renamed into the trash (one call, whatever it
    holds), or left where it is when it cannot be (`trash.set_aside`). None: there is none.
    OSError (UnsafePath too) when the resource directory cannot be walked."""
    parts = _resource_parts(settings, namespace, name, uid)
    where = settings.storage_root.joinpath(*parts, naming.CHECKPOINT_DIR)
    try:
        with walk(settings.storage_root, parts, dir_owners(job_owner(settings))) as resource:
            if lstat_at(resource, naming.CHECKPOINT_DIR) is None:
                return None
            # A link or a file in its place is moved too (a rename follows no link).
            label = f"{parts[-1]}-checkpoint"
            moved = trash.set_aside(settings.storage_root, resource, naming.CHECKPOINT_DIR, label)
    except FileNotFoundError:
        return None
    return Removal(where, moved)


def removal_pass(settings: Settings, removal: Removal, bounds: PassBounds) -> PassOutcome:
    """One bounded pass (`core.removal`) on a checkpoint directory `set_aside` started. Its
    problems name paths below `removal.where`. Never raises: what stops it is a problem."""
    try:
        if removal.trash is not None:
            outcome = trash.removal_pass(
                settings.storage_root, removal.trash, bounds, shown=str(removal.where)
            )
        else:
            parts = below(settings.storage_root, removal.where.parent)
            owners = dir_owners(job_owner(settings))
            with walk(settings.storage_root, parts, owners) as resource:
                outcome = remove_pass(
                    resource, naming.CHECKPOINT_DIR, bounds, shown=str(removal.where)
                )
    except FileNotFoundError:
        return PassOutcome(removed=0, looked_at=0, walked_all=True, done=True)
    except OSError as exc:  # UnsafePath too: a link or stranger on the way
        return PassOutcome(0, 0, walked_all=True, done=False, problems=(f"{removal.where}: {exc}",))
    return outcome
