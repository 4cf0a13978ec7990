"""What the image cache's metrics report, from the operator's records only: the bytes and
entries each scope holds, and how long an import that just ended took.

Pure: no I/O, no metrics library (`imagecache.meter` and `metrics.Metrics` set the series).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from slurmjob_operator.imagecache.evict import cached_files
from slurmjob_operator.imagecache.record import ImageRecord

ImportOutcome = Literal["ready", "failed"]


def summarise(records: Iterable[ImageRecord]) -> dict[str, tuple[int, int]]:
    """Bytes and entries (cache files) per scope. A file named by several records (two tags
    of one digest, a tag's retired entry) is one file on the disk, so it counts once, as
    eviction counts it (`evict.cached_files`); scopes without a file are left out."""
    per_scope: dict[str, tuple[int, int]] = {}
    for file in cached_files(records):
        size, count = per_scope.get(file.scope, (0, 0))
        per_scope[file.scope] = (size + file.size, count + 1)
    return per_scope


def ended_import(
    before: ImageRecord | None, after: ImageRecord
) -> tuple[ImportOutcome, float] | None:
    """How the import `before` had in flight ended, if `after` records its end: `ready` or
    `failed` (a failure retried later included), and its seconds from the write-ahead to the
    recorded end. None when nothing ended between the two: the same attempt is compared by its
    unique job name, so a record read back after its end never counts the import again."""
    if before is None or not before.in_flight or before.attempt is None:
        return None
    attempt = after.attempt
    if attempt is None or attempt.job_name != before.attempt.job_name or attempt.ended_at is None:
        return None
    outcome: ImportOutcome = "failed" if after.failure is not None else "ready"
    return outcome, max(0.0, (attempt.ended_at - attempt.submitted_at).total_seconds())
