"""Kueue's verdict in a SlurmJob's own status: its QuotaReserved, Admitted and Evicted
conditions, an admitted job's eviction ending its attempt, and a job evicted while pending
held in Slurm, then released once Kueue admits it again.

Pure functions (no I/O, `now` passed in), like `following`.
"""

from __future__ import annotations

import re
from datetime import datetime

from slurmjob_operator.api.status import ConditionStatus, SlurmJobStatus, get_condition
from slurmjob_operator.core.claims import action_of
from slurmjob_operator.core.kueue.admission import KUEUE_UNAVAILABLE, Admission, Verdict
from slurmjob_operator.core.reasons import ConditionType, Reason
from slurmjob_operator.core.reconcile import READY, RUNNING, SUSPENDED
from slurmjob_operator.core.transition import (
    NORMAL,
    WARNING,
    Event,
    Transition,
    flip_event,
    next_attempt_due,
    with_conditions,
)


def evicted(
    status: SlurmJobStatus, reason: str, message: str, generation: int | None, now: datetime
) -> Transition:
    """Kueue evicted the admitted job and its Slurm job has ended: the attempt is over without
    spending the retry budget (`retryAction: Evicted`), and the next one is due as soon as
    Kueue admits the Workload again."""
    text = f"evicted by Kueue ({reason}): {message}" if message else f"evicted by Kueue ({reason})"
    return next_attempt_due(
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
        and action_of(attempt) is None
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
