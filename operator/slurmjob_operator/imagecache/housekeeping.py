"""The cache's housekeeping job, as the operator keeps account of it: its state (one object the
operator owns, like the records) and the report the job writes.

The pod only reads the cache, so deleting evicted entries, removing what no record names (an
import's leftovers, a file published by an import whose record was lost) and checking that
every recorded entry is still there are done by a job of the cache user
(`templates/image/sweep.sh.j2`). One such job at a time: its unique name is recorded before
it is submitted (the write-ahead), and a lost answer is found again by that name.

The report is read from a file the job wrote on the shared storage: parsed strictly (a fixed
set of `key=value` lines, bounded), and a `missing=` path counts only if it is an entry path
of this cache (`CacheLayout.is_entry_path`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import AwareDatetime, Field, field_validator

from slurmjob_operator.api.model import Model
from slurmjob_operator.core.jobview import JobId
from slurmjob_operator.imagecache.layout import CacheLayout, is_safe_word

SCHEMA_VERSION = 1
SWEEP_JOB_PREFIX = "slurmjob-image-sweep-"
MAX_REPORT_BYTES = 64 * 1024
#: Missing entries a report may name; more are found by the next check.
MAX_MISSING = 256
_DIGITS = frozenset("0123456789")


class ReportError(ValueError):
    """The housekeeping job's report is unusable; the message says why."""


class SweepReport(Model):
    """What one housekeeping job did and saw."""

    job: str = Field(max_length=200)
    #: Bytes and files under the cache's entries once it was done.
    bytes: int = Field(ge=0)
    files: int = Field(ge=0)
    #: Entries it deleted (evicted), files no record named, leftover import directories.
    deleted: int = Field(ge=0)
    orphans: int = Field(ge=0)
    leftovers: int = Field(ge=0)
    #: Recorded entries that were not there (forgotten at the next sweep).
    missing: list[str] = Field(default_factory=list, max_length=MAX_MISSING)


class SweepState(Model):
    """The housekeeping job in flight (if any) and what the last one reported."""

    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    #: Jobs submitted so far: part of the next one's name.
    count: int = Field(default=0, ge=0)
    job_name: str | None = Field(default=None, max_length=200)
    job_id: JobId | None = None
    submitted_at: AwareDatetime | None = None
    #: When the last job's outcome was recorded, and what it reported (None: no report).
    ended_at: AwareDatetime | None = None
    report: SweepReport | None = None
    #: Why the last job gave no report (its state and exit code), shown by `doctor`.
    problem: str | None = Field(default=None, max_length=1024)
    #: Entries evicted by the operator's records so far (their files go with the next job).
    evicted: int = Field(default=0, ge=0)
    #: The first sweep's time: the first check is due an interval after it, not at start.
    since: AwareDatetime | None = None

    @field_validator("job_name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not is_safe_word(value):
            raise ValueError(f"job name {value!r} is not a safe word")
        return value

    @property
    def in_flight(self) -> bool:
        return self.job_name is not None

    def submitting(self, now: datetime) -> SweepState:
        """The write-ahead of the next job."""
        name = f"{SWEEP_JOB_PREFIX}{int(now.timestamp())}-{self.count + 1}"
        return self.model_copy(
            update={"count": self.count + 1, "job_name": name, "job_id": None, "submitted_at": now}
        )

    def ended(self, now: datetime, report: SweepReport | None, problem: str | None) -> SweepState:
        return self.model_copy(
            update={
                "job_name": None,
                "job_id": None,
                "ended_at": now,
                "report": report if report is not None else self.report,
                "problem": problem,
            }
        )


def check_due(state: SweepState, now: datetime, every_seconds: float) -> bool:
    """Whether a housekeeping job is due for its check alone (nothing to evict)."""
    last = state.ended_at or state.submitted_at or state.since
    return last is None or now - last >= timedelta(seconds=every_seconds)


def _number(key: str, value: str) -> int:
    if not value or len(value) > 20 or not set(value) <= _DIGITS:
        raise ReportError(f"report: {key} {value[:40]!r} is not a number")
    return int(value)


_NUMBERS = ("bytes", "files", "deleted", "orphans", "leftovers")


def parse_report(data: bytes, layout: CacheLayout, job_name: str) -> SweepReport:
    """The job's report: `job=`, each of `bytes`, `files`, `deleted`, `orphans`,
    `leftovers` once, and `missing=<entry path>` lines; a `ReportError` otherwise."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report: more than {MAX_REPORT_BYTES} bytes")
    try:
        lines = data.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise ReportError("report: not ASCII") from None
    if lines and lines[-1] == "":
        lines.pop()
    values: dict[str, str] = {}
    missing: list[str] = []
    for number, line in enumerate(lines, 1):
        key, equals, value = line.partition("=")
        if not equals:
            raise ReportError(f"report line {number}: not key=value")
        if key == "missing":
            if not layout.is_entry_path(value):
                raise ReportError(f"report line {number}: not an entry of this cache")
            if len(missing) < MAX_MISSING:
                missing.append(value)
            continue
        if key not in ("job", *_NUMBERS) or key in values:
            raise ReportError(f"report line {number}: unexpected or repeated key")
        values[key] = value
    if values.get("job") != job_name:
        raise ReportError(f"report: not the report of {job_name}")
    absent = [key for key in _NUMBERS if key not in values]
    if absent:
        raise ReportError(f"report: missing {', '.join(absent)}")
    numbers = {key: _number(key, values[key]) for key in _NUMBERS}
    return SweepReport(job=job_name, missing=missing, **numbers)
