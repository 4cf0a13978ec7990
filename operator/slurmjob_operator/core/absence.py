"""When an unconfirmed submit may be proven absent, so that the next attempt needs no person.

After a submit whose answer was lost the job may exist. It is proven absent only where the
proof is sound:

- the fencing window has passed since the request could last have been sent: the slurmrestd
  request timeout (how long a sender waits), plus slurmctld's `MessageTimeout` (how long
  slurmctld may take with it), plus a margin;
- accounting answers through slurmrestd: a job that ran and was purged from the controller is
  still there (without accounting a purged job looks exactly like one never created);
- slurmctld has nothing queued for slurmdbd (`dbd_agent_queue_size` 0 in `GET /diag`), both
  before the lookup and again after it: job records reach slurmdbd asynchronously, so a job
  purged from the controller while its record waits in that queue would be in neither;
- and the lookup by exact name (controller and accounting) found no job of the attempt.

Anything else leaves the attempt unconfirmed, searched for every poll interval, and the
`slurmjob.io/declare-lost` annotation remains the way out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from slurmjob_operator.api.status import Attempt
from slurmjob_operator.core.decisions import belongs
from slurmjob_operator.core.jobview import ACTIVE_STATES, SlurmJobView
from slurmjob_operator.times import parse_rfc3339


class Mode(StrEnum):
    """How a cluster's unconfirmed submits end when nothing is found."""

    PROOF = "proof"  # proven absent after the window (accounting answers)
    MANUAL = "manual"  # a person declares them lost (no accounting)


class Next(StrEnum):
    WAIT = "wait"  # the window has not passed: search again later
    MANUAL = "manual"  # no sound proof here: only a person can declare it lost
    PROVE = "prove"  # check the dbd queue, look up, check the queue again


class Verdict(StrEnum):
    FOUND = "found"  # a job of the attempt exists: adopt it
    LAGGING = "lagging"  # slurmctld has records queued for slurmdbd (or did not say)
    PROVEN = "proven"  # absent: the next attempt may be submitted


@dataclass(frozen=True)
class Window:
    """The fencing window, in seconds."""

    rest_timeout: float
    message_timeout: float
    margin: float

    @property
    def seconds(self) -> float:
        return self.rest_timeout + self.message_timeout + self.margin


def mode(accounting: bool | None) -> Mode:
    return Mode.PROOF if accounting else Mode.MANUAL


def next_check(waited: float, window: Window, accounting: bool | None) -> Next:
    """`waited`: seconds since the request could last have been sent (for this process: since
    it first found the attempt unconfirmed and not in Slurm)."""
    if not accounting:
        return Next.MANUAL
    if waited < window.seconds:
        return Next.WAIT
    return Next.PROVE


def verdict(queue_before: int | None, found: bool, queue_after: int | None) -> Verdict:
    """From the two `dbd_agent_queue_size` readings around the lookup (None: not given)."""
    if found:
        return Verdict.FOUND
    if queue_before != 0 or queue_after != 0:
        return Verdict.LAGGING
    return Verdict.PROVEN


#: How long after a proof a late job of that attempt is still looked for: 20 fencing windows,
#: at least 10 minutes (a request held that much longer is not expected from any proxy).
LATE_HORIZON_WINDOWS = 20
LATE_HORIZON_FLOOR = timedelta(minutes=10)

#: The attempts before the current one a late job is looked for: a proof lets the next
#: attempt go out, so a late job duplicating the current attempt is of the one just before
#: it, or (two submits lost in a row within the horizon) of the one before that. Older ones
#: in a status are not looked at, however many it says (anyone who writes the status can
#: write attempts).
MAX_LATE_CANDIDATES = 2


def late_candidates(attempts: Sequence[Attempt], now: datetime, window: Window) -> list[Attempt]:
    """The attempts proven absent recently enough that a late job of theirs is looked for
    (and cancelled as a duplicate of the newer attempt, which is not among them): of the
    `MAX_LATE_CANDIDATES` just before the current one only."""
    horizon = max(timedelta(seconds=window.seconds * LATE_HORIZON_WINDOWS), LATE_HORIZON_FLOOR)
    out: list[Attempt] = []
    for attempt in attempts[-1 - MAX_LATE_CANDIDATES : -1]:
        proven = parse_rfc3339(attempt.proven_absent_at)
        if proven is not None and now - proven <= horizon:
            out.append(attempt)
    return out


def late_jobs(
    candidates: Sequence[Attempt], jobs: Iterable[SlurmJobView], uid: str
) -> list[tuple[Attempt, list[SlurmJobView]]]:
    """From one listing of the controller's jobs, each candidate's late jobs: the attempt's
    (`core.decisions.belongs`) and still queued or running (only those are cancelled, and the
    controller lists every one of them: accounting, which keeps the ended ones, adds none)."""
    listed = list(jobs)
    out: list[tuple[Attempt, list[SlurmJobView]]] = []
    for attempt in candidates:
        late = [
            job for job in listed if job.base_state in ACTIVE_STATES and belongs(job, uid, attempt)
        ]
        if late:
            out.append((attempt, late))
    return out
