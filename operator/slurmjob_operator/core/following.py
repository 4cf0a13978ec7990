"""Transitions of a submitted job: what Slurm says folded in, a retry scheduled or not, the
log tails, spec.suspend taking effect, slurmrestd's reachability, and a job Slurm forgot.
Kueue's verdict in the status is `following_kueue`, an upstream's fate
`following_dependencies`.

Pure functions (no I/O, `now` passed in), like `reconcile`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmjob_operator.api.status import (
    Attempt,
    ConditionStatus,
    Logs,
    Phase,
    SlurmJobStatus,
)
from slurmjob_operator.core.arrays import ArrayObservation, array_total
from slurmjob_operator.core.finality import is_lost
from slurmjob_operator.core.following_dependencies import dependency_failed, dependency_repointed
from slurmjob_operator.core.following_kueue import (
    ADMITTED,
    EVICTED,
    EVICTED_ACTION,
    QUOTA_RESERVED,
    admission_conditions,
    evicted,
    kueue_held,
    kueue_hold,
    kueue_release,
)
from slurmjob_operator.core.logtail import capped_logs
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import (
    FAILED,
    READY,
    RUNNING,
    SLURM_REACHABLE,
    SUCCEEDED,
    SUSPENDED,
)
from slurmjob_operator.core.retries import RetryDecision
from slurmjob_operator.core.states import Observation
from slurmjob_operator.core.transition import (
    NORMAL,
    WARNING,
    Event,
    Transition,
    flip_event,
    next_attempt_due,
    phase_event,
    ready_for,
    replace_attempt,
    with_conditions,
)
from slurmjob_operator.times import rfc3339

# The Kueue and dependency transitions stay importable from here, where the controller looks
# for them.
__all__ = [
    "ADMITTED",
    "EVICTED",
    "EVICTED_ACTION",
    "QUOTA_RESERVED",
    "OutputTarget",
    "admission_conditions",
    "dependency_failed",
    "dependency_repointed",
    "evicted",
    "is_lost",
    "kueue_held",
    "kueue_hold",
    "kueue_release",
    "lacks_output",
    "lost",
    "not_retried",
    "observed",
    "observed_array",
    "output_unwritable",
    "reachability",
    "retry_scheduled",
    "suspension",
    "with_logs",
]


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
        (READY, ready_for(phase), obs.reason, obs.message),
    ]
    if obs.final:
        updates.append(
            (SUCCEEDED, "True" if phase is Phase.SUCCEEDED else "False", obs.reason, obs.message)
        )
        updates.append(
            (FAILED, "True" if phase is Phase.FAILED else "False", obs.reason, obs.message)
        )
    start = status.start_time or attempt.started_at
    new = with_conditions(status, updates, generation, now).model_copy(
        update={
            "phase": phase,
            "attempts": replace_attempt(status, attempt),
            "nodes": obs.nodes or status.nodes,
            "start_time": start,
            "completion_time": attempt.finished_at if obs.final else None,
            "message": obs.message,
        }
    )
    return Transition(new, phase_event(status.phase, phase, obs.reason, obs.message))


def observed_array(
    status: SlurmJobStatus, seen: ArrayObservation, generation: int | None, now: datetime
) -> Transition:
    """Fold what Slurm says about the current attempt of an array: as `observed` for the
    array as one job, plus the attempt's task outcomes and the tasks by state."""
    transition = observed(status, seen.observation, generation, now)
    new = transition.status
    attempt = new.current_attempt
    assert attempt is not None
    attempt = attempt.model_copy(update={"array": seen.record})
    attempts = replace_attempt(new, attempt)
    new = new.model_copy(update={"attempts": attempts, "array": seen.status(array_total(attempts))})
    return Transition(new, transition.events)


@dataclass(frozen=True)
class OutputTarget:
    """Where the job was to write its output, and who it ran as (for the message)."""

    path: str
    user: str | None
    uid: int
    directory: str
    owner: tuple[int, int, int] | None
    """(uid, gid, mode) of the directory; None when it could not be looked at."""


def lacks_output(obs: Observation, stdout_missing: bool) -> bool:
    """The job failed once it was on a node, and its standard output does not exist: slurmd
    could not open it (slurmstepd creates it before the script runs), which Slurm reports
    only as `RaisedSignal:53` or an exit code nobody can act on."""
    return (
        stdout_missing
        and obs.final
        and obs.phase is Phase.FAILED
        and not obs.infrastructure
        and obs.started_at is not None
    )


def output_unwritable(obs: Observation, target: OutputTarget) -> Observation:
    """The observation with reason StagingNotWritable and a message a person can act on."""
    who = f"{target.user} (uid {target.uid})" if target.user else f"uid {target.uid}"
    if target.owner is not None:
        uid, gid, mode = target.owner
        where = f"{target.directory} is owned by {uid}:{gid} with mode {mode & 0o7777:04o}"
    else:
        where = f"{target.directory} could not be examined"
    message = (
        f"Slurm could not open the job's output file {target.path} as the job user {who}: "
        f"{where}. The staging directory must be writable by the job user (site setting "
        f"SLURMJOB_STAGING_OWNER, or the tenant's uid with ACLs; `slurmjob-operator doctor` "
        f"checks it). Slurm said: {obs.message}"
    )
    return obs.model_copy(update={"reason": Reason.STAGING_NOT_WRITABLE, "message": message})


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
    return next_attempt_due(
        status,
        decision.action.value,
        Reason.RETRY_SCHEDULED,
        decision.message,
        now + timedelta(seconds=decision.delay_seconds),
        (READY, RUNNING, FAILED),
        generation,
        now,
    )


def not_retried(status: SlurmJobStatus, decision: RetryDecision) -> SlurmJobStatus:
    """A failed attempt the rules do not retry: say why on the attempt."""
    attempt = status.current_attempt
    if attempt is None:
        return status
    attempt = attempt.model_copy(update={"retry_action": decision.action.value})
    return status.model_copy(update={"attempts": replace_attempt(status, attempt)})


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
    new = with_conditions(status, [(SUSPENDED, value, reason, message)], generation, now)
    if suspended and status.current_attempt is None:
        new = new.model_copy(update={"phase": Phase.PENDING, "message": message})
    events = flip_event(status, SUSPENDED, value, Event(NORMAL, reason, message))
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
    new = with_conditions(status, [(SLURM_REACHABLE, value, reason, message)], generation, now)
    event = Event(NORMAL if reachable else WARNING, reason, message)
    return Transition(new, flip_event(status, SLURM_REACHABLE, value, event))


def lost(status: SlurmJobStatus, message: str, generation: int | None, now: datetime) -> Transition:
    """The controller no longer knows the job and there is no accounting to ask: Unknown,
    never a resubmit."""
    new = with_conditions(
        status,
        [(READY, "False", Reason.JOB_LOST, message), (RUNNING, "False", Reason.JOB_LOST, message)],
        generation,
        now,
    ).model_copy(update={"phase": Phase.UNKNOWN, "message": message})
    return Transition(new, phase_event(status.phase, Phase.UNKNOWN, Reason.JOB_LOST, message))


def with_logs(status: SlurmJobStatus, logs: Logs, max_bytes: int) -> SlurmJobStatus:
    """The status with the tails as read, each cut to its last `max_bytes` bytes."""
    return status.model_copy(update={"logs": capped_logs(logs, max_bytes)})
