"""Which cache files go when the image cache is over its size cap, and whether a scope may
start another import.

The owners of the share rule (`core.shares`) are the tenants (`tenant-<name>`): a tenant's
private entries and the shared entries its SlurmJobs made (the record's `charged`), so one
tenant's anonymous pulls cannot flush another's; without tenants the shared entries are one
owner (`public`). Files go by the last use the
operator recorded (never file times, which a job's reads or a backup can change), the owner
furthest over its share first. A file a non-final SlurmJob uses is pinned: it goes only while
its owner is over its share, so a tenant cannot pin the cache past its share.

A file may be the entry of several records (two tags of one digest in one scope) and a
retired entry of a record whose tag moved on: it is counted once, pinned if any record's
users use it, used when any record last used it.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmjob_operator.core.shares import Held, evictions, share
from slurmjob_operator.imagecache.record import Entry, ImageRecord, RecordState


@dataclass(frozen=True)
class CachedFile:
    """One file of the cache, as the records describe it."""

    path: str
    scope: str
    size: int
    last_use: datetime
    pinned: bool
    records: tuple[str, ...]
    #: The share it counts in (the record's `charged`); '' for its scope's own.
    owner: str = ""

    @property
    def share_owner(self) -> str:
        return self.owner or self.scope


def _uses(record: ImageRecord) -> Iterable[tuple[Entry, datetime]]:
    if record.entry is not None:
        yield record.entry, record.last_use or record.entry.published_at
    for old in record.retired:
        yield old, old.retired_at or old.published_at


def cached_files(records: Iterable[ImageRecord]) -> list[CachedFile]:
    """The files the records name, each once, ordered by path."""
    files: dict[str, CachedFile] = {}
    for record in records:
        pins = record.pinned_digests()
        for entry, used in _uses(record):
            seen = files.get(entry.path)
            pinned = entry.digest in pins
            if seen is None:
                files[entry.path] = CachedFile(
                    entry.path,
                    record.scope,
                    entry.size,
                    used,
                    pinned,
                    (record.key,),
                    record.charged or "",
                )
                continue
            files[entry.path] = CachedFile(
                entry.path,
                seen.scope,
                max(seen.size, entry.size),
                max(seen.last_use, used),
                seen.pinned or pinned,
                (*seen.records, record.key) if record.key not in seen.records else seen.records,
                seen.owner,
            )
    return [files[path] for path in sorted(files)]


def to_evict(
    files: Iterable[CachedFile], capacity: int, floor: int, *, keep: str | None = None
) -> list[str]:
    """The paths to delete, in order, so that what stays fits `capacity` bytes where it
    can; `floor` is each scope's least share (`core.shares.share`), `keep` a file being
    published now."""
    held = [Held(f.path, f.share_owner, f.size, f.last_use.timestamp(), f.pinned) for f in files]
    gone: list[Hashable] = evictions(held, capacity, floor, keep=keep)
    return [str(path) for path in gone]


def without_entry(record: ImageRecord, path: str) -> ImageRecord | None:
    """The record once the file at `path` is deleted; None: delete the record (its current
    entry went and nothing is in flight: the next use imports again, under a new epoch)."""
    retired = [e for e in record.retired if e.path != path]
    if record.entry is None or record.entry.path != path:
        return record.model_copy(update={"retired": retired})
    if record.in_flight or record.state is RecordState.FAILED:
        # An import in flight keeps its write-ahead; a failure keeps answering.
        return record.model_copy(update={"entry": None, "retired": retired})
    return None


@dataclass(frozen=True)
class Slot:
    """Whether a scope may start an import now, and why not."""

    allowed: bool
    reason: str = ""


def may_start_import(
    scope: str,
    in_flight: Mapping[str, int],
    waiting: Collection[str],
    per_scope_limit: int,
    total_limit: int,
) -> Slot:
    """Whether `scope` may start one more import, given the imports in flight per scope and
    the scopes with imports waiting to start: below its own limit and the total, and, once
    at its even share of the total (`core.shares.share`), only while the free slots
    outnumber the other waiting scopes still below theirs."""
    mine = in_flight.get(scope, 0)
    if mine >= per_scope_limit:
        return Slot(False, f"{scope} has {mine} imports running, its limit is {per_scope_limit}")
    total = sum(in_flight.values())
    if total >= total_limit:
        return Slot(False, f"{total} imports running, the cache's limit is {total_limit}")
    active = {s for s, n in in_flight.items() if n > 0} | set(waiting) | {scope}
    even = share(total_limit, 1, len(active))
    if mine >= even:
        below = [s for s in set(waiting) if s != scope and in_flight.get(s, 0) < even]
        if len(below) >= total_limit - total:
            return Slot(
                False,
                f"{scope} has its share of imports ({mine}); {len(below)} other scope(s) below "
                "theirs are waiting",
            )
    return Slot(True)


#: How long a failed import with no file keeps answering the SlurmJobs that name it (they
#: fail at once) before the next one tries again; it also bounds the records a tenant makes
#: by naming images that do not exist (one ConfigMap each).
FAILURE_KEPT = timedelta(hours=1)


def _spent_failure(record: ImageRecord, now: datetime) -> bool:
    """A failure with no file, nothing in flight and nobody bound, older than FAILURE_KEPT."""
    failure = record.failure
    return (
        failure is not None
        and record.entry is None
        and not record.retired
        and not record.in_flight
        and not record.users
        and now - failure.at > FAILURE_KEPT
    )


@dataclass(frozen=True)
class SweepPlan:
    """What one sweep of the cache changes: the records to write (users released, entries
    gone), the records to delete (their entry gone, nothing in flight) and the files to
    delete, in order."""

    write: tuple[ImageRecord, ...]
    delete: tuple[str, ...]
    paths: tuple[str, ...]


def released(record: ImageRecord, live: Collection[str]) -> ImageRecord:
    """`record` without the users that are not among the `live` SlurmJobs (final or gone)."""
    kept = [user for user in record.users if user.uid in live]
    if len(kept) == len(record.users):
        return record
    return record.model_copy(update={"users": kept})


def plan_sweep(
    records: Iterable[ImageRecord],
    live: Collection[str],
    capacity: int,
    floor: int,
    missing: Collection[str] = (),
    now: datetime | None = None,
) -> SweepPlan:
    """One sweep: the users the `live` SlurmJobs no longer include are released, the
    entries the last check found `missing` are forgotten (the next use imports again rather
    than fail on the node), a failure nobody waits on is forgotten `FAILURE_KEPT` after it
    (`now`), then the files over `capacity` go (`to_evict`)."""
    before = {record.key: record for record in records}
    after: dict[str, ImageRecord | None] = {}
    for key, record in before.items():
        current: ImageRecord | None = released(record, live)
        for path in missing:
            if current is not None:
                current = without_entry(current, path)
        if current is not None and now is not None and _spent_failure(current, now):
            current = None
        after[key] = current
    files = cached_files(r for r in after.values() if r is not None)
    # A scope with an import in flight keeps its files this pass: that import may be about
    # to publish (or find) one of them.
    importing = {r.scope for r in after.values() if r is not None and r.in_flight}
    scope_of = {f.path: f.scope for f in files}
    paths = [p for p in to_evict(files, capacity, floor) if scope_of[p] not in importing]
    for path in paths:
        for key, kept in after.items():
            if kept is not None:
                after[key] = without_entry(kept, path)
    write = tuple(r for k, r in after.items() if r is not None and r != before[k])
    delete = tuple(k for k, r in after.items() if r is None)
    return SweepPlan(write, delete, tuple(paths))
