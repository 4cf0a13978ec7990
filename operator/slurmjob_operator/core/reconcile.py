"""The decision core's submission side: the next step for a resource, and the transitions
of an attempt from its record to its job id (or its refusal, or its loss).

Pure functions only (no I/O, `now` passed in): the controller calls them and carries out what
they return, a `Transition` (`core.transition`). What happens once Slurm has the job is in
`core.following`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from slurmjob_operator.api.probestatus import AttemptProbe
from slurmjob_operator.api.segmentstatus import AttemptSegment
from slurmjob_operator.api.status import (
    ArrayAttempt,
    ArrayStatus,
    Attempt,
    AttemptDependency,
    ConditionStatus,
    Phase,
    SlurmJobStatus,
)
from slurmjob_operator.core.arrays import array_total
from slurmjob_operator.core.claims import action_of
from slurmjob_operator.core.indices import compact
from slurmjob_operator.core.reasons import ConditionType, Reason
from slurmjob_operator.core.transition import (
    NORMAL,
    WARNING,
    Event,
    Transition,
    replace_attempt,
    with_conditions,
)
from slurmjob_operator.times import rfc3339

SUBMITTED = ConditionType.SUBMITTED
RUNNING = ConditionType.RUNNING
SUCCEEDED = ConditionType.SUCCEEDED
FAILED = ConditionType.FAILED
READY = ConditionType.READY
IMAGE_READY = ConditionType.IMAGE_READY
SUSPENDED = ConditionType.SUSPENDED
SLURM_REACHABLE = ConditionType.SLURM_REACHABLE
DECLARE_LOST_ANNOTATION = "slurmjob.io/declare-lost"


class Step(StrEnum):
    """What the submission side must do next for a resource."""

    SUBMIT = "Submit"  # no live attempt: render, record, POST
    ADOPT = "Adopt"  # the last POST's answer was lost: find the job by name before anything else
    CONFIRM = "Confirm"  # job id known, receipt not yet confirmed (SLUID not recorded)
    TRACK = "Track"  # submitted and confirmed: the poller follows it
    RETRY = "Retry"  # the last attempt failed and a new one is scheduled (nextAttemptAt)
    DONE = "Done"  # final, or refused: nothing to do


def next_step(status: SlurmJobStatus) -> Step:
    attempt = status.current_attempt
    if attempt is None:
        # Nothing was ever submitted (a spec refused earlier is checked again: it may be fixed).
        return Step.SUBMIT
    if status.phase is not None and status.phase.is_terminal:
        return Step.DONE
    if status.next_attempt_at is not None:
        return Step.RETRY
    if attempt.job_id is None:
        # A person declared this unconfirmed submission lost: the only way past adoption.
        # Declared lost by a person, or proven absent: the only ways past adoption.
        gone = attempt.declared_lost or attempt.proven_absent_at is not None
        return Step.SUBMIT if gone else Step.ADOPT
    if not attempt.confirmed:
        return Step.CONFIRM
    return Step.TRACK


def invalid_spec(
    status: SlurmJobStatus,
    messages: Sequence[str],
    generation: int | None,
    now: datetime,
    reason: str,
) -> Transition:
    """The spec cannot be run here (reason InvalidSpec) or its runtime artifact is wrong
    (RuntimeArtifactInvalid): say why, submit nothing, retry nothing. Earlier attempts are
    left as they were."""
    message = "; ".join(messages)
    new = with_conditions(
        status,
        [
            (READY, "False", reason, message),
            (SUBMITTED, "False", reason, "nothing was submitted"),
            (FAILED, "True", reason, message),
        ],
        generation,
        now,
        # A retry refused (its spec changed, or Kueue's flavors contradict it) is no retry due:
        # the job is final, and Kueue's Workload is finished on it.
    ).model_copy(update={"phase": Phase.FAILED, "message": message, "next_attempt_at": None})
    events = () if status.message == message else (Event(WARNING, reason, message),)
    return Transition(new, events)


def image_pulling(
    status: SlurmJobStatus,
    message: str,
    generation: int | None,
    now: datetime,
    reason: Reason = Reason.IMAGE_PULLING,
) -> Transition:
    """Nothing submitted yet: the image cache imports the spec's image, or a job of the cache
    user verifies its registry artifact (`ArtifactVerifying`): a Normal event, once per
    message (the job's id changes it)."""
    waited = waiting(status, reason, message, generation, now, event_type=NORMAL)
    new = with_conditions(waited.status, [(IMAGE_READY, "False", reason, message)], generation, now)
    return Transition(new, waited.events)


def image_failed(
    status: SlurmJobStatus,
    message: str,
    generation: int | None,
    now: datetime,
    reason: Reason = Reason.IMAGE_PULL_FAILED,
) -> Transition:
    """The import (or the artifact's verification, `ArtifactVerifyFailed`) failed for good:
    the SlurmJob fails with nothing of it submitted."""
    failed = invalid_spec(status, [message], generation, now, reason)
    new = with_conditions(failed.status, [(IMAGE_READY, "False", reason, message)], generation, now)
    return Transition(new, failed.events)


def waiting(
    status: SlurmJobStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
    *,
    event_type: str = WARNING,
) -> Transition:
    """Nothing submitted yet, and something outside the spec blocks it (a missing Secret,
    slurmrestd unreachable, refused credentials); the handler tries again later."""
    new = with_conditions(
        status,
        [(READY, "False", reason, message), (SUBMITTED, "False", reason, message)],
        generation,
        now,
    ).model_copy(update={"phase": Phase.PENDING, "message": message})
    events = () if status.message == message else (Event(event_type, reason, message),)
    return Transition(new, events)


#: The `retryAction`s after which a new attempt is due (`core.retries`' Retry and Ignore, a
#: failed probe's new attempt `core.probe.PROBE_RETRY_ACTION`, a walltime segment's next one
#: `core.segments.SEGMENT_ACTION`): a submit of it that certainly sent nothing stays due.
NEW_ATTEMPT_ACTIONS = frozenset({"Retry", "Ignore", "ProbeRetry", "Segment"})


def record_attempt(
    status: SlurmJobStatus,
    *,
    number: int,
    job_name: str,
    staging_dir: str,
    generation: int | None,
    now: datetime,
    cluster: str | None = None,
    array_indices: Sequence[int] | None = None,
    dependencies: Sequence[AttemptDependency] = (),
    probe: AttemptProbe | None = None,
    segment: AttemptSegment | None = None,
    image: str | None = None,
    image_reason: Reason = Reason.IMAGE_CACHED,
) -> Transition:
    """Written before the POST, so a crash after it leaves a trace to adopt the job by (and
    the cluster it went to, where the adoption must look, and the upstream jobs it waits on).
    `array_indices`: the tasks of a job array the attempt submits; `image`: the reference and
    digest of the image-cache entry it runs, or the verified registry artifact it runs with
    `image_reason` ArtifactVerified (`ImageReady`=True)."""
    previous = status.current_attempt
    attempt = Attempt(
        number=number,
        job_name=job_name,
        cluster=cluster,
        dependencies=list(dependencies) or None,
        staging_dir=staging_dir,
        submitted_at=rfc3339(now),
        retry_of=previous.number if previous is not None and previous.job_id else None,
        array=ArrayAttempt(indices=compact(array_indices)) if array_indices else None,
        probe=probe,
        segment=segment,
    )
    attempts = [*status.attempts, attempt]
    array = None
    if attempt.array is not None:
        total = array_total(attempts)
        waiting = len(set(array_indices or ()))
        array = ArrayStatus(total=total, pending=waiting, succeeded=max(0, total - waiting))
    message = f"submitting attempt {number} as Slurm job name {job_name}"
    written: list[tuple[str, ConditionStatus, str, str]] = [
        (SUBMITTED, "Unknown", Reason.SUBMITTING, message)
    ]
    if image is not None:
        written.append((IMAGE_READY, "True", image_reason, f"runs {image}"))
    new = with_conditions(status, written, generation, now).model_copy(
        update={
            "phase": Phase.SUBMITTING,
            "attempts": attempts,
            "array": array,
            "message": message,
            "next_attempt_at": None,
            "slurm_job_id": None,
            "completion_time": None,
        }
    )
    return Transition(new)


def not_submitted(
    status: SlurmJobStatus, reason: str, message: str, generation: int | None, now: datetime
) -> Transition:
    """The POST certainly did not create a job (nothing was sent, or credentials refused):
    forget the recorded attempt so the next try reuses its number."""
    attempt = status.current_attempt
    attempts = status.attempts
    if attempt is not None and attempt.job_id is None:
        attempts = attempts[:-1]
    base = status.model_copy(update={"attempts": attempts})
    previous = base.current_attempt
    if previous is not None and action_of(previous) in NEW_ATTEMPT_ACTIONS:
        # The attempt was a scheduled retry: it stays scheduled (the caller waits a while).
        base = base.model_copy(update={"next_attempt_at": rfc3339(now)})
    return waiting(base, reason, message, generation, now)


def unconfirmed(
    status: SlurmJobStatus, message: str, generation: int | None, now: datetime
) -> Transition:
    """The POST may have created a job whose answer was lost: never submit again until it is
    found (or declared lost by a person)."""
    text = f"submission unconfirmed: {message}; searching for the job by name before any resubmit"
    new = with_conditions(
        status,
        [
            (SUBMITTED, "Unknown", Reason.SUBMISSION_UNCONFIRMED, text),
            (READY, "False", Reason.SUBMISSION_UNCONFIRMED, text),
        ],
        generation,
        now,
    ).model_copy(update={"phase": Phase.SUBMITTING, "message": text})
    events = (
        () if status.message == text else (Event(WARNING, Reason.SUBMISSION_UNCONFIRMED, text),)
    )
    return Transition(new, events)


def rejected(
    status: SlurmJobStatus, message: str, generation: int | None, now: datetime
) -> Transition:
    """Slurm refused the job description: final, with Slurm's own words."""
    attempt = status.current_attempt
    attempts = status.attempts
    if attempt is not None:
        attempts = replace_attempt(status, attempt.model_copy(update={"reason": "Rejected"}))
    text = f"Slurm refused the job: {message}"
    new = with_conditions(
        status.model_copy(update={"attempts": attempts}),
        [
            (SUBMITTED, "False", Reason.SUBMIT_REJECTED, text),
            (FAILED, "True", Reason.SUBMIT_REJECTED, text),
            (SUCCEEDED, "False", Reason.SUBMIT_REJECTED, text),
            (READY, "False", Reason.SUBMIT_REJECTED, text),
        ],
        generation,
        now,
    ).model_copy(update={"phase": Phase.FAILED, "message": text, "completion_time": rfc3339(now)})
    return Transition(new, (Event(WARNING, Reason.SUBMIT_REJECTED, text),))


def _own_sluid(attempt: Attempt, sluid: str | None) -> str | None:
    """A job array has no SLUID of its own: each task's record has one, the array's too,
    but only the array's numeric id names every task (to read, cancel, hold). Not recorded,
    so that every request about the array goes by that id."""
    return None if attempt.array is not None else sluid


def submitted(
    status: SlurmJobStatus,
    job_id: int,
    generation: int | None,
    now: datetime,
    *,
    sluid: str | None = None,
    adopted: bool = False,
) -> Transition:
    """Slurm gave (or, when adopting, showed) the job id of the current attempt."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("no attempt to attach a job id to")
    sluid = _own_sluid(attempt, sluid)
    attempt = attempt.model_copy(
        update={"job_id": job_id, "sluid": sluid or attempt.sluid, "confirmed": adopted}
    )
    how = "adopted" if adopted else "submitted"
    text = f"attempt {attempt.number} {how} as Slurm job {job_id}" + (
        f" ({sluid})" if sluid else ""
    )
    new = with_conditions(
        status,
        [
            (SUBMITTED, "True", Reason.ADOPTED if adopted else Reason.ACCEPTED, text),
            (READY, "True", Reason.QUEUED, text),
        ],
        generation,
        now,
    ).model_copy(
        update={
            "phase": Phase.QUEUED,
            "attempts": replace_attempt(status, attempt),
            "slurm_job_id": job_id,
            "message": text,
        }
    )
    return Transition(new, (Event(NORMAL, Reason.ADOPTED if adopted else "Submitted", text),))


def confirmed(status: SlurmJobStatus, sluid: str | None) -> SlurmJobStatus:
    """The receipt was checked against Slurm (and the SLUID recorded where there is one)."""
    attempt = status.current_attempt
    if attempt is None:
        return status
    sluid = _own_sluid(attempt, sluid)
    attempt = attempt.model_copy(update={"confirmed": True, "sluid": sluid or attempt.sluid})
    return status.model_copy(update={"attempts": replace_attempt(status, attempt)})


def _gave_way(
    status: SlurmJobStatus,
    update: dict[str, object],
    reason: Reason,
    text: str,
    generation: int | None,
    now: datetime,
) -> Transition:
    """The unconfirmed attempt stops being searched for (`update` says why, on the attempt);
    a new attempt may be submitted. A confirmed one is never given up."""
    attempt = status.current_attempt
    if attempt is None or attempt.job_id is not None:
        return Transition(status)
    attempt = attempt.model_copy(update={**update, "reason": reason})
    new = with_conditions(status, [(SUBMITTED, "False", reason, text)], generation, now).model_copy(
        update={
            "attempts": replace_attempt(status, attempt),
            "phase": Phase.PENDING,
            "message": text,
        }
    )
    return Transition(new, (Event(WARNING, reason, text),))


def _named(status: SlurmJobStatus) -> str:
    attempt = status.current_attempt
    return f"attempt {attempt.number} ({attempt.job_name})" if attempt else "the attempt"


def proven_absent(
    status: SlurmJobStatus, waited: float, generation: int | None, now: datetime
) -> Transition:
    """The unconfirmed attempt is proven never created (`core.absence`): stop searching,
    allow a new attempt, as a person's declaration does."""
    text = (
        f"{_named(status)} proven absent: after {waited:.0f} s neither slurmctld nor "
        "accounting has it, and slurmctld has nothing queued for slurmdbd; its files are "
        "kept; a new attempt follows"
    )
    return _gave_way(
        status, {"proven_absent_at": rfc3339(now)}, Reason.PROVEN_ABSENT, text, generation, now
    )


def declared_lost(status: SlurmJobStatus, generation: int | None, now: datetime) -> Transition:
    """The annotation names the unconfirmed attempt: stop searching, allow a new attempt."""
    text = (
        f"{_named(status)} declared lost through the {DECLARE_LOST_ANNOTATION} annotation; "
        "its files are kept; a new attempt follows"
    )
    return _gave_way(status, {"declared_lost": True}, Reason.DECLARED_LOST, text, generation, now)
