"""Transitions of a submitted job: what Slurm says folded in, a retry scheduled or not, the
log tails, spec.suspend taking effect, slurmrestd's reachability, and a job Slurm forgot.

Pure functions (no I/O, `now` passed in), like `reconcile`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurmjob_operator.api.status import (
    Attempt,
    AttemptDependency,
    ConditionStatus,
    Logs,
    Phase,
    SlurmJobStatus,
    get_condition,
)
from slurmjob_operator.core.arrays import ArrayObservation, array_total
from slurmjob_operator.core.kueue import KUEUE_UNAVAILABLE, Admission, Verdict
from slurmjob_operator.core.logtail import capped_logs
from slurmjob_operator.core.reasons import ConditionType, Reason
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
    phase_event,
    ready_for,
    replace_attempt,
    with_conditions,
)
from slurmjob_operator.times import rfc3339


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
    return _next_attempt_due(
        status,
        decision.action.value,
        Reason.RETRY_SCHEDULED,
        decision.message,
        now + timedelta(seconds=decision.delay_seconds),
        (READY, RUNNING, FAILED),
        generation,
        now,
    )


def _next_attempt_due(
    status: SlurmJobStatus,
    action: str,
    reason: Reason,
    text: str,
    due: datetime,
    conditions: tuple[str, ...],
    generation: int | None,
    now: datetime,
) -> Transition:
    """The current attempt is over (`action` on it) and another is due at `due`: Pending,
    `conditions` False with `reason`, nothing completed."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("no attempt to follow up")
    # A failed attempt's end is Slurm's (already folded); an evicted one's is now.
    ended = attempt.finished_at or rfc3339(now)
    attempt = attempt.model_copy(update={"retry_action": action, "finished_at": ended})
    new = with_conditions(
        status, [(c, "False", reason, text) for c in conditions], generation, now
    ).model_copy(
        update={
            "phase": Phase.PENDING,
            "attempts": replace_attempt(status, attempt),
            "message": text,
            "next_attempt_at": rfc3339(due),
            "completion_time": None,
        }
    )
    return Transition(new, (Event(WARNING, reason, text),))


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


def is_lost(status: SlurmJobStatus) -> bool:
    """Slurm forgot the job without a trace (`lost`): Unknown for good, nobody asks again."""
    ready = next((c for c in status.conditions if c.type == READY), None)
    return status.phase is Phase.UNKNOWN and ready is not None and ready.reason == Reason.JOB_LOST


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


def dependency_failed(
    status: SlurmJobStatus, message: str, generation: int | None, now: datetime
) -> Transition:
    """A submitted job waits in Slurm on an upstream that ended failed for good: its job was
    cancelled, and the SlurmJob ends Failed (not Cancelled: nobody asked for it)."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("nothing was submitted")
    attempt = attempt.model_copy(update={"finished_at": attempt.finished_at or rfc3339(now)})
    reason = Reason.DEPENDENCY_FAILED
    new = with_conditions(
        status,
        [
            (RUNNING, "False", reason, message),
            (READY, "False", reason, message),
            (SUCCEEDED, "False", reason, message),
            (FAILED, "True", reason, message),
        ],
        generation,
        now,
    ).model_copy(
        update={
            "phase": Phase.FAILED,
            "attempts": replace_attempt(status, attempt),
            "completion_time": attempt.finished_at,
            "message": message,
        }
    )
    return Transition(new, (Event(WARNING, reason, message),))


def dependency_repointed(
    status: SlurmJobStatus, records: Sequence[AttemptDependency], message: str
) -> Transition:
    """The pending job now waits on the upstream's new job (it was retried)."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("nothing was submitted")
    attempt = attempt.model_copy(update={"dependencies": list(records) or None})
    new = status.model_copy(update={"attempts": replace_attempt(status, attempt)})
    return Transition(new, (Event(NORMAL, "DependencyRepointed", message),))


def evicted(
    status: SlurmJobStatus, reason: str, message: str, generation: int | None, now: datetime
) -> Transition:
    """Kueue evicted the admitted job and its Slurm job has ended: the attempt is over without
    spending the retry budget (`retryAction: Evicted`), and the next one is due as soon as
    Kueue admits the Workload again."""
    text = f"evicted by Kueue ({reason}): {message}" if message else f"evicted by Kueue ({reason})"
    return _next_attempt_due(
        status, EVICTED_ACTION, Reason.EVICTED, text, now, (READY, RUNNING), generation, now
    )


#: An attempt Kueue evicted: not a failure, and not counted against the retry limit.
EVICTED_ACTION = "Evicted"


