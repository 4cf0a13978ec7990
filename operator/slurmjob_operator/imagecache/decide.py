"""What the operator does next for one image record, from explicit inputs only.

`decide(request, record, now, policy, layout, job, result)` reads the operator's own record
(None before the first use), the clock, the site's policy, the import job as the adapter
found it (`ImportJob`, None when not looked up) and the parsed result file, and returns an
action carrying the record to write *before* acting on it:

- `SubmitImport(attempt)`: write the record (the attempt named, write-ahead), then submit,
  then record the job id with `submitted`;
- `AdoptImport(job name)`: a submit whose answer was lost; look the job up by that name and
  decide again with what was found (`JobState.ABSENT` only once absence is proven:
  `core.absence`). It is never sent twice: a new attempt has a new name;
- `WaitImport(job id)`: poll the job; the SlurmJobs wait (`ImagePulling`);
- `Ready(entry)`: the SlurmJobs may use the entry;
- `Fail(reason, message)`: the waiting SlurmJobs fail (`ImagePullFailed`);
- `RetryLater(at)`: a transient failure; decide again at `at`.

The import script's exit codes (sysexits) say which failures are permanent: see
`EXIT_CLASSES`. An exit without a code of the script's (a node failure, a timeout, a
cancel) and any code not listed is transient.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmjob_operator.imagecache.attempts import (
    Ended,
    JobKind,
    NeverSent,
    RetryPolicy,
    Running,
    Unconfirmed,
    fail_attempt,
    failure_message,
    follow,
    next_attempt,
    succeeded,
)

# Re-exported: the import's decision is where its callers and tests have found these.
from slurmjob_operator.imagecache.attempts import ImportJob as ImportJob
from slurmjob_operator.imagecache.attempts import JobState as JobState
from slurmjob_operator.imagecache.attempts import submitted as submitted
from slurmjob_operator.imagecache.exits import ExitClass, classify_exit
from slurmjob_operator.imagecache.layout import (
    CacheLayout,
    import_job_name,
)
from slurmjob_operator.imagecache.record import (
    MAX_RETIRED,
    PLATFORM,
    Entry,
    ImageRecord,
    ImportAttempt,
    ImportResult,
    RecordState,
    Resolved,
)
from slurmjob_operator.imagecache.request import ImageRequest

#: The SlurmJob condition and its reasons.
CONDITION = "ImageReady"
REASON_READY = "ImageCached"
REASON_PULLING = "ImagePulling"
REASON_FAILED = "ImagePullFailed"
IMPORT_JOBS = JobKind("import job", "ImportLost", classify_exit)


@dataclass(frozen=True)
class ImportPolicy(RetryPolicy):
    """The site's rules for imports (seconds; `config.images` holds the settings)."""

    tag_reuse_seconds: float = 600.0
    platform: str = PLATFORM


@dataclass(frozen=True)
class SubmitImport:
    attempt: ImportAttempt
    record: ImageRecord


@dataclass(frozen=True)
class AdoptImport:
    job_name: str
    record: ImageRecord


@dataclass(frozen=True)
class WaitImport:
    job_id: int
    record: ImageRecord


@dataclass(frozen=True)
class Ready:
    entry: Entry
    record: ImageRecord


@dataclass(frozen=True)
class Fail:
    reason: str
    message: str
    record: ImageRecord


@dataclass(frozen=True)
class RetryLater:
    at: datetime
    record: ImageRecord


Action = SubmitImport | AdoptImport | WaitImport | Ready | Fail | RetryLater


@dataclass(frozen=True)
class ImageCondition:
    """The SlurmJob's `ImageReady` condition for an action."""

    ready: bool
    reason: str
    message: str


def new_record(request: ImageRequest, now: datetime) -> ImageRecord:
    return ImageRecord(
        key=request.key,
        epoch=int(now.timestamp()),
        scope=request.scope,
        reference=request.reference.canonical,
        format=request.format,
        state=RecordState.IMPORTING if request.reference.is_digest else RecordState.RESOLVING,
        charged=request.charged if request.charged != request.scope else None,
    )


def image_condition(action: Action) -> ImageCondition:
    if isinstance(action, Ready):
        return ImageCondition(True, REASON_READY, f"{action.record.reference} is cached")
    if isinstance(action, Fail):
        return ImageCondition(False, REASON_FAILED, action.message)
    return ImageCondition(False, REASON_PULLING, f"{action.record.reference} is being imported")


