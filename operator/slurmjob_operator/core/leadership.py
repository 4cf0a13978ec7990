"""Who leads: the decisions of leader election on a `coordination.k8s.io/v1` Lease.

The rules are client-go's: a candidate takes the Lease when nobody holds it or when the
record it last saw has not changed for the lease's duration, measured on the candidate's own
monotonic clock from the moment it saw that record (never by comparing another machine's
`renewTime` with this one's wall clock); the holder renews every `retry_period`, and stops
leading when it has not renewed for `renew_deadline`, which is shorter than the lease's
duration, so it has stopped before anybody may take over. Writes are compare-and-swap on the
Lease's resourceVersion: of two candidates, one wins and the other sees a conflict.
Leader election does not fence: a paused leader may still act for a moment after a takeover,
which the write-ahead record and adoption make safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum


class Move(StrEnum):
    CREATE = "create"  # no Lease yet: create it holding it
    TAKE = "take"  # free or expired: write ourselves in as holder
    RENEW = "renew"  # ours: write a new renewTime
    WAIT = "wait"  # somebody else's and alive


@dataclass(frozen=True)
class Timing:
    lease_duration: float
    renew_deadline: float
    retry_period: float

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period} / {self.renew_deadline} / {self.lease_duration}"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec as far as election reads it (`version`: its resourceVersion)."""

    holder: str | None = None
    duration: int | None = None
    acquired: datetime | None = None
    renewed: datetime | None = None
    transitions: int = 0
    version: str | None = None


@dataclass(frozen=True)
class Sighting:
    """A record and when (this process's monotonic clock) it was first seen as it is."""

    record: LeaseRecord
    since: float


def observe(previous: Sighting | None, record: LeaseRecord, now: float) -> Sighting:
    """The sighting after reading `record` at `now`: its clock restarts only when the holder
    or the renew time changed (a resourceVersion alone moves with unrelated writes)."""
    if previous is not None and _same(previous.record, record):
        return Sighting(record, previous.since)
    return Sighting(record, now)


def _same(a: LeaseRecord, b: LeaseRecord) -> bool:
    return (a.holder, a.renewed, a.acquired, a.transitions) == (
        b.holder,
        b.renewed,
        b.acquired,
        b.transitions,
    )


def next_move(
    sighting: Sighting | None, me: str, now: float, timing: Timing
) -> tuple[Move, LeaseRecord | None]:
    """What to do about the Lease seen in `sighting` (None: there is none), and the record
    to write for it (None for WAIT). Times in the record are filled in by the caller."""
    if sighting is None:
        return Move.CREATE, LeaseRecord(holder=me, duration=_seconds(timing))
    record = sighting.record
    if record.holder == me:
        return Move.RENEW, replace(record, duration=_seconds(timing))
    # Another holder's duration governs when its lease ends; a record without one uses ours.
    held_for = record.duration if record.duration else timing.lease_duration
    if record.holder and now - sighting.since < held_for:
        return Move.WAIT, None
    return Move.TAKE, replace(
        record, holder=me, duration=_seconds(timing), transitions=record.transitions + 1
    )


def _seconds(timing: Timing) -> int:
    # Up, never down: a standby must not count a shorter lease than the leader keeps to.
    return max(1, math.ceil(timing.lease_duration))


def still_leading(last_renewed: float | None, now: float, timing: Timing) -> bool:
    """Whether a holder whose last successful write was at `last_renewed` may go on acting."""
    return last_renewed is not None and now - last_renewed < timing.renew_deadline
