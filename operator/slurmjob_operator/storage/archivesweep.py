"""Keeping the log archive (`storage.archive`) to its retention and its size cap, by shares.

Every namespace's deletions write into the one archive root, so who loses an entry when it is
full is the share rule's (`core.shares`): each owner (its tenant, else its namespace) may
hold `capacity / owners`, and past the capacity the owner furthest over its share loses its
oldest entry first, one entry each being the last floor. A namespace that archives a flood
therefore evicts its own entries (or those of an owner over its share), never everyone
else's, as the previous oldest-first cap did.

An entry's owner is the one recorded in it when it was written (the operator's resolution,
trusted). An entry of the previous release records none: it counts against `owner_of(its
namespace)`, the current resolution the caller passes. An entry whose record cannot be read
counts against its namespace, dated by its directory's mtime, and is swept like the others.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurmjob_operator.core.shares import Held, evictions, share_owner
from slurmjob_operator.storage.archive import (
    NAMESPACE_RE,
    RECORD_FILE,
    STALE_TEMPORARY,
    TEMPORARY_RE,
    UID_RE,
    ArchiveRecord,
    own_uids,
    read_small,
    remove_at,
)
from slurmjob_operator.storage.nofollow import UnsafePath, lstat_at, open_dir, open_root


@dataclass(frozen=True)
class Swept:
    removed: int
    kept: int
    kept_bytes: int
    #: Of the removed, those past the retention (the rest went to keep the size cap).
    expired: int = 0


@dataclass(frozen=True)
class _Entry:
    namespace: str
    uid: str
    owner: str
    size: int
    when: float


def _size(parent: int, name: str) -> int:
    """Bytes below the entry `name` (two levels: its files and its attempts' files)."""
    total = 0
    with contextlib.suppress(OSError):
        fd = open_dir(parent, name, own_uids(), name)
        try:
            for child in os.listdir(fd):
                st = lstat_at(fd, child)
                if st is None:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    with contextlib.suppress(OSError):
                        sub = open_dir(fd, child, own_uids(), child)
                        try:
                            for leaf in os.listdir(sub):
                                inner = lstat_at(sub, leaf)
                                total += inner.st_size if inner is not None else 0
                        finally:
                            os.close(sub)
                else:
                    total += st.st_size
        finally:
            os.close(fd)
    return total


def _recorded(parent: int, name: str) -> tuple[float, str | None]:
    """When the entry was archived and its recorded owner: its record's, else the
    directory's mtime and no owner."""
    try:
        fd = open_dir(parent, name, own_uids(), name)
        try:
            record = ArchiveRecord.model_validate_json(read_small(fd, RECORD_FILE, name))
        finally:
            os.close(fd)
        return record.archived_at, record.owner
    except (OSError, ValueError):
        st = lstat_at(parent, name)
        return (st.st_mtime if st is not None else 0.0), None


def _entries(rootfd: int, now: float, owner_of: Callable[[str], str]) -> list[_Entry]:
    """Every entry below the root (temporary entries a crash left are removed on the way)."""
    found: list[_Entry] = []
    for namespace in sorted(os.listdir(rootfd)):
        if not NAMESPACE_RE.fullmatch(namespace):
            continue
        try:
            nsfd = open_dir(rootfd, namespace, own_uids(), namespace)
        except (OSError, UnsafePath):
            continue
        try:
            for name in os.listdir(nsfd):
                st = lstat_at(nsfd, name)
                if st is None:
                    continue
                if TEMPORARY_RE.fullmatch(name):
                    if now - st.st_mtime > STALE_TEMPORARY:
                        remove_at(nsfd, name)
                    continue
                if UID_RE.fullmatch(name) and stat.S_ISDIR(st.st_mode):
                    when, owner = _recorded(nsfd, name)
                    owner = owner or owner_of(namespace)
                    found.append(_Entry(namespace, name, owner, _size(nsfd, name), when))
        finally:
            os.close(nsfd)
    return found


def sweep(
    root: Path,
    now: float,
    retention: float,
    max_bytes: int,
    *,
    floor: int = 0,
    owner_of: Callable[[str], str] | None = None,
) -> Swept:
    """Remove the entries archived more than `retention` seconds before `now`, then those the
    share rule picks until the rest holds at most `max_bytes` (`floor`: the share rule's);
    and temporary entries a crash left. `owner_of(namespace)`: the owner of an entry that
    records none (default: its namespace)."""
    resolve = owner_of or (lambda namespace: share_owner(namespace, None))
    rootfd = open_root(root)
    try:
        entries = _entries(rootfd, now, resolve)
        expired = [e for e in entries if now - e.when > retention]
        rest = [e for e in entries if now - e.when <= retention]
        held = [Held((e.namespace, e.uid), e.owner, e.size, e.when) for e in rest]
        # The newest entry is the one just written: a new owner's entry is never the one to go.
        newest = max(held, key=lambda h: (h.order, str(h.key)), default=None)
        chosen = set(evictions(held, max_bytes, floor, keep=newest.key if newest else None))
        gone = [*expired, *(e for e in rest if (e.namespace, e.uid) in chosen)]
        for entry in gone:
            _remove_entry(rootfd, entry.namespace, entry.uid)
        kept = [e for e in rest if (e.namespace, e.uid) not in chosen]
        return Swept(
            removed=len(gone),
            kept=len(kept),
            kept_bytes=sum(e.size for e in kept),
            expired=len(expired),
        )
    finally:
        os.close(rootfd)


def _remove_entry(rootfd: int, namespace: str, name: str) -> None:
    try:
        nsfd = open_dir(rootfd, namespace, own_uids(), namespace)
    except OSError:
        return
    try:
        remove_at(nsfd, name)
    finally:
        os.close(nsfd)
