"""The decision core: given the status and what happened, the next step and the new status.

Pure functions only (no I/O, `now` passed in): the kopf handlers, the poller and `submit`
call them and carry out what they return. Every function returns a `Transition`: the whole
new status plus the Events worth posting; writing nothing when nothing visible changed is the
caller's job (`changed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from slurmjob_operator.api.status import (
    Attempt,
    ConditionStatus,
    Logs,
    Phase,
    SlurmJobStatus,
    set_condition,
)
from slurmjob_operator.core.reasons import ConditionType, Reason
from slurmjob_operator.core.retries import RetryDecision
from slurmjob_operator.core.states import Observation
from slurmjob_operator.times import rfc3339

SUBMITTED = ConditionType.SUBMITTED
RUNNING = ConditionType.RUNNING
SUCCEEDED = ConditionType.SUCCEEDED
FAILED = ConditionType.FAILED
READY = ConditionType.READY
SUSPENDED = ConditionType.SUSPENDED
SLURM_REACHABLE = ConditionType.SLURM_REACHABLE
DECLARE_LOST_ANNOTATION = "slurmjob.io/declare-lost"

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Transition:
    status: SlurmJobStatus
    events: tuple[Event, ...] = field(default_factory=tuple)


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
        return Step.SUBMIT if attempt.declared_lost else Step.ADOPT
    if not attempt.confirmed:
        return Step.CONFIRM
    return Step.TRACK


def changed(old: SlurmJobStatus, new: SlurmJobStatus) -> bool:
    return old.dump() != new.dump()


def _ready_for(phase: Phase) -> ConditionStatus:
    return "True" if phase in (Phase.QUEUED, Phase.RUNNING, Phase.SUCCEEDED) else "False"


def _with_conditions(
    status: SlurmJobStatus,
    updates: Sequence[tuple[str, ConditionStatus, str, str]],
    generation: int | None,
    now: datetime,
) -> SlurmJobStatus:
    conditions = list(status.conditions)
    for type_, cond_status, reason, message in updates:
        conditions = set_condition(conditions, type_, cond_status, reason, message, generation, now)
    return status.model_copy(update={"conditions": conditions, "observed_generation": generation})


def _replace_attempt(status: SlurmJobStatus, attempt: Attempt) -> list[Attempt]:
    return [*status.attempts[:-1], attempt]


def _phase_event(old: Phase | None, new: Phase, reason: str, message: str) -> tuple[Event, ...]:
    """One Event per phase change, its reason the new phase (the detail in the message)."""
    if old == new:
        return ()
    failed = new in (Phase.FAILED, Phase.UNKNOWN, Phase.CANCELLED)
    text = f"{reason}: {message}" if message else reason
    return (Event(WARNING if failed else NORMAL, new.value, text),)


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
    new = _with_conditions(
        status,
        [
            (READY, "False", reason, message),
            (SUBMITTED, "False", reason, "nothing was submitted"),
            (FAILED, "True", reason, message),
        ],
        generation,
        now,
    ).model_copy(update={"phase": Phase.FAILED, "message": message})
    events = () if status.message == message else (Event(WARNING, reason, message),)
    return Transition(new, events)


def waiting(
    status: SlurmJobStatus, reason: str, message: str, generation: int | None, now: datetime
) -> Transition:
    """Nothing submitted yet, and something outside the spec blocks it (a missing Secret,
    slurmrestd unreachable, refused credentials); the handler tries again later."""
    new = _with_conditions(
        status,
        [(READY, "False", reason, message), (SUBMITTED, "False", reason, message)],
        generation,
        now,
    ).model_copy(update={"phase": Phase.PENDING, "message": message})
    events = () if status.message == message else (Event(WARNING, reason, message),)
    return Transition(new, events)


def record_attempt(
    status: SlurmJobStatus,
    *,
    number: int,
    job_name: str,
    staging_dir: str,
    generation: int | None,
    now: datetime,
) -> Transition:
    """Written before the POST, so a crash after it leaves a trace to adopt the job by."""
    previous = status.current_attempt
    attempt = Attempt(
        number=number,
        job_name=job_name,
        staging_dir=staging_dir,
        submitted_at=rfc3339(now),
        retry_of=previous.number if previous is not None and previous.job_id else None,
    )
    message = f"submitting attempt {number} as Slurm job name {job_name}"
    new = _with_conditions(
        status,
        [(SUBMITTED, "Unknown", Reason.SUBMITTING, message)],
        generation,
        now,
    ).model_copy(
        update={
            "phase": Phase.SUBMITTING,
            "attempts": [*status.attempts, attempt],
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
    if previous is not None and previous.retry_action in ("Retry", "Ignore"):
        # The attempt was a scheduled retry: it stays scheduled (the caller waits a while).
        base = base.model_copy(update={"next_attempt_at": rfc3339(now)})
    return waiting(base, reason, message, generation, now)


def unconfirmed(
    status: SlurmJobStatus, message: str, generation: int | None, now: datetime
) -> Transition:
    """The POST may have created a job whose answer was lost: never submit again until it is
    found (or declared lost by a person)."""
    text = f"submission unconfirmed: {message}; searching for the job by name before any resubmit"
    new = _with_conditions(
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
        attempts = _replace_attempt(status, attempt.model_copy(update={"reason": "Rejected"}))
    text = f"Slurm refused the job: {message}"
    new = _with_conditions(
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
    attempt = attempt.model_copy(
        update={"job_id": job_id, "sluid": sluid or attempt.sluid, "confirmed": adopted}
    )
    how = "adopted" if adopted else "submitted"
    text = f"attempt {attempt.number} {how} as Slurm job {job_id}" + (
        f" ({sluid})" if sluid else ""
    )
    new = _with_conditions(
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
            "attempts": _replace_attempt(status, attempt),
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
    attempt = attempt.model_copy(update={"confirmed": True, "sluid": sluid or attempt.sluid})
    return status.model_copy(update={"attempts": _replace_attempt(status, attempt)})


def observed(
    status: SlurmJobStatus, obs: Observation, generation: int | None, now: datetime
) -> Transition:
    """Fold what Slurm says about the current attempt into the status."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("nothing was submitted")
    attempt = attempt.model_copy(
        update={
            "native_state": obs.native_state,
            "native_flags": list(obs.native_flags),
            "reason": obs.slurm_reason,
            "exit_code": obs.exit_code,
            "signal": obs.signal,
            "started_at": rfc3339(obs.started_at) if obs.started_at else attempt.started_at,
            "finished_at": _finished(attempt, obs, now),
        }
    )
    phase = obs.phase
    updates: list[tuple[str, ConditionStatus, str, str]] = [
        (RUNNING, "True" if phase is Phase.RUNNING else "False", obs.reason, obs.message),
        (READY, _ready_for(phase), obs.reason, obs.message),
    ]
    if obs.final:
        updates.append(
            (SUCCEEDED, "True" if phase is Phase.SUCCEEDED else "False", obs.reason, obs.message)
        )
        updates.append(
            (FAILED, "True" if phase is Phase.FAILED else "False", obs.reason, obs.message)
        )
    start = status.start_time or attempt.started_at
    new = _with_conditions(status, updates, generation, now).model_copy(
        update={
            "phase": phase,
            "attempts": _replace_attempt(status, attempt),
            "nodes": obs.nodes or status.nodes,
            "start_time": start,
            "completion_time": attempt.finished_at if obs.final else None,
            "message": obs.message,
        }
    )
    return Transition(new, _phase_event(status.phase, phase, obs.reason, obs.message))


