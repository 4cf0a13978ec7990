"""Eviction and import slots (imagecache/evict.py on core/shares.py): the least recently used
files of the scope furthest over its share go first; a file in use is kept while its scope is
within its share, and only then: a tenant cannot pin the cache past its share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.core.shares import share
from slurmjob_operator.imagecache.decide import (
    ImportJob,
    ImportPolicy,
    JobState,
    Ready,
    SubmitImport,
    decide,
    submitted,
)
from slurmjob_operator.imagecache.evict import (
    CachedFile,
    cached_files,
    may_start_import,
    to_evict,
    without_entry,
)
from slurmjob_operator.imagecache.layout import CacheLayout
from slurmjob_operator.imagecache.record import ImageRecord, ImportResult
from slurmjob_operator.imagecache.request import image_request
from slurmjob_operator.site.catalogs import ArtifactFormat

NOW = datetime(2026, 12, 1, tzinfo=UTC)
LAYOUT = CacheLayout(PurePosixPath("/cache"))
POLICY = ImportPolicy()


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


def ready(image: str, n: int, size: int = 100, tenant: str | None = None) -> ImageRecord:
    req = image_request(
        image,
        tenant=tenant,
        allowed_registries=["r.io"],
        with_credentials=tenant is not None,
        fmt=ArtifactFormat.SQSH,
    )
    action = decide(req, None, NOW, POLICY, LAYOUT)
    assert isinstance(action, SubmitImport)
    record = submitted(action.record, 1)
    assert record.attempt is not None
    found = ImportResult(
        job=record.attempt.job_name,
        reference=record.reference,
        format=ArtifactFormat.SQSH,
        platform="linux/amd64",
        digest=digest(n),
        sha256="b" * 64,
        size=size,
        inode=n + 1,
        ctime_ns=n,
    )
    done = decide(
        req,
        record,
        NOW,
        POLICY,
        LAYOUT,
        ImportJob(record.attempt.job_name, JobState.COMPLETED, 1, 0),
        found,
    )
    assert isinstance(done, Ready)
    return done.record


def f(path: str, scope: str, size: int, age: int, pinned: bool = False) -> CachedFile:
    return CachedFile(path, scope, size, NOW + timedelta(seconds=age), pinned, (path,))


def test_files_are_counted_once_whatever_records_name_them() -> None:
    a = ready("r.io/x:a", 1).used_by("uid-1", NOW + timedelta(seconds=5))
    b = ready("r.io/x:b", 1).model_copy(update={"last_use": NOW + timedelta(seconds=9)})
    c = ready("r.io/x:c", 2, tenant="t1")
    files = cached_files([a, b, c])
    assert [(x.scope, x.pinned) for x in files] == [("public", True), ("tenant-t1", False)]
    assert files[0].last_use == NOW + timedelta(seconds=9)
    assert set(files[0].records) == {a.key, b.key}
    # A retired entry counts from when it was retired, pinned only by its own users.
    retired = a.entry.model_copy(
        update={
            "digest": digest(3),
            "path": "/cache/entries/public/"  # type: ignore[union-attr]
            f"sha256-{3:064x}.sqsh",
            "retired_at": NOW,
        }
    )
    moved = b.model_copy(update={"retired": [retired]})
    old = [x for x in cached_files([moved]) if x.path == retired.path]
    assert len(old) == 1
    assert old[0].last_use == NOW
    assert not old[0].pinned


def test_least_recently_used_first_within_the_cap() -> None:
    files = [f("a1", "s", 40, 1), f("a2", "s", 40, 2), f("a3", "s", 40, 3)]
    assert to_evict(files, capacity=120, floor=0) == []
    assert to_evict(files, capacity=100, floor=0) == ["a1"]
    assert to_evict(files, capacity=100, floor=0, keep="a1") == ["a2"]


def test_a_pinned_file_stays_while_its_scope_is_within_its_share() -> None:
    # t1 holds 80 all pinned, t2 holds 160 of which 60 pinned.
    files = [
        f("t1-a", "tenant-t1", 40, 1, pinned=True),
        f("t1-b", "tenant-t1", 40, 2, pinned=True),
        f("t2-a", "tenant-t2", 60, 0, pinned=True),
        f("t2-b", "tenant-t2", 50, 3),
        f("t2-c", "tenant-t2", 50, 4),
    ]
    # 240 > 200: t2 is 60 over; its unpinned files go first, older first.
    assert to_evict(files, capacity=200, floor=0) == ["t2-b"]
    # 240 > 120 (share 60): t2 loses its unpinned files and is within its share with its
    # pin; t1 is 20 over its share and loses its oldest pin; what stays fits.
    assert to_evict(files, capacity=120, floor=0) == ["t2-b", "t2-c", "t1-a"]


def test_a_tenant_cannot_pin_the_cache_past_its_share() -> None:
    flood = [f(f"t1-{i}", "tenant-t1", 10, i, pinned=True) for i in range(30)]
    quiet = [f("t2-a", "tenant-t2", 10, 100)]
    gone = to_evict(flood + quiet, capacity=100, floor=0)
    assert "t2-a" not in gone
    assert gone == [f"t1-{i}" for i in range(21)]  # 310 -> 100: t1 keeps 9 files
    # Everyone down to one file in use: the cache stays over rather than break a job.
    within = [f("a", "tenant-a", 60, 1, pinned=True), f("b", "tenant-b", 60, 2, pinned=True)]
    assert to_evict(within, capacity=100, floor=0) == []


def test_what_a_deleted_file_leaves_of_a_record() -> None:
    record = ready("r.io/x:a", 1)
    assert record.entry is not None
    assert without_entry(record, record.entry.path) is None  # the next use imports again
    assert without_entry(record, "/cache/entries/public/other.sqsh") == record
    stale = decide(
        image_request(
            "r.io/x:a",
            tenant=None,
            allowed_registries=["r.io"],
            with_credentials=False,
            fmt=ArtifactFormat.SQSH,
        ),
        record,
        NOW + timedelta(days=1),
        POLICY,
        LAYOUT,
    ).record
    assert stale.in_flight
    kept = without_entry(stale, record.entry.path)
    assert kept is not None
    assert kept.entry is None
    assert kept.attempt == stale.attempt


@pytest.mark.parametrize(
    ("in_flight", "waiting", "per_scope", "allowed", "says"),
    [
        ({}, set(), 2, True, ""),
        ({"t1": 2}, set(), 2, False, "its limit is 2"),
        ({"t2": 2, "t3": 2, "t4": 2, "t5": 2}, set(), 2, False, "the cache's limit is 8"),
        # Four scopes active: an even share of 2 each.
        ({"t1": 1, "t2": 3}, {"t3", "t4"}, 4, True, ""),  # below its share
        ({"t1": 2, "t2": 2}, {"t3", "t4"}, 4, True, ""),  # 4 free slots for 2 waiting
        ({"t1": 2, "t2": 4}, {"t3", "t4"}, 4, False, "2 other scope(s)"),  # 2 for 2
        ({"t1": 3, "t2": 3}, {"t3"}, 4, True, ""),
        ({"t1": 3, "t2": 4}, {"t3"}, 4, False, "1 other scope(s)"),
        ({"t1": 3, "t2": 4}, {"t1"}, 4, True, ""),  # only t1 itself waits
    ],
)
def test_import_slots(
    in_flight: dict[str, int], waiting: set[str], per_scope: int, allowed: bool, says: str
) -> None:
    slot = may_start_import("t1", in_flight, waiting, per_scope_limit=per_scope, total_limit=8)
    assert slot.allowed is allowed
    assert says in slot.reason


_files = st.lists(
    st.tuples(
        st.sampled_from(["public", "tenant-a", "tenant-b", "tenant-c"]),
        st.integers(min_value=1, max_value=60),
        st.booleans(),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    spec=_files,
    capacity=st.integers(min_value=30, max_value=1500),
    floor=st.integers(min_value=0, max_value=400),
)
def test_eviction_fits_when_it_can_and_keeps_pins_within_a_share(
    spec: list[tuple[str, int, bool]], capacity: int, floor: int
) -> None:
    files = [f(f"p{i}", scope, size, i, pinned) for i, (scope, size, pinned) in enumerate(spec)]
    gone = to_evict(files, capacity, floor)
    assert len(gone) == len(set(gone))
    allowed = share(capacity, floor, len({x.scope for x in files}))
    left = {x.path: x for x in files}
    used: dict[str, int] = {}
    for x in files:
        used[x.scope] = used.get(x.scope, 0) + x.size
    total = sum(used.values())
    for path in gone:
        victim = left[path]
        mine = sorted(
            (x for x in left.values() if x.scope == victim.scope), key=lambda x: x.last_use
        )
        if victim.pinned:
            # Only an owner over its share loses a pin, and only once its unpinned are gone.
            assert used[victim.scope] > max(allowed, mine[-1].size)
            assert all(x.pinned for x in mine)
        assert total > capacity  # nothing goes once it fits
        del left[path]
        used[victim.scope] -= victim.size
        total -= victim.size
    if total > capacity:
        # Could not fit: every file left is pinned and no scope is over its share.
        assert all(x.pinned for x in left.values())
        for scope in {x.scope for x in left.values()}:
            mine = sorted((x for x in left.values() if x.scope == scope), key=lambda x: x.last_use)
            assert used[scope] <= max(allowed, mine[-1].size)


@settings(max_examples=200, deadline=None)
@given(
    flights=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 6), max_size=6),
    waiting=st.sets(st.sampled_from("abcdef")),
    scope=st.sampled_from("abcdef"),
    per_scope=st.integers(1, 6),
    total=st.integers(1, 12),
)
def test_an_import_slot_never_passes_a_limit(
    flights: dict[str, int], waiting: set[str], scope: str, per_scope: int, total: int
) -> None:
    slot = may_start_import(scope, flights, waiting, per_scope, total)
    if slot.allowed:
        assert flights.get(scope, 0) < per_scope
        assert sum(flights.values()) < total
    else:
        assert slot.reason
