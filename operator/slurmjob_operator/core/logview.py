"""Which attempt a log read is about, and whether its logs can still grow.

The log endpoint (`logserver.py`) and the plugin's fallback to the status tail both ask this
of a status, so it is one pure function of the status each.
"""

from __future__ import annotations

from slurmjob_operator.api.status import Attempt, SlurmJobStatus


def pick_attempt(status: SlurmJobStatus, number: int | None) -> Attempt | None:
    """Attempt `number`, or the newest when None; None when there is no such attempt."""
    if number is None:
        return status.current_attempt
    return next((a for a in status.attempts if a.number == number), None)


def attempt_ended(status: SlurmJobStatus, attempt: Attempt) -> bool:
    """Whether the attempt's job is over, so its log files are complete: Slurm ended it, a
    newer attempt replaced it, it was proven absent or declared lost (nothing runs that
    could write), or the resource's phase is final."""
    current = status.current_attempt
    if current is None or current.number != attempt.number:
        return True
    if attempt.finished_at is not None:
        return True
    if attempt.proven_absent_at is not None or attempt.declared_lost:
        return True
    return status.phase is not None and status.phase.is_terminal
