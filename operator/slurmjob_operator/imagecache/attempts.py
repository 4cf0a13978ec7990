"""What an image's import and an artifact's verification share: a job of the cache user,
named and recorded before it is submitted (the write-ahead), adopted by its name when the
submit's answer was lost, followed until it ends, and a failure of it retried after a backoff
or recorded for good. `decide` and `verifydecide` keep what differs: their records' other
fields, their actions and what a good result is. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, Protocol, Self, TypeVar

from slurmjob_operator.imagecache.exits import EXIT_OK, ExitClass
from slurmjob_operator.imagecache.record import MAX_MESSAGE, Failure, FailureKind, ImportAttempt
from slurmjob_operator.imagecache.resultfile import mismatch


class JobState(StrEnum):
    """A job of the cache user (an import, a verification) as the adapter normalised it."""

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
class RetryPolicy:
    """The site's rules for a job that failed (seconds; `config.images` holds the settings)."""

    max_retries: int = 3
    backoff_seconds: float = 60.0
    backoff_max_seconds: float = 3600.0
    #: How long a failed record fails new SlurmJobs at once before a new attempt is tried.
    failure_reuse_seconds: float = 600.0

    def backoff(self, retries: int) -> float:
        return float(min(self.backoff_max_seconds, self.backoff_seconds * 2 ** min(retries, 30)))


