"""A job array as one resource: its tasks' states folded into one observation, the tasks an
attempt submits, and its tasks by state across attempts.

Pure functions, like `core.states`, whose per-job rules each task is classified by:

* A task's state is its own record's (`array_task_id`); the array's own record, while some
  tasks are pending, stands for those its task string names ("2-5%2"). A task that ended is
  remembered in the attempt (`ArrayAttempt`): Slurm forgets ended tasks (MinJobAge) while the
  rest of the array still runs. A task neither in Slurm's answer nor remembered is unseen.
* The array is final when every task of the attempt has ended. Then it is Failed if any task
  failed, else Cancelled if any was cancelled, else Succeeded. Before that it is Running if a
  task runs, else Unknown if a task's state is unknown or unseen, else Queued.
* The task that decides gives the reason, the exit code and the log tails: the first failed
  task (by index), else the first cancelled one; while not final, the first in the array's
  phase. The retry rules see that task (`core.retries`), and a retry submits exactly the tasks
  that did not succeed, under their own indices (`next_indices`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurmjob_operator.api.status import (
    ArrayAttempt,
    ArrayStatus,
    Attempt,
    Phase,
    SlurmJobStatus,
    TaskEnd,
)
from slurmjob_operator.core.indices import compact, expand, task_string
from slurmjob_operator.core.jobview import SlurmJobView
from slurmjob_operator.core.states import Observation, observe

#: Node lists of running tasks named in the status before the rest are only counted.
MAX_NODE_LISTS = 8


@dataclass(frozen=True)
class ArrayObservation:
    """What Slurm's views say about one attempt of an array."""

    observation: Observation
    """The array as one job: phase, and the deciding task's reason, state and exit code."""
    record: ArrayAttempt
    """The attempt's indices with the outcomes of its ended tasks, for the status."""
    pending: int
    """Tasks waiting to start, or whose state is unknown or unseen."""
    running: int
    unseen: frozenset[int]
    """Tasks of the attempt neither in Slurm's answer nor remembered as ended."""
    log_index: int
    """The task whose log tails stand for the array."""

    def status(self, total: int) -> ArrayStatus:
        """The array's tasks by state: those not in this attempt succeeded in an earlier one."""
        record = self.record
        indices = _read(record.indices)
        succeeded = len(_read(record.succeeded, indices))
        failed = _read(record.failed, indices)
        cancelled = _read(record.cancelled, indices)
        return ArrayStatus(
            total=total,
            pending=self.pending,
            running=self.running,
            succeeded=max(0, total - len(indices)) + succeeded,
            failed=len(failed),
            cancelled=len(cancelled),
            failed_indices=compact([*failed, *cancelled]),
            log_index=self.log_index,
        )


def _read(text: str | None, within: Iterable[int] | None = None) -> list[int]:
    """Indices of a status text, within the attempt's own; an unreadable text names none (a
    status can be written by others: it never makes a task of another attempt succeed)."""
    try:
        found = expand(text)
    except ValueError:
        return []
    if within is None:
        return found
    keep = set(within)
    return [i for i in found if i in keep]


def attempt_indices(attempt: Attempt) -> list[int]:
    return _read(attempt.array.indices) if attempt.array is not None else []


def tasks_of(views: Sequence[SlurmJobView], indices: Iterable[int]) -> dict[int, SlurmJobView]:
    """Each index of the attempt with the record that describes it: its own, else the
    array's pending record whose task string names it. Indices outside the attempt's are
    left out (a task string or a record Slurm sent for something else)."""
    wanted = set(indices)
    found: dict[int, SlurmJobView] = {}
    for view in views:
        index = view.array_task_id
        if index is not None and index in wanted:
            found[index] = view
    rest = wanted - found.keys()
    for view in views:
        if not rest:
            break
        if view.array_task_id is None and view.array_tasks:
            for index in task_string(view.array_tasks, rest):
                found[index] = view
            rest -= found.keys()
    return found


