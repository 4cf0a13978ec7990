"""What every transition returns, and the helpers the transitions share.

A `Transition` is the whole new status plus the Events worth posting; writing nothing when
nothing visible changed is the caller's job (`changed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from slurmjob_operator.api.status import (
    Attempt,
    ConditionStatus,
    Phase,
    SlurmJobStatus,
    set_condition,
)
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.times import rfc3339

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


def changed(old: SlurmJobStatus, new: SlurmJobStatus) -> bool:
    return old.dump() != new.dump()


def ready_for(phase: Phase) -> ConditionStatus:
    return "True" if phase in (Phase.QUEUED, Phase.RUNNING, Phase.SUCCEEDED) else "False"


def with_conditions(
    status: SlurmJobStatus,
    updates: Sequence[tuple[str, ConditionStatus, str, str]],
    generation: int | None,
    now: datetime,
) -> SlurmJobStatus:
    conditions = list(status.conditions)
    for type_, cond_status, reason, message in updates:
        conditions = set_condition(conditions, type_, cond_status, reason, message, generation, now)
    return status.model_copy(update={"conditions": conditions, "observed_generation": generation})


def replace_attempt(status: SlurmJobStatus, attempt: Attempt) -> list[Attempt]:
    return [*status.attempts[:-1], attempt]


def phase_event(old: Phase | None, new: Phase, reason: str, message: str) -> tuple[Event, ...]:
    """One Event per phase change, its reason the new phase (the detail in the message)."""
    if old == new:
        return ()
    failed = new in (Phase.FAILED, Phase.UNKNOWN, Phase.CANCELLED)
    text = f"{reason}: {message}" if message else reason
    return (Event(WARNING if failed else NORMAL, new.value, text),)


def flip_event(
    status: SlurmJobStatus, type_: str, value: ConditionStatus, event: Event
) -> tuple[Event, ...]:
    old = next((c for c in status.conditions if c.type == type_), None)
    return () if old is not None and old.status == value else (event,)


def next_attempt_due(
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