def decide(
    request: ImageRequest,
    record: ImageRecord | None,
    now: datetime,
    policy: ImportPolicy,
    layout: CacheLayout,
    job: ImportJob | None = None,
    result: ImportResult | None = None,
) -> Action:
    """The next action for `request`; see the module's docstring."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if record is None:
        return _submit(new_record(request, now), request, now, policy)
    if (record.key, record.scope, record.reference, record.format) != (
        request.key,
        request.scope,
        request.reference.canonical,
        request.format,
    ):
        raise ValueError(f"record {record.key} is not the record of {request.reference}")
    if record.in_flight:
        return _in_flight(request, record, now, policy, layout, job, result)
    failure = record.failure
    if record.state is RecordState.FAILED and failure is not None:
        if now < failure.at + timedelta(seconds=policy.failure_reuse_seconds):
            return Fail(REASON_FAILED, failure_message(record.reference, failure), record)
        fresh_start = record.model_copy(update={"failure": None, "retries": 0})
        return _submit(fresh_start, request, now, policy)
    if failure is not None and failure.retry_at is not None:
        if now < failure.retry_at:
            return RetryLater(failure.retry_at, record)
        return _submit(record, request, now, policy)
    if record.entry is not None and _fresh(record, request, now, policy):
        return Ready(record.entry, record)
    return _submit(record, request, now, policy)


def _fresh(record: ImageRecord, request: ImageRequest, now: datetime, p: ImportPolicy) -> bool:
    """Whether the record's digest answer stands: a digest names itself for ever, a tag's
    answer for `tag_reuse_seconds` after it was resolved."""
    if request.reference.is_digest:
        return True
    resolved = record.resolved
    return resolved is not None and now < resolved.at + timedelta(seconds=p.tag_reuse_seconds)


def _working_state(
    record: ImageRecord, request: ImageRequest, now: datetime, policy: ImportPolicy
) -> RecordState:
    # Resolving: the import must first find what a tag names now; Importing: it is known.
    fresh = _fresh(record, request, now, policy)
    return RecordState.IMPORTING if fresh else RecordState.RESOLVING


def _submit(
    record: ImageRecord, request: ImageRequest, now: datetime, policy: ImportPolicy
) -> SubmitImport:
    attempt = next_attempt(record, now, import_job_name)
    state = _working_state(record, request, now, policy)
    return SubmitImport(attempt, record.model_copy(update={"attempt": attempt, "state": state}))


def _in_flight(
    request: ImageRequest,
    record: ImageRecord,
    now: datetime,
    policy: ImportPolicy,
    layout: CacheLayout,
    job: ImportJob | None,
    result: ImportResult | None,
) -> Action:
    step = follow(record, job, result is not None, IMPORT_JOBS)
    if isinstance(step, Unconfirmed):
        return AdoptImport(step.job_name, step.record)
    if isinstance(step, NeverSent):
        return _submit(step.record, request, now, policy)
    if isinstance(step, Running):
        return WaitImport(step.job_id, step.record)
    if isinstance(step, Ended):
        return _completed(step.record, request, now, policy, layout, result)
    return _failed(step.record, step.cause, now, policy)


def _completed(
    record: ImageRecord,
    request: ImageRequest,
    now: datetime,
    policy: ImportPolicy,
    layout: CacheLayout,
    result: ImportResult | None,
) -> Action:
    attempt = record.attempt
    assert attempt is not None
    expected = {
        "job": attempt.job_name,
        "reference": record.reference,
        "format": record.format.value,
        "platform": policy.platform,
    }
    if request.reference.digest is not None:
        expected["digest"] = request.reference.digest
    checked = IMPORT_JOBS.usable(attempt.job_name, result, expected)
    if isinstance(checked, ExitClass):
        return _failed(record, checked, now, policy)
    entry = Entry(
        digest=checked.digest,
        sha256=checked.sha256,
        size=checked.size,
        inode=checked.inode,
        ctime_ns=checked.ctime_ns,
        path=str(layout.entry_path(record.scope, checked.digest, record.format)),
        published_at=now,
    )
    # A moved tag leaves its old entry to the jobs still using it and to eviction.
    retired = [e for e in record.retired if e.path != entry.path]
    old = record.entry
    if old is not None and old.path != entry.path:
        retired.append(old.model_copy(update={"retired_at": now}))
    update = {
        "state": RecordState.READY,
        "entry": entry,
        "retired": retired[-MAX_RETIRED:],
        "resolved": Resolved(digest=checked.digest, at=now),
    }
    return Ready(entry, succeeded(record, now, update))


def _failed(
    record: ImageRecord, cause: ExitClass, now: datetime, policy: ImportPolicy
) -> Fail | RetryLater:
    updated, failure = fail_attempt(record, cause, now, policy, RecordState.FAILED)
    if failure.retry_at is not None:
        return RetryLater(failure.retry_at, updated)
    return Fail(REASON_FAILED, failure_message(updated.reference, failure), updated)
