"""What the operator does next for one registry artifact's verification, from explicit
inputs only: the request (from the runtime registry), the operator's own record (None before
the first use), the clock, the site's policy, what the operator's `lstat` of the file shows
now (`FileSeen`, None when it is gone or unreadable), the verification job as the adapter
found it and its parsed result file. Like `decide` for imports, it returns an action carrying
the record to write *before* acting on it:

- `SubmitVerify(attempt)`: write the record (the attempt named, write-ahead), submit the job,
  then record the job id with `attempts.submitted`;
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

from slurmjob_operator.imagecache.attempts import (
    Ended,
    ImportJob,
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
from slurmjob_operator.imagecache.exits import (
    EXIT_CANT_CREATE,
    EXIT_DATA,
    EXIT_DENIED,
    EXIT_IO,
    EXIT_NOT_FOUND,
    EXIT_TEMPORARY,
    EXIT_USAGE,
    ExitClass,
)
from slurmjob_operator.imagecache.record import FailureKind, ImportAttempt
from slurmjob_operator.imagecache.resultfile import ctime_text
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


VERIFY_JOBS = JobKind("verification job", "VerifyLost", classify_verify_exit)


# kw_only: the cache user's uid has no default, and comes after the retry rules' defaults.
@dataclass(frozen=True, kw_only=True)
class VerifyPolicy(RetryPolicy):
    cache_uid: int


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
            return VerifyFailed(failure_message(f"runtime {record.runtime_id}", failure), record)
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
    attempt = next_attempt(record, now, verify_job_name)
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
    step = follow(record, job, result is not None, VERIFY_JOBS)
    if isinstance(step, Unconfirmed):
        return AdoptVerify(step.job_name, step.record)
    if isinstance(step, NeverSent):
        return _submit(step.record, now)
    if isinstance(step, Running):
        return WaitVerify(step.job_id, step.record)
    if isinstance(step, Ended):
        return _completed(step.record, now, policy, seen, result)
    return _failed(step.record, step.cause, now, policy)


def _completed(
    record: ArtifactRecord,
    now: datetime,
    policy: VerifyPolicy,
    seen: FileSeen | None,
    result: VerifyResult | None,
) -> VerifyAction:
    attempt = record.attempt
    assert attempt is not None
    expected = {"job": attempt.job_name, "format": record.format.value, "sha256": record.sha256}
    checked = VERIFY_JOBS.usable(attempt.job_name, result, expected)
    if isinstance(checked, ExitClass):
        return _failed(record, checked, now, policy)
    why = unsafe(checked.uid, checked.mode, policy)
    if why:
        text = f"the result file says the artifact's {why}"
        return _failed(record, ExitClass(_P, "ResultInvalid", text), now, policy)
    file = VerifiedFile(
        job_name=attempt.job_name,
        sha256=checked.sha256,
        size=checked.size,
        inode=checked.inode,
        ctime_ns=checked.ctime_ns,
        owner_uid=checked.uid,
        mode=checked.mode,
        verified_at=now,
    )
    diff = changes(file, seen)
    if diff:
        # Changed since the job looked, or the operator's mount is not the nodes' filesystem:
        # tried again, and refused for good if it keeps differing.
        text = f"the operator does not see the file {attempt.job_name} verified: {diff}"
        return _failed(record, ExitClass(_T, "ArtifactMoved", text), now, policy)
    updated = succeeded(record, now, {"state": VerifyState.VERIFIED, "verified": file})
    return Verified(file, updated)


def _failed(
    record: ArtifactRecord, cause: ExitClass, now: datetime, policy: VerifyPolicy
) -> VerifyFailed | VerifyLater:
    updated, failure = fail_attempt(record, cause, now, policy, VerifyState.FAILED)
    if failure.retry_at is not None:
        return VerifyLater(failure.retry_at, updated)
    return VerifyFailed(failure_message(f"runtime {updated.runtime_id}", failure), updated)
