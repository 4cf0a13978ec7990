"""What the operator does next for one registry artifact's verification, from explicit
inputs only: the request (from the runtime registry), the operator's own record (None before
the first use), the clock, the site's policy, what the operator's `lstat` of the file shows
now (`FileSeen`, None when it is gone or unreadable), the verification job as the adapter
found it and its parsed result file. Like `decide` for imports, it returns an action carrying
the record to write *before* acting on it:

- `SubmitVerify(attempt)`: write the record (the attempt named, write-ahead), submit the job,
  then record the job id with `verify_submitted`;
- `AdoptVerify(job name)`: a submit whose answer was lost: look the job up by that name;
- `WaitVerify(job id)`: the job runs; the SlurmJobs wait (`ArtifactVerifying`);
- `Verified(file)`: the SlurmJobs run with the cheap check of `file`;
- `VerifyFailed(message)`: the waiting SlurmJobs fail (`ArtifactVerifyFailed`);
- `VerifyLater(at)`: a transient failure; decide again at `at`.

A verified file is compared with what the operator sees at every decision: any difference
(owner, mode, size, inode, ctime, a link or a missing file) drops the verification and
submits a new job. Never a pass on a file that is not the one verified.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmjob_operator.imagecache.decide import ImportJob, JobState
from slurmjob_operator.imagecache.exits import (
    EXIT_CANT_CREATE,
    EXIT_DATA,
    EXIT_DENIED,
    EXIT_IO,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TEMPORARY,
    EXIT_USAGE,
    ExitClass,
)
from slurmjob_operator.imagecache.record import (
    MAX_MESSAGE,
    Failure,
    FailureKind,
    ImportAttempt,
    ctime_text,
)
from slurmjob_operator.imagecache.verifyrecord import (
    GROUP_OTHER_WRITE,
    ArtifactRecord,
    VerifiedFile,
    VerifyResult,
    VerifyState,
    artifact_key,
    verify_job_name,
)
from slurmjob_operator.site.catalogs import ArtifactFormat

# What the SlurmJob's `ImageReady` condition says (core/reasons.py declares them).
REASON_VERIFYING = "ArtifactVerifying"
REASON_FAILED = "ArtifactVerifyFailed"
REASON_VERIFIED = "ArtifactVerified"

_P, _T = FailureKind.PERMANENT, FailureKind.TRANSIENT
#: The verification script's exit codes (templates/image/verify.sh.j2, sysexits numbers).
VERIFY_EXIT_CLASSES: dict[int, ExitClass] = {
    EXIT_USAGE: ExitClass(_P, "VerifyUsage", "the verification was misconfigured"),
    EXIT_DATA: ExitClass(
        _P, "ArtifactMismatch", "the file is not the registry's artifact (its magic or sha256)"
    ),
    EXIT_NOT_FOUND: ExitClass(_P, "ArtifactMissing", "the file is missing on the node"),
    EXIT_CANT_CREATE: ExitClass(_T, "VerifyUnwritable", "the cache refused the result file"),
    EXIT_IO: ExitClass(_T, "VerifyIOError", "an I/O error while reading or recording the file"),
    EXIT_TEMPORARY: ExitClass(_T, "ArtifactChanging", "the file changed while it was verified"),
    EXIT_DENIED: ExitClass(
        _P,
        "ArtifactUnsafe",
        "the file is a link or not a regular file, or others than root and its owner (root or "
        "the cache user) may change it or its directory",
    ),
}


def classify_verify_exit(exit_code: int | None) -> ExitClass:
    """A failed verification job's class by its exit code (None: no code of the script's: a
    node failure, a time limit, a cancel)."""
    if exit_code is None:
        return ExitClass(_T, "VerifyInterrupted", "the verification job ended early")
    known = VERIFY_EXIT_CLASSES.get(exit_code)
    if known is not None:
        return known
    return ExitClass(_T, "VerifyFailed", f"exit code {exit_code}")


@dataclass(frozen=True)
class VerifyRequest:
    """A registry artifact a SlurmJob runs, as the runtime registry names it."""

    runtime_id: str
    sha256: str
    #: The artifact as the compute nodes see it.
    path: str
    format: ArtifactFormat

    @property
    def key(self) -> str:
        return artifact_key(self.runtime_id, self.sha256, self.path)


@dataclass(frozen=True)
class FileSeen:
    """The artifact as the operator's `lstat` shows it (its storage mount)."""

    regular: bool
    uid: int
    mode: int
    size: int
    inode: int
    ctime_ns: int


@dataclass(frozen=True)
class VerifyPolicy:
    cache_uid: int
    max_retries: int = 3
    backoff_seconds: float = 60.0
    backoff_max_seconds: float = 3600.0
    #: How long a failed record fails new SlurmJobs at once before it is verified again.
    failure_reuse_seconds: float = 600.0

    def backoff(self, retries: int) -> float:
        return float(min(self.backoff_max_seconds, self.backoff_seconds * 2 ** min(retries, 30)))