#: A Kueue reason as a condition reason may be (a Workload's status is not the operator's).
_KUEUE_REASON = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
QUOTA_RESERVED = ConditionType.QUOTA_RESERVED.value
ADMITTED = ConditionType.ADMITTED.value
EVICTED = ConditionType.EVICTED.value


def _kueue_reason(reason: str, fallback: str) -> str:
    return reason if _KUEUE_REASON.fullmatch(reason) else fallback


def admission_conditions(
    status: SlurmJobStatus, found: Verdict, generation: int | None, now: datetime
) -> Transition:
    """What Kueue says of the SlurmJob's Workload as the SlurmJob's own conditions
    (QuotaReserved, Admitted, Evicted, with Kueue's reasons), and an Event when the quota is
    reserved or the Workload admitted. Nothing when Kueue could not be asked."""
    where = f" in ClusterQueue {found.cluster_queue}" if found.cluster_queue else ""
    reason = _kueue_reason(found.reason, "Pending")
    message = found.message or reason
    updates: list[tuple[str, ConditionStatus, str, str]] = []
    reserved: tuple[str, ConditionStatus, str, str] = (
        QUOTA_RESERVED,
        "True",
        "QuotaReserved",
        f"quota reserved{where}",
    )
    if found.admission is Admission.ADMITTED:
        text = f"admitted by Kueue{where}"
        updates = [reserved, (ADMITTED, "True", "Admitted", text)]
        if get_condition(status.conditions, EVICTED) is not None:
            updates.append((EVICTED, "False", "Admitted", text))
    elif found.admission is Admission.EVICTED:
        updates = [(EVICTED, "True", reason, message), (ADMITTED, "False", reason, message)]
    elif found.admission is Admission.WAITING and found.reason != KUEUE_UNAVAILABLE:
        if found.reserved:
            updates = [reserved, (ADMITTED, "False", reason, message)]
        else:
            updates = [
                (QUOTA_RESERVED, "False", reason, message),
                (ADMITTED, "False", "NoReservation", "the Workload has no quota reserved"),
            ]
    if not updates:
        return Transition(status)
    events: list[Event] = []
    for kind, value, _, text in updates:
        if value == "True" and kind in (QUOTA_RESERVED, ADMITTED):
            events += flip_event(status, kind, "True", Event(NORMAL, kind, text))
    return Transition(with_conditions(status, updates, generation, now), tuple(events))


def kueue_held(status: SlurmJobStatus) -> bool:
    """The current attempt's job was kept for Kueue: evicted while still pending and held
    (not cancelled) until Kueue admits it again. Its phase says whether it is still pending
    (someone may have released it since)."""
    cond = get_condition(status.conditions, EVICTED)
    attempt = status.current_attempt
    return (
        cond is not None
        and cond.status == "True"
        and attempt is not None
        and attempt.job_id is not None
        and attempt.retry_action is None
        and status.phase is not None
        and not status.phase.is_terminal
    )


def kueue_hold(status: SlurmJobStatus, reason: str, message: str) -> Transition:
    """Kueue evicted the job while it was pending and it is now held in Slurm: it keeps its
    place in Slurm's queue and is released, not submitted again, once Kueue re-admits it
    (the conditions, and their time, are `admission_conditions`')."""
    attempt = status.current_attempt
    job = attempt.job_id if attempt is not None else None
    why = _kueue_reason(reason, "Evicted")
    text = f"evicted by Kueue ({why}) while pending: Slurm job {job} held until re-admitted"
    if message:
        text = f"{text}: {message}"
    new = status.model_copy(update={"message": text})
    return Transition(new, (Event(WARNING, Reason.EVICTED.value, text),))


def kueue_release(
    status: SlurmJobStatus, suspended: bool, generation: int | None, now: datetime
) -> Transition:
    """Kueue admitted the held job again: released (unless spec.suspend holds it still)."""
    attempt = status.current_attempt
    job = attempt.job_id if attempt is not None else None
    if suspended:
        text = f"admitted again by Kueue; Slurm job {job} stays held (spec.suspend is true)"
        return Transition(status.model_copy(update={"message": text}))
    text = f"admitted again by Kueue: Slurm job {job} released"
    new = status.model_copy(update={"message": text})
    cond = get_condition(status.conditions, SUSPENDED)
    if cond is not None and cond.status == "True":
        # spec.suspend was lifted while Kueue held the job: the release ends both holds.
        new = with_conditions(new, [(SUSPENDED, "False", Reason.RELEASED, text)], generation, now)
    return Transition(new, (Event(NORMAL, Reason.RELEASED.value, text),))
