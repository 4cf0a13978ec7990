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
from enum import StrEnum

from slurmjob_operator.imagecache.exits import EXIT_OK, classify_exit
from slurmjob_operator.imagecache.layout import (
    CacheLayout,
    import_job_name,
)
from slurmjob_operator.imagecache.record import (
    MAX_MESSAGE,
    MAX_RETIRED,
    PLATFORM,
    Entry,
    Failure,
    FailureKind,
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


@dataclass(frozen=True)
class ImportPolicy:
    """The site's rules for imports (seconds; `config.images` holds the settings)."""

    tag_reuse_seconds: float = 600.0
    max_retries: int = 3
    backoff_seconds: float = 60.0
    backoff_max_seconds: float = 3600.0
    #: How long a failed record fails new SlurmJobs at once before a new import is tried.
    failure_reuse_seconds: float = 600.0
    platform: str = PLATFORM

    def backoff(self, retries: int) -> float:
        return float(min(self.backoff_max_seconds, self.backoff_seconds * 2 ** min(retries, 30)))


class JobState(StrEnum):
    """An import job as the adapter normalised it."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"  # any other final state; exit_code None without the script's code
    ABSENT = "absent"  # proven absent (write-ahead), or gone without a final state


@dataclass(frozen=True)
class ImportJob:
    name: str
    state: JobState
    job_id: int | None = None
    exit_code: int | None = None


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
    )


def submitted(record: ImageRecord, job_id: int) -> ImageRecord:
    """The record once the submit (or the lookup by name) answered `job_id`."""
    if record.attempt is None:
        raise ValueError(f"record {record.key} has no attempt")
    attempt = record.attempt.model_copy(update={"job_id": job_id, "write_ahead": False})
    return record.model_copy(update={"attempt": attempt})


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
            return Fail(REASON_FAILED, _message(record, failure), record)
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
    number = record.attempt.number + 1 if record.attempt is not None else 1
    attempt = ImportAttempt(
        number=number,
        job_name=import_job_name(record.key, record.epoch, number),
        submitted_at=now,
    )
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
    attempt = record.attempt
    assert attempt is not None
    if job is not None and job.name != attempt.job_name:
        raise ValueError(f"job {job.name} is not the record's attempt {attempt.job_name}")
    if attempt.job_id is None:
        if job is not None and job.job_id is not None:
            record = submitted(record, job.job_id)  # found by its name: adopted
        elif job is not None and job.state is JobState.ABSENT:
            # Proven absent: this attempt never reached Slurm. The next has another name.
            return _submit(record, request, now, policy)
        else:
            return AdoptImport(attempt.job_name, record)
    assert record.attempt is not None
    assert record.attempt.job_id is not None
    job_id = record.attempt.job_id
    if job is None or job.state in (JobState.PENDING, JobState.RUNNING):
        return WaitImport(job_id, record)
    if job.state is JobState.COMPLETED and job.exit_code in (None, EXIT_OK):
        return _completed(record, request, now, policy, layout, result)
    if job.state is JobState.ABSENT:
        if result is not None:
            return _completed(record, request, now, policy, layout, result)
        return _failed(
            record,
            FailureKind.TRANSIENT,
            "ImportLost",
            f"import job {job_id} is gone without a final state or a result",
            now,
            policy,
        )
    cause = classify_exit(job.exit_code)
    text = f"import job {job_id}: {cause.text}"
    if job.exit_code is not None:
        text += f" (exit code {job.exit_code})"
    return _failed(record, cause.kind, cause.reason, text, now, policy)


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
    if result is None:
        return _failed(
            record,
            FailureKind.TRANSIENT,
            "ResultMissing",
            f"import job {attempt.job_name} ended without a result file",
            now,
            policy,
        )
    problem = _result_problem(record, request, attempt, policy, result)
    if problem:
        return _failed(record, FailureKind.PERMANENT, "ResultInvalid", problem, now, policy)
    entry = Entry(
        digest=result.digest,
        sha256=result.sha256,
        size=result.size,
        inode=result.inode,
        ctime_ns=result.ctime_ns,
        path=str(layout.entry_path(record.scope, result.digest, record.format)),
        published_at=now,
    )
    # A moved tag leaves its old entry to the jobs still using it and to eviction.
    retired = [e for e in record.retired if e.path != entry.path]
    old = record.entry
    if old is not None and old.path != entry.path:
        retired.append(old.model_copy(update={"retired_at": now}))
    updated = record.model_copy(
        update={
            "state": RecordState.READY,
            "entry": entry,
            "retired": retired[-MAX_RETIRED:],
            "resolved": Resolved(digest=result.digest, at=now),
            "failure": None,
            "retries": 0,
            "attempt": attempt.model_copy(update={"ended_at": now}),
        }
    )
    return Ready(entry, updated)


def _result_problem(
    record: ImageRecord,
    request: ImageRequest,
    attempt: ImportAttempt,
    policy: ImportPolicy,
    result: ImportResult,
) -> str:
    expected = {
        "job": attempt.job_name,
        "reference": record.reference,
        "format": record.format.value,
        "platform": policy.platform,
    }
    if request.reference.digest is not None:
        expected["digest"] = request.reference.digest
    for field, want in expected.items():
        got = str(getattr(result, field))
        if got != want:
            return f"the result file says {field} {got}, expected {want}"
    return ""


def _failed(
    record: ImageRecord,
    kind: FailureKind,
    reason: str,
    message: str,
    now: datetime,
    policy: ImportPolicy,
) -> Fail | RetryLater:
    attempt = record.attempt
    assert attempt is not None
    ended = attempt.model_copy(update={"ended_at": now})
    message = message[:MAX_MESSAGE]
    if kind is FailureKind.TRANSIENT and record.retries < policy.max_retries:
        retry_at = now + timedelta(seconds=policy.backoff(record.retries))
        failure = Failure(kind=kind, reason=reason, message=message, at=now, retry_at=retry_at)
        updated = record.model_copy(
            update={"failure": failure, "retries": record.retries + 1, "attempt": ended}
        )
        return RetryLater(retry_at, updated)
    if kind is FailureKind.TRANSIENT:
        suffix = f" (gave up after {record.retries} retries)"
        message = message[: MAX_MESSAGE - len(suffix)] + suffix
    failure = Failure(kind=kind, reason=reason, message=message, at=now)
    updated = record.model_copy(
        update={"state": RecordState.FAILED, "failure": failure, "attempt": ended}
    )
    return Fail(REASON_FAILED, _message(updated, failure), updated)


def _message(record: ImageRecord, failure: Failure) -> str:
    return f"{record.reference}: {failure.reason}: {failure.message}"[:MAX_MESSAGE]