@dataclass(frozen=True)
class SubmitVerify:
    attempt: ImportAttempt
    record: ArtifactRecord
    #: Why a record that was verified is verified again ('' otherwise).
    why: str = ""


@dataclass(frozen=True)
class AdoptVerify:
    job_name: str
    record: ArtifactRecord


@dataclass(frozen=True)
class WaitVerify:
    job_id: int
    record: ArtifactRecord


@dataclass(frozen=True)
class Verified:
    file: VerifiedFile
    record: ArtifactRecord


@dataclass(frozen=True)
class VerifyFailed:
    message: str
    record: ArtifactRecord


@dataclass(frozen=True)
class VerifyLater:
    at: datetime
    record: ArtifactRecord


VerifyAction = SubmitVerify | AdoptVerify | WaitVerify | Verified | VerifyFailed | VerifyLater


def unsafe(uid: int, mode: int, policy: VerifyPolicy) -> str:
    """Why a file (or directory) of owner `uid` and `mode` cannot be trusted to stay what was
    verified ('' when it can): its owner must be root or the cache user, and neither its
    group nor others may write it (with an ACL, the group bits are the ACL's mask)."""
    if uid not in (0, policy.cache_uid):
        return f"owner uid {uid} is neither root nor the cache user ({policy.cache_uid})"
    if mode & GROUP_OTHER_WRITE:
        return f"mode {mode:o} lets its group or others write it"
    return ""


def changes(file: VerifiedFile, seen: FileSeen | None) -> str:
    """What differs between the verified file and what the operator sees ('' when nothing)."""
    if seen is None:
        return "the file is gone or unreadable"
    if not seen.regular:
        return "the path is no longer a regular file"
    pairs = (
        ("owner", str(file.owner_uid), str(seen.uid)),
        ("mode", f"{file.mode:o}", f"{seen.mode:o}"),
        ("size", str(file.size), str(seen.size)),
        ("inode", str(file.inode), str(seen.inode)),
        ("ctime", ctime_text(file.ctime_ns), ctime_text(seen.ctime_ns)),
    )
    return ", ".join(f"{name} {was} is now {now}" for name, was, now in pairs if was != now)


def new_artifact_record(request: VerifyRequest, now: datetime) -> ArtifactRecord:
    return ArtifactRecord(
        key=request.key,
        epoch=int(now.timestamp()),
        runtime_id=request.runtime_id,
        sha256=request.sha256,
        path=request.path,
        format=request.format,
        state=VerifyState.VERIFYING,
    )


def verify_submitted(record: ArtifactRecord, job_id: int) -> ArtifactRecord:
    """The record once the submit (or the lookup by name) answered `job_id`."""
    if record.attempt is None:
        raise ValueError(f"record {record.key} has no attempt")
    attempt = record.attempt.model_copy(update={"job_id": job_id, "write_ahead": False})
    return record.model_copy(update={"attempt": attempt})