def _task_end(index: int, obs: Observation) -> TaskEnd:
    return TaskEnd(
        index=index,
        native_state=obs.native_state or None,
        native_flags=list(obs.native_flags)[:32],
        reason=obs.reason,
        slurm_reason=obs.slurm_reason,
        exit_code=obs.exit_code,
        signal=obs.signal,
        infrastructure=obs.infrastructure,
    )


def _from_end(end: TaskEnd, phase: Phase) -> Observation:
    return Observation(
        phase=phase,
        reason=end.reason or ("NonZeroExitCode" if phase is Phase.FAILED else "Cancelled"),
        message=f"Slurm job {end.native_state or 'ended'}"
        + (f" (exit code {end.exit_code})" if end.exit_code is not None else ""),
        native_state=end.native_state or "",
        native_flags=sorted(end.native_flags),
        slurm_reason=end.slurm_reason,
        exit_code=end.exit_code,
        signal=end.signal,
        final=True,
        infrastructure=end.infrastructure,
    )


def _unseen(index: int) -> Observation:
    return Observation(
        phase=Phase.UNKNOWN,
        reason="UnknownState",
        message=f"task {index} is neither in Slurm's answer nor known to have ended",
        native_state="",
        native_flags=[],
    )


def observe_array(
    views: Sequence[SlurmJobView], array: ArrayAttempt, *, total: int
) -> ArrayObservation:
    """The observation of one attempt of an array from Slurm's views of it (see the module
    docstring for the rules). `total`: the tasks of the whole array, for the message."""
    indices = _read(array.indices)
    if not indices:
        raise ValueError("the attempt names no array task")
    tasks = tasks_of(views, indices)
    classified: dict[int, Observation] = {}  # by id(view): the pending record stands for many
    per_task: dict[int, Observation] = {}
    for index, view in tasks.items():
        key = id(view)
        if key not in classified:
            classified[key] = observe([view])
        per_task[index] = classified[key]

    succeeded = set(_read(array.succeeded, indices))
    failed = set(_read(array.failed, indices))
    cancelled = set(_read(array.cancelled, indices))
    pending: list[int] = []
    running: list[int] = []
    unknown: list[int] = []
    unseen: set[int] = set()
    for index in indices:
        obs = per_task.get(index)
        if obs is not None and obs.final:
            for ended in (succeeded, failed, cancelled):
                ended.discard(index)
            {Phase.SUCCEEDED: succeeded, Phase.FAILED: failed}.get(obs.phase, cancelled).add(index)
        elif index in succeeded or index in failed or index in cancelled:
            continue  # ended earlier; its record is gone or (hostile) says otherwise
        elif obs is None:
            unseen.add(index)
            unknown.append(index)
        elif obs.phase is Phase.RUNNING:
            running.append(index)
        elif obs.phase is Phase.UNKNOWN:
            unknown.append(index)
        else:
            pending.append(index)

    first_failed = _first_failed(array.first_failed, per_task, failed, cancelled)
    final = not (pending or running or unknown)
    chosen: Observation
    if final and (failed or cancelled):
        assert first_failed is not None
        phase = Phase.FAILED if failed else Phase.CANCELLED
        seen = per_task.get(first_failed.index)
        chosen = seen if seen is not None and seen.final else _from_end(first_failed, phase)
        decider = first_failed.index
    elif final:
        phase, decider = Phase.SUCCEEDED, indices[0]
        seen = per_task.get(decider)
        chosen = seen if seen is not None and seen.final else _succeeded()
    else:
        phase = Phase.RUNNING if running else Phase.UNKNOWN if unknown else Phase.QUEUED
        decider = (running or unknown or pending)[0]
        chosen = per_task.get(decider) or _unseen(decider)

    record = array.model_copy(
        update={
            "succeeded": compact(succeeded),
            "failed": compact(failed),
            "cancelled": compact(cancelled),
            "first_failed": first_failed,
        }
    )
    if first_failed is not None:
        log_index = first_failed.index
    elif running:
        log_index = running[0]
    else:
        log_index = indices[0]
    done = total - len(indices) + len(succeeded)
    counts = (
        f"{done}/{total} tasks succeeded, {len(running)} running, "
        f"{len(pending) + len(unknown)} pending, {len(failed)} failed"
        + (f", {len(cancelled)} cancelled" if cancelled else "")
    )
    views_seen = list(tasks.values())
    observation = Observation(
        phase=phase,
        reason=chosen.reason if phase is not Phase.SUCCEEDED else "Completed",
        message=f"array: {counts}; task {decider}: {chosen.message}",
        native_state=chosen.native_state,
        native_flags=list(chosen.native_flags),
        slurm_reason=chosen.slurm_reason,
        exit_code=chosen.exit_code,
        signal=chosen.signal,
        final=final,
        infrastructure=phase is Phase.FAILED and chosen.infrastructure,
        nodes=_nodes(per_task, running),
        started_at=min((o.started_at for o in per_task.values() if o.started_at), default=None),
        finished_at=max((v.end_time for v in views_seen if v.is_final and v.end_time), default=None)
        if final
        else None,
    )
    return ArrayObservation(
        observation=observation,
        record=record,
        pending=len(pending) + len(unknown),
        running=len(running),
        unseen=frozenset(unseen),
        log_index=log_index,
    )


