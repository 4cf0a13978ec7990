"""The image cache's metrics (issue 44, section 3): what the records say each scope holds
(imagecache/usage.py `summarise`), when an import counts as ended (`ended_import`), and the
series `Metrics.images` (`imagemetrics`) and `CacheMeter` set. The gate's hits and misses are in
test_imagecache_gate_metrics.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from slurmjob_operator.imagecache.decide import ImportJob, JobState, decide, submitted
from slurmjob_operator.imagecache.meter import CacheMeter
from slurmjob_operator.imagecache.record import (
    FailureKind,
    ImageRecord,
    ImportResult,
    RecordState,
)
from slurmjob_operator.imagecache.request import image_request
from slurmjob_operator.imagecache.usage import ended_import, summarise
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.catalogs import ArtifactFormat

from .test_imagecache_evict import LAYOUT, NOW, POLICY, digest, ready


def _retired(record: ImageRecord, n: int, size: int) -> ImageRecord:
    """`record` whose tag moved on from the entry of digest `n` (kept as retired)."""
    old = ready(record.reference, n, size, record.tenant)
    assert old.entry is not None
    entry = old.entry.model_copy(update={"retired_at": NOW})
    return record.model_copy(update={"retired": [entry]})


A = ready("r.io/a:1", 1, 100)
A_DIGEST = ready("r.io/a@" + digest(1), 1, 100)  # another record, the same file
B = ready("r.io/b:1", 2, 30)
PRIVATE = ready("r.io/a:1", 3, 7, tenant="team-a")
MOVED = _retired(ready("r.io/c:1", 4, 50), 5, 20)


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], {}),
        ([A], {"public": (100, 1)}),
        ([A, B], {"public": (130, 2)}),
        # Two tags (here a tag and its digest) of one file: one file on the disk.
        ([A, A_DIGEST], {"public": (100, 1)}),
        ([A, A_DIGEST, B], {"public": (130, 2)}),
        # Two scopes apart; the tenant's file of the same reference is its own.
        ([A, PRIVATE], {"public": (100, 1), "tenant-team-a": (7, 1)}),
        # A retired entry is still a file of the cache until it is evicted.
        ([MOVED], {"public": (70, 2)}),
        # A record with no entry yet (its import in flight) holds nothing.
        ([A.model_copy(update={"entry": None, "state": RecordState.IMPORTING})], {}),
    ],
)
def test_summarise(records: list[ImageRecord], expected: dict[str, tuple[int, int]]) -> None:
    assert summarise(records) == expected
    assert summarise(reversed(records)) == expected  # the order of the records is no matter


def _in_flight(image: str = "r.io/x:1") -> ImageRecord:
    req = image_request(
        image,
        tenant=None,
        allowed_registries=["r.io"],
        with_credentials=False,
        fmt=ArtifactFormat.SQSH,
    )
    action = decide(req, None, NOW, POLICY, LAYOUT)
    return submitted(action.record, 7)


def _ended(before: ImageRecord, code: int, after_seconds: float) -> ImageRecord:
    assert before.attempt is not None
    req = image_request(
        before.reference,
        tenant=None,
        allowed_registries=["r.io"],
        with_credentials=False,
        fmt=ArtifactFormat.SQSH,
    )
    name = before.attempt.job_name
    state = JobState.COMPLETED if code == 0 else JobState.FAILED
    found = ImportResult(
        job=name,
        reference=before.reference,
        format=ArtifactFormat.SQSH,
        platform="linux/amd64",
        digest=digest(9),
        sha256="b" * 64,
        size=1,
        inode=2,
        ctime_ns=3,
    )
    later = NOW + timedelta(seconds=after_seconds)
    job = ImportJob(name, state, 7, code)
    return decide(req, before, later, POLICY, LAYOUT, job, found if code == 0 else None).record


RUNNING = _in_flight()
DONE = _ended(RUNNING, 0, 95)
RETRIED = _ended(RUNNING, 69, 30)  # transient: tried again later
FAILED = _ended(RUNNING, 65, 12)  # permanent


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (RUNNING, DONE, ("ready", 95.0)),
        (RUNNING, RETRIED, ("failed", 30.0)),
        (RUNNING, FAILED, ("failed", 12.0)),
        # Nothing ended: still running, or a record read back after its end.
        (RUNNING, RUNNING, None),
        (DONE, DONE, None),
        (FAILED, FAILED, None),
        (None, DONE, None),
        # Another attempt (the next one after a retry): not the one in flight before.
        (_in_flight("r.io/y:1"), DONE, None),
    ],
)
def test_ended_import(
    before: ImageRecord | None, after: ImageRecord, expected: tuple[str, float] | None
) -> None:
    assert ended_import(before, after) == expected


def test_the_outcomes_are_told_apart_by_the_records_failure() -> None:
    assert RETRIED.failure is not None
    assert RETRIED.failure.kind is FailureKind.TRANSIENT
    assert FAILED.failure is not None
    assert FAILED.failure.kind is FailureKind.PERMANENT
    assert DONE.failure is None
    assert DONE.entry is not None


def _sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(f"slurmjob_operator_{name}", labels)


def test_import_seconds_are_observed_once_per_ended_import() -> None:
    metrics = Metrics()
    meter = CacheMeter(metrics)
    assert _sample(metrics, "image_import_seconds_count", outcome="ready") == 0
    assert _sample(metrics, "image_import_seconds_count", outcome="failed") == 0
    meter.written(RUNNING, DONE)
    meter.written(DONE, DONE)  # read back and written again (a later use): not again
    meter.written(RUNNING, RETRIED)
    assert _sample(metrics, "image_import_seconds_count", outcome="ready") == 1
    assert _sample(metrics, "image_import_seconds_sum", outcome="ready") == 95
    assert _sample(metrics, "image_import_seconds_bucket", outcome="ready", le="60.0") == 0
    assert _sample(metrics, "image_import_seconds_bucket", outcome="ready", le="120.0") == 1
    assert _sample(metrics, "image_import_seconds_count", outcome="failed") == 1
    CacheMeter(None).written(RUNNING, DONE)  # without metrics: nothing, no error


def test_cache_sizes_replace_the_previous_scopes() -> None:
    metrics = Metrics()
    metrics.images.set_sizes(summarise([A, B, PRIVATE]))
    assert _sample(metrics, "image_cache_bytes", scope="public") == 130
    assert _sample(metrics, "image_cache_entries", scope="public") == 2
    assert _sample(metrics, "image_cache_bytes", scope="tenant-team-a") == 7
    assert _sample(metrics, "image_cache_entries", scope="tenant-team-a") == 1
    metrics.images.set_sizes(summarise([B]))
    assert _sample(metrics, "image_cache_bytes", scope="public") == 30
    assert _sample(metrics, "image_cache_entries", scope="public") == 1
    # The tenant's entries are gone: its series too, not a stale 7.
    assert _sample(metrics, "image_cache_bytes", scope="tenant-team-a") is None
    assert _sample(metrics, "image_cache_entries", scope="tenant-team-a") is None
    metrics.images.set_sizes({})
    assert _sample(metrics, "image_cache_bytes", scope="public") is None


def test_the_sweeps_hook_sets_the_sizes_from_every_record() -> None:
    metrics = Metrics()
    CacheMeter(metrics).sizes([A, A_DIGEST, MOVED, PRIVATE])
    assert _sample(metrics, "image_cache_bytes", scope="public") == 170
    assert _sample(metrics, "image_cache_entries", scope="public") == 3
    assert _sample(metrics, "image_cache_entries", scope="tenant-team-a") == 1
    CacheMeter(None).sizes([A])  # without metrics: nothing, no error