def decide_verify(
    request: VerifyRequest,
    record: ArtifactRecord | None,
    now: datetime,
    policy: VerifyPolicy,
    seen: FileSeen | None,
    job: ImportJob | None = None,
    result: VerifyResult | None = None,
) -> VerifyAction:
    """The next action for `request`; see the module's docstring."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if record is None:
        return _submit(new_artifact_record(request, now), now)
    wanted = (request.key, request.runtime_id, request.sha256, request.path, request.format)
    if (record.key, record.runtime_id, record.sha256, record.path, record.format) != wanted:
        raise ValueError(f"record {record.key} is not the record of runtime {request.runtime_id}")
    if record.in_flight:
        return _in_flight(record, now, policy, seen, job, result)
    failure = record.failure
    if record.state is VerifyState.FAILED and failure is not None:
        if now < failure.at + timedelta(seconds=policy.failure_reuse_seconds):
            return VerifyFailed(_message(record, failure), record)
        return _submit(record.model_copy(update={"failure": None, "retries": 0}), now)
    if failure is not None and failure.retry_at is not None:
        if now < failure.retry_at:
            return VerifyLater(failure.retry_at, record)
        return _submit(record, now)
    if record.verified is not None:
        diff = changes(record.verified, seen)
        if not diff:
            return Verified(record.verified, record)
        # Replaced, touched or gone since: the verification no longer holds. Never a pass.
        dropped = record.model_copy(update={"verified": None, "state": VerifyState.VERIFYING})
        return _submit(dropped, now, f"the file changed since it was verified: {diff}")
    return _submit(record, now)


def _submit(record: ArtifactRecord, now: datetime, why: str = "") -> SubmitVerify:
    number = record.attempt.number + 1 if record.attempt is not None else 1
    attempt = ImportAttempt(
        number=number,
        job_name=verify_job_name(record.key, record.epoch, number),
        submitted_at=now,
    )
    updated = record.model_copy(update={"attempt": attempt, "state": VerifyState.VERIFYING})
    return SubmitVerify(attempt, updated, why)


def _in_flight(
    record: ArtifactRecord,
    now: datetime,
    policy: VerifyPolicy,
    seen: FileSeen | None,
    job: ImportJob | None,
    result: VerifyResult | None,
) -> VerifyAction:
    attempt = record.attempt
    assert attempt is not None
    if job is not None and job.name != attempt.job_name:
        raise ValueError(f"job {job.name} is not the record's attempt {attempt.job_name}")
    if attempt.job_id is None:
        if job is not None and job.job_id is not None:
            record = verify_submitted(record, job.job_id)  # found by its name: adopted
        elif job is not None and job.state is JobState.ABSENT:
            # Proven absent: this attempt never reached Slurm. The next has another name.
            return _submit(record, now)
        else:
            return AdoptVerify(attempt.job_name, record)
    assert record.attempt is not None
    assert record.attempt.job_id is not None
    job_id = record.attempt.job_id
    if job is None or job.state in (JobState.PENDING, JobState.RUNNING):
        return WaitVerify(job_id, record)
    if job.state is JobState.COMPLETED and job.exit_code in (None, EXIT_OK):
        return _completed(record, now, policy, seen, result)
    if job.state is JobState.ABSENT:
        if result is not None:
            return _completed(record, now, policy, seen, result)
        text = f"verification job {job_id} is gone without a final state or a result"
        return _failed(record, _T, "VerifyLost", text, now, policy)
    cause = classify_verify_exit(job.exit_code)
    text = f"verification job {job_id}: {cause.text}"
    if job.exit_code is not None:
        text += f" (exit code {job.exit_code})"
    return _failed(record, cause.kind, cause.reason, text, now, policy)


def _completed(
    record: ArtifactRecord,
    now: datetime,
    policy: VerifyPolicy,
    seen: FileSeen | None,
    result: VerifyResult | None,
) -> VerifyAction:
    attempt = record.attempt
    assert attempt is not None
    if result is None:
        text = f"verification job {attempt.job_name} ended without a result file"
        return _failed(record, _T, "ResultMissing", text, now, policy)
    problem = _result_problem(record, attempt, policy, result)
    if problem:
        return _failed(record, _P, "ResultInvalid", problem, now, policy)
    file = VerifiedFile(
        job_name=attempt.job_name,
        sha256=result.sha256,
        size=result.size,
        inode=result.inode,
        ctime_ns=result.ctime_ns,
        owner_uid=result.uid,
        mode=result.mode,
        verified_at=now,
    )
    diff = changes(file, seen)
    if diff:
        # Changed since the job looked, or the operator's mount is not the nodes' filesystem:
        # tried again, and refused for good if it keeps differing.
        text = f"the operator does not see the file {attempt.job_name} verified: {diff}"
        return _failed(record, _T, "ArtifactMoved", text, now, policy)
    updated = record.model_copy(
        update={
            "state": VerifyState.VERIFIED,
            "verified": file,
            "failure": None,
            "retries": 0,
            "attempt": attempt.model_copy(update={"ended_at": now}),
        }
    )
    return Verified(file, updated)


def _result_problem(
    record: ArtifactRecord, attempt: ImportAttempt, policy: VerifyPolicy, result: VerifyResult
) -> str:
    expected = {
        "job": attempt.job_name,
        "format": record.format.value,
        "sha256": record.sha256,
    }
    for field, want in expected.items():
        got = str(getattr(result, field))
        if got != want:
            return f"the result file says {field} {got}, expected {want}"
    why = unsafe(result.uid, result.mode, policy)
    return f"the result file says the artifact's {why}" if why else ""


def _failed(
    record: ArtifactRecord,
    kind: FailureKind,
    reason: str,
    message: str,
    now: datetime,
    policy: VerifyPolicy,
) -> VerifyFailed | VerifyLater:
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
        return VerifyLater(retry_at, updated)
    if kind is FailureKind.TRANSIENT:
        suffix = f" (gave up after {record.retries} retries)"
        message = message[: MAX_MESSAGE - len(suffix)] + suffix
    failure = Failure(kind=kind, reason=reason, message=message, at=now)
    updated = record.model_copy(
        update={"state": VerifyState.FAILED, "failure": failure, "attempt": ended}
    )
    return VerifyFailed(_message(updated, failure), updated)


def _message(record: ArtifactRecord, failure: Failure) -> str:
    return f"runtime {record.runtime_id}: {failure.reason}: {failure.message}"[:MAX_MESSAGE]