def _finished(attempt: Attempt, obs: Observation, now: datetime) -> str | None:
    """When the job ended: Slurm's end time, else when the end was first seen."""
    if not obs.final:
        return None
    if obs.finished_at is not None:
        return rfc3339(obs.finished_at)
    return attempt.finished_at or rfc3339(now)


def retry_scheduled(
    status: SlurmJobStatus,
    decision: RetryDecision,
    generation: int | None,
    now: datetime,
) -> Transition:
    """The attempt failed and the retry rules give it another: Pending until `nextAttemptAt`."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("nothing failed")
    attempt = attempt.model_copy(update={"retry_action": decision.action.value})
    new = _with_conditions(
        status,
        [
            (READY, "False", Reason.RETRY_SCHEDULED, decision.message),
            (RUNNING, "False", Reason.RETRY_SCHEDULED, decision.message),
            (FAILED, "False", Reason.RETRY_SCHEDULED, decision.message),
        ],
        generation,
        now,
    ).model_copy(
        update={
            "phase": Phase.PENDING,
            "attempts": _replace_attempt(status, attempt),
            "message": decision.message,
            "next_attempt_at": rfc3339(now + timedelta(seconds=decision.delay_seconds)),
            "completion_time": None,
        }
    )
    return Transition(new, (Event(WARNING, Reason.RETRY_SCHEDULED, decision.message),))


def not_retried(status: SlurmJobStatus, decision: RetryDecision) -> SlurmJobStatus:
    """A failed attempt the rules do not retry: say why on the attempt."""
    attempt = status.current_attempt
    if attempt is None:
        return status
    attempt = attempt.model_copy(update={"retry_action": decision.action.value})
    return status.model_copy(update={"attempts": _replace_attempt(status, attempt)})


def declared_lost(status: SlurmJobStatus, generation: int | None, now: datetime) -> Transition:
    """The annotation names the unconfirmed attempt: stop searching, allow a new attempt."""
    attempt = status.current_attempt
    if attempt is None or attempt.job_id is not None:
        return Transition(status)
    attempt = attempt.model_copy(update={"declared_lost": True, "reason": Reason.DECLARED_LOST})
    text = (
        f"attempt {attempt.number} ({attempt.job_name}) declared lost through the "
        f"{DECLARE_LOST_ANNOTATION} annotation; its files are kept; a new attempt follows"
    )
    new = _with_conditions(
        status,
        [(SUBMITTED, "False", Reason.DECLARED_LOST, text)],
        generation,
        now,
    ).model_copy(
        update={
            "attempts": _replace_attempt(status, attempt),
            "phase": Phase.PENDING,
            "message": text,
        }
    )
    return Transition(new, (Event(WARNING, Reason.DECLARED_LOST, text),))


def _flip_event(
    status: SlurmJobStatus, type_: str, value: ConditionStatus, event: Event
) -> tuple[Event, ...]:
    old = next((c for c in status.conditions if c.type == type_), None)
    return () if old is not None and old.status == value else (event,)


def suspension(
    status: SlurmJobStatus,
    suspended: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> Transition:
    """spec.suspend took effect (nothing submitted, or the queued job held) or was lifted."""
    value: ConditionStatus = "True" if suspended else "False"
    new = _with_conditions(status, [(SUSPENDED, value, reason, message)], generation, now)
    if suspended and status.current_attempt is None:
        new = new.model_copy(update={"phase": Phase.PENDING, "message": message})
    events = _flip_event(status, SUSPENDED, value, Event(NORMAL, reason, message))
    return Transition(new, events)


def reachability(
    status: SlurmJobStatus,
    reachable: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> Transition:
    """Whether slurmrestd answers with the operator's credentials (refused tokens come back
    as HTTP 500 or 511, so this is the only place a user sees them)."""
    value: ConditionStatus = "True" if reachable else "False"
    new = _with_conditions(status, [(SLURM_REACHABLE, value, reason, message)], generation, now)
    event = Event(NORMAL if reachable else WARNING, reason, message)
    return Transition(new, _flip_event(status, SLURM_REACHABLE, value, event))


def is_lost(status: SlurmJobStatus) -> bool:
    """Slurm forgot the job without a trace (`lost`): Unknown for good, nobody asks again."""
    ready = next((c for c in status.conditions if c.type == READY), None)
    return status.phase is Phase.UNKNOWN and ready is not None and ready.reason == Reason.JOB_LOST


def lost(status: SlurmJobStatus, message: str, generation: int | None, now: datetime) -> Transition:
    """The controller no longer knows the job and there is no accounting to ask: Unknown,
    never a resubmit."""
    new = _with_conditions(
        status,
        [(READY, "False", Reason.JOB_LOST, message), (RUNNING, "False", Reason.JOB_LOST, message)],
        generation,
        now,
    ).model_copy(update={"phase": Phase.UNKNOWN, "message": message})
    return Transition(new, _phase_event(status.phase, Phase.UNKNOWN, Reason.JOB_LOST, message))


def with_logs(status: SlurmJobStatus, logs: Logs) -> SlurmJobStatus:
    return status.model_copy(update={"logs": logs})