class AttemptRecord(Protocol):
    """What the records of both (`ImageRecord`, `ArtifactRecord`) keep of their jobs."""

    @property
    def key(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def attempt(self) -> ImportAttempt | None: ...

    @property
    def failure(self) -> Failure | None: ...

    @property
    def retries(self) -> int: ...

    # pydantic's own: the helpers below return the record of the type they were given.
    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> Self: ...


R = TypeVar("R", bound=AttemptRecord)
T = TypeVar("T")


@dataclass(frozen=True)
class JobKind:
    """One kind of job: what its messages call it, the reason of one gone without a trace,
    and the classes of its script's exit codes. A failure's cause is an `ExitClass` (its
    kind, reason and message) whether or not an exit code gave it."""

    noun: str
    lost_reason: str
    classify: Callable[[int | None], ExitClass]

    def lost(self, job_id: int) -> ExitClass:
        text = f"{self.noun} {job_id} is gone without a final state or a result"
        return ExitClass(FailureKind.TRANSIENT, self.lost_reason, text)

    def exited(self, job_id: int, exit_code: int | None) -> ExitClass:
        cause = self.classify(exit_code)
        text = f"{self.noun} {job_id}: {cause.text}"
        if exit_code is not None:
            text += f" (exit code {exit_code})"
        return ExitClass(cause.kind, cause.reason, text)

    def usable(self, job_name: str, result: T | None, expected: Mapping[str, str]) -> T | ExitClass:
        """The ended job's result, or why it cannot be used: missing (transient), or not
        saying what the operator asked for (permanent)."""
        if result is None:
            text = f"{self.noun} {job_name} ended without a result file"
            return ExitClass(FailureKind.TRANSIENT, "ResultMissing", text)
        problem = mismatch(result, expected)
        if problem:
            return ExitClass(FailureKind.PERMANENT, "ResultInvalid", problem)
        return result


def next_attempt(
    record: AttemptRecord, now: datetime, job_name: Callable[[str, int, int], str]
) -> ImportAttempt:
    """The record's next attempt, numbered on from its last: `job_name(key, epoch, number)`
    gives it a name no earlier attempt of the record had."""
    number = record.attempt.number + 1 if record.attempt is not None else 1
    return ImportAttempt(
        number=number,
        job_name=job_name(record.key, record.epoch, number),
        submitted_at=now,
    )


def submitted(record: R, job_id: int) -> R:
    """The record once the submit (or the lookup by name) answered `job_id`."""
    if record.attempt is None:
        raise ValueError(f"record {record.key} has no attempt")
    attempt = record.attempt.model_copy(update={"job_id": job_id, "write_ahead": False})
    return record.model_copy(update={"attempt": attempt})


@dataclass(frozen=True)
class Unconfirmed(Generic[R]):
    """The submit's answer was lost: look the job up by its name."""

    record: R
    job_name: str


@dataclass(frozen=True)
class NeverSent(Generic[R]):
    """Proven absent: the attempt never reached Slurm. The next one has another name."""

    record: R


@dataclass(frozen=True)
class Running(Generic[R]):
    """Pending or running (or not looked at yet)."""

    record: R
    job_id: int


@dataclass(frozen=True)
class Ended(Generic[R]):
    """Ended well, or gone with a result file: the result decides."""

    record: R


@dataclass(frozen=True)
class JobFailed(Generic[R]):
    record: R
    cause: ExitClass


def follow(
    record: R, job: ImportJob | None, has_result: bool, kind: JobKind
) -> Unconfirmed[R] | NeverSent[R] | Running[R] | Ended[R] | JobFailed[R]:
    """Where the record's attempt in flight stands, by its job as the adapter found it (None:
    not looked up) and whether its result file was read; the record has the job id once the
    job was found by its name."""
    attempt = record.attempt
    assert attempt is not None
    if job is not None and job.name != attempt.job_name:
        raise ValueError(f"job {job.name} is not the record's attempt {attempt.job_name}")
    if attempt.job_id is None:
        if job is not None and job.job_id is not None:
            record = submitted(record, job.job_id)  # found by its name: adopted
        elif job is not None and job.state is JobState.ABSENT:
            return NeverSent(record)
        else:
            return Unconfirmed(record, attempt.job_name)
    assert record.attempt is not None
    assert record.attempt.job_id is not None
    job_id = record.attempt.job_id
    if job is None or job.state in (JobState.PENDING, JobState.RUNNING):
        return Running(record, job_id)
    if job.state is JobState.COMPLETED and job.exit_code in (None, EXIT_OK):
        return Ended(record)
    if job.state is JobState.ABSENT:
        return Ended(record) if has_result else JobFailed(record, kind.lost(job_id))
    return JobFailed(record, kind.exited(job_id, job.exit_code))


def succeeded(record: R, now: datetime, update: Mapping[str, object]) -> R:
    """The record once its attempt ended well: `update`, no failure, no retry counted."""
    attempt = record.attempt
    assert attempt is not None
    ended = attempt.model_copy(update={"ended_at": now})
    return record.model_copy(update={**update, "failure": None, "retries": 0, "attempt": ended})


def failure_message(subject: str, failure: Failure) -> str:
    """What the waiting SlurmJobs are told of a failure of `subject`'s record."""
    return f"{subject}: {failure.reason}: {failure.message}"[:MAX_MESSAGE]


def fail_attempt(
    record: R, cause: ExitClass, now: datetime, policy: RetryPolicy, failed_state: StrEnum
) -> tuple[R, Failure]:
    """The record once its attempt failed for `cause`, and the failure recorded: a transient
    cause with retries left is tried again after the policy's backoff (the failure's
    `retry_at`); any other puts the record in `failed_state` for good, a transient one
    saying after how many retries. The message is capped at `MAX_MESSAGE`."""
    attempt = record.attempt
    assert attempt is not None
    ended = attempt.model_copy(update={"ended_at": now})
    kind, reason, message = cause.kind, cause.reason, cause.text[:MAX_MESSAGE]
    if kind is FailureKind.TRANSIENT and record.retries < policy.max_retries:
        retry_at = now + timedelta(seconds=policy.backoff(record.retries))
        failure = Failure(kind=kind, reason=reason, message=message, at=now, retry_at=retry_at)
        update = {"failure": failure, "retries": record.retries + 1, "attempt": ended}
        return record.model_copy(update=update), failure
    if kind is FailureKind.TRANSIENT:
        suffix = f" (gave up after {record.retries} retries)"
        message = message[: MAX_MESSAGE - len(suffix)] + suffix
    failure = Failure(kind=kind, reason=reason, message=message, at=now)
    update = {"state": failed_state, "failure": failure, "attempt": ended}
    return record.model_copy(update=update), failure