def _succeeded() -> Observation:
    return Observation(
        phase=Phase.SUCCEEDED,
        reason="Completed",
        message="Slurm job COMPLETED",
        native_state="COMPLETED",
        native_flags=[],
        final=True,
    )


def _first_failed(
    recorded: TaskEnd | None,
    per_task: Mapping[int, Observation],
    failed: set[int],
    cancelled: set[int],
) -> TaskEnd | None:
    """The task that decides an unsuccessful end: the lowest failed one, else the lowest
    cancelled one; from its record when Slurm still has it, else as remembered."""
    pool = failed or cancelled
    if not pool:
        return None
    index = min(pool)
    obs = per_task.get(index)
    if obs is not None and obs.final:
        return _task_end(index, obs)
    if recorded is not None and recorded.index == index:
        return recorded
    return TaskEnd(index=index)


def _nodes(per_task: Mapping[int, Observation], running: Sequence[int]) -> str | None:
    lists = sorted({n for i in running if (n := per_task[i].nodes)})
    if not lists:
        return None
    shown = ",".join(lists[:MAX_NODE_LISTS])
    more = len(lists) - MAX_NODE_LISTS
    return shown + (f" and {more} more" if more > 0 else "")


def array_total(attempts: Sequence[Attempt]) -> int:
    """The tasks of the whole array: the first array attempt's (each retry runs a part)."""
    first = next((a for a in attempts if a.array is not None), None)
    return len(attempt_indices(first)) if first is not None else 0


def next_indices(attempts: Sequence[Attempt], count: int) -> list[int]:
    """The task indices the next attempt submits: every task of the array for the first
    attempt; for a retry, those of the previous attempt that did not succeed; for an attempt
    that never reached Slurm (declared lost, proven absent), the same as it. Only indices
    below `count` (a status can be written by others: it never widens the array)."""
    previous = attempts[-1] if attempts else None
    if previous is None or previous.array is None:
        return list(range(count))
    recorded = attempt_indices(previous)
    if not recorded:
        return list(range(count))  # an unreadable record: as for a first attempt
    indices = [i for i in recorded if i < count]
    if previous.job_id is not None:
        done = set(_read(previous.array.succeeded, indices))
        indices = [i for i in indices if i not in done]
    # Empty: spec.array.count was lowered below every task left (the caller refuses that);
    # never the whole range again, which would run tasks that succeeded.
    return indices


def shown_index(status: SlurmJobStatus) -> int | None:
    """The task whose log tails the status shows (None: not an array): as the last fold
    chose, else the attempt's first task (a status written before arrays existed has none)."""
    attempt = status.current_attempt
    if attempt is None or attempt.array is None:
        return None
    indices = attempt_indices(attempt)
    chosen = status.array.log_index if status.array is not None else None
    # A status can be written by others: only a task of this attempt names a file.
    if chosen is not None and chosen in indices:
        return chosen
    return indices[0] if indices else 0
