"""What identifies "no change" for a followed job between two poll sweeps: its components'
raw states, or for an array each task's index and raw state. The poller keeps the key of the
last sweep and asks for a job's details only when the key moves.

Pure functions of a sweep's entries (`/jobs/state`) or of a listing's views (`/jobs`); the two
kinds are never compared with each other.
"""

from __future__ import annotations

from collections.abc import Iterable

from slurmjob_operator.core.jobview import JobStateEntry, SlurmJobView

StateKey = tuple[tuple[str, ...], ...]


def state_key(entries: Iterable[JobStateEntry | SlurmJobView]) -> StateKey:
    """What identifies "no change" for a job: each component's raw state, in a fixed order."""
    return tuple(sorted(tuple(sorted(e.raw_state)) for e in entries))


def array_key(entries: Iterable[JobStateEntry | SlurmJobView]) -> StateKey:
    """The same for an array: each task's index and raw state (a sweep's entries, or the
    views of a listing; the two are never compared with each other)."""
    rows: list[tuple[str, ...]] = []
    for e in entries:
        if isinstance(e, JobStateEntry):
            rows.append((e.array_task or "", *sorted(e.raw_state)))
        else:
            task = "" if e.array_task_id is None else str(e.array_task_id)
            rows.append((task, e.array_tasks or "", *sorted(e.raw_state)))
    return tuple(sorted(rows))
