"""Walltime segments (spec.walltime): a run longer than one job may last, as a chain of
attempts the operator owns.

Each segment is one attempt (own Slurm job, staging, logs), submitted with the same write-ahead
record and adoption as any attempt. Before a segment is sent, `plan_segment` says its index and
time limit (the segment time, shortened to what is left of the total); once it ended,
`after_segment` says whether the chain goes on at once (outside the retry budget and its
backoff), ends `WalltimeExhausted` (total time or segment count spent) or `NoProgress` (two
segments in a row left the checkpoint directory as they found it), or is decided by the other
rules (exit 0 ends it Succeeded, any other end is judged as any attempt's).

Pure: what Slurm, the partition and the checkpoint directory said come in as values.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from slurmjob_operator.api.segmentstatus import AttemptSegment
from slurmjob_operator.api.status import Attempt, ConditionStatus, Phase, SlurmJobStatus
from slurmjob_operator.api.walltime import SIGNAL_SLACK_SECONDS, WalltimeSpec, warning_problem
from slurmjob_operator.core.claims import ChainLimit, never_ran, segment_of
from slurmjob_operator.core.limits import Snapshot, partition_of
from slurmjob_operator.core.reasons import ConditionType, Reason
from slurmjob_operator.core.states import Observation
from slurmjob_operator.core.transition import (
    NORMAL,
    WARNING,
    Event,
    Transition,
    next_attempt_due,
    replace_attempt,
    with_conditions,
)
from slurmjob_operator.times import parse_rfc3339, rfc3339

#: The `retryAction` of a segment the chain went on from.
SEGMENT_ACTION = "Segment"
#: A checkpoint directory that could not be read in full (too many entries, too deep, gone).
UNKNOWN_CHECKPOINT = "unknown"


def checkpoint_digest(entries: Iterable[tuple[str, int, int, int]]) -> str:
    """The digest of a checkpoint directory's entries (relative path, type bits, size, mtime
    in ns), in any order: a change of any name, size or time changes it."""
    h = hashlib.sha256()
    for path, kind, size, mtime in sorted(entries):
        h.update(f"{path}\0{kind}\0{size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return "sha256:" + h.hexdigest()


#: What a checkpoint directory holds before the first segment: nothing.
EMPTY_CHECKPOINT = checkpoint_digest(())


class SegmentRefused(ValueError):
    """The walltime cannot run on this partition and tenant as written (InvalidSpec)."""


class SegmentTimeUnknown(RuntimeError):
    """The segment time derives from a partition MaxTime that cannot be read now: wait."""


@dataclass(frozen=True)
class SegmentPlan:
    index: int
    minutes: int
    previous_job_id: int | None = None

    @property
    def resume(self) -> bool:
        return self.index > 0

    def record(self) -> AttemptSegment:
        return AttemptSegment(
            index=self.index, limit_minutes=self.minutes, previous_job_id=self.previous_job_id
        )


@dataclass(frozen=True)
class PartitionTime:
    """What the cluster says of the partition's MaxTime: `read` False when it could not be
    read; `minutes` None when it is unlimited or unset."""

    read: bool
    minutes: int | None = None
    is_list: bool = False


def partition_time(partition: str | None, snapshot: Snapshot | None) -> PartitionTime:
    """The MaxTime of the partition a job goes to (None: the cluster's default one), as the
    limits check reads it; a list of partitions has none to derive from."""
    if partition is not None and "," in partition:
        return PartitionTime(read=True, is_list=True)
    found = partition_of(partition, snapshot) if snapshot is not None else None
    if found is None:
        return PartitionTime(read=False)
    return PartitionTime(read=True, minutes=found.max_time_minutes)


def chain_limit(site_max: int, tenant_max: int | None, tenant: str | None) -> ChainLimit:
    """The longest a chain may run: the site's maximum, or the tenant's if lower."""
    if tenant_max is not None and tenant_max < site_max:
        return ChainLimit(tenant_max, f"tenant {tenant}'s maxTotalTime")
    return ChainLimit(site_max, "the site's maximum (SLURMJOB_MAX_TOTAL_TIME)")


def check_total(walltime: WalltimeSpec, limit: ChainLimit) -> None:
    """SegmentRefused when totalTime is longer than the site's maximum or the tenant's."""
    if walltime.total_minutes > limit.minutes:
        raise SegmentRefused(
            f"spec.walltime.totalTime: {walltime.total_minutes} minutes is longer than "
            f"{limit.whose} of {limit.minutes} minutes"
        )


def segment_minutes(
    walltime: WalltimeSpec, partition: PartitionTime, tenant_max: int | None, tenant: str | None
) -> int:
    """The full segment time: the spec's, else the smaller of MaxTime and the tenant's
    maxTimeLimit. Raises SegmentRefused or SegmentTimeUnknown."""
    own = walltime.segment_minutes
    where = "spec.walltime.segmentTime"
    if own is not None:
        if tenant_max is not None and own > tenant_max:
            raise SegmentRefused(
                f"{where}: {own} minutes is longer than tenant {tenant}'s maxTimeLimit of "
                f"{tenant_max} minutes"
            )
        if partition.minutes is not None and own > partition.minutes:
            raise SegmentRefused(
                f"{where}: {own} minutes exceeds the partition's MaxTime ({partition.minutes} "
                "minutes)"
            )
        minutes = own
    elif partition.is_list:
        raise SegmentRefused(f"{where}: required when spec.partition is a list of partitions")
    elif not partition.read:
        raise SegmentTimeUnknown(
            "the partition's MaxTime, which each walltime segment's length derives from, "
            "cannot be read now (set spec.walltime.segmentTime, or wait)"
        )
    elif partition.minutes is None:
        raise SegmentRefused(
            f"{where}: required: the partition's MaxTime is unlimited or unset, so a segment "
            "has no length to derive"
        )
    else:
        minutes = min(partition.minutes, tenant_max or partition.minutes)
    problem = warning_problem(walltime.warning_seconds, minutes)
    if problem:
        raise SegmentRefused(f"spec.walltime.warningSeconds: {problem}")
    return minutes


def ran_seconds(attempt: Attempt) -> float:
    """How long an attempt's job ran (0 when it never started or has not ended)."""
    try:
        start = parse_rfc3339(attempt.started_at)
        end = parse_rfc3339(attempt.finished_at)
    except ValueError:
        return 0.0
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds())


def used_seconds(attempts: Sequence[Attempt]) -> float:
    """The time the chain's segments ran, a segment cut short (an eviction) included."""
    return sum(ran_seconds(a) for a in attempts if segment_of(a) is not None)


def plan_segment(walltime: WalltimeSpec, attempts: Sequence[Attempt], full: int) -> SegmentPlan:
    """The next segment: its index (one past the last segment's), its limit (`full` minutes,
    shortened to what the total time has left, never below what the warning needs)."""
    last = attempts[-1] if attempts else None
    left = walltime.total_minutes * 60 - used_seconds(attempts)
    floor = math.ceil((walltime.warning_seconds + SIGNAL_SLACK_SECONDS) / 60)
    minutes = min(full, max(math.ceil(left / 60), floor))
    record = segment_of(last) if last is not None else None
    if last is None or record is None:
        return SegmentPlan(0, minutes, last.job_id if last is not None else None)
    if never_ran(last):
        # The same segment again, resuming from the same job as it would have.
        return SegmentPlan(record.index, minutes, record.previous_job_id)
    return SegmentPlan(record.index + 1, minutes, last.job_id)


def segment_end(observation: Observation, walltime: WalltimeSpec) -> str | None:
    """How an ended segment lets the chain go on, or None when it does not: its time limit,
    the program's continueExitCode, a preemption (not a user's scancel) or a lost node."""
    state = observation.native_state
    if state == "TIMEOUT":
        return "Timeout"
    code = walltime.continue_exit_code
    if code is not None and state == "FAILED" and observation.exit_code == code:
        return "ContinueExitCode"
    if state == "PREEMPTED":
        return "Preempted"
    if state == "NODE_FAIL":
        return "NodeFail"
    return None


_ENDS = {
    "Timeout": "reached its time limit",
    "ContinueExitCode": "exited with continueExitCode (checkpointed)",
    "Preempted": "was preempted",
    "NodeFail": "lost a node",
}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def after_segment(
    status: SlurmJobStatus,
    walltime: WalltimeSpec,
    how: str,
    checkpoint: str | None,
    generation: int | None,
    now: datetime,
) -> Transition:
    """A segment ended `how` (`segment_end`) with the checkpoint directory at `checkpoint`
    (None: not read): the next segment at once, else the chain's end."""
    attempt = status.current_attempt
    assert attempt is not None
    record = segment_of(attempt)
    assert record is not None
    earlier = status.attempts[-2] if len(status.attempts) > 1 else None
    before_seg = segment_of(earlier) if earlier is not None else None
    if record.index == 0:
        before: str | None = EMPTY_CHECKPOINT
    else:
        before = before_seg.checkpoint if before_seg is not None else None
    known = checkpoint is not None and checkpoint != UNKNOWN_CHECKPOINT
    progress = not known or before in (None, UNKNOWN_CHECKPOINT) or checkpoint != before
    segment = record.model_copy(
        update={"ended": how, "checkpoint": checkpoint, "progress": progress}
    )
    attempt = attempt.model_copy(update={"segment": segment})
    status = status.model_copy(update={"attempts": replace_attempt(status, attempt)})
    index = segment.index
    used = used_seconds(status.attempts)
    total = walltime.total_minutes * 60
    head = f"segment {index} (Slurm job {attempt.job_id}) {_ENDS.get(how, how)}"
    if not progress and before_seg is not None and before_seg.progress is False:
        text = (
            f"{head}; nothing under the checkpoint directory changed in segments {index - 1} "
            f"and {index}: the chain stops (NoProgress)"
        )
        return _chain_failed(status, Reason.NO_PROGRESS, text, generation, now)
    if used >= total:
        text = f"{head}; the chain ran {_minutes(used)}, its totalTime of {_minutes(total)}"
        return _chain_failed(status, Reason.WALLTIME_EXHAUSTED, text, generation, now)
    if index + 1 >= walltime.max_segments:
        text = f"{head}; the chain ran its maxSegments ({walltime.max_segments}) segments"
        return _chain_failed(status, Reason.WALLTIME_EXHAUSTED, text, generation, now)
    text = f"{head}: segment {index + 1} is due now ({_minutes(used)} of {_minutes(total)} used)"
    conditions = (ConditionType.READY, ConditionType.RUNNING, ConditionType.FAILED)
    due = next_attempt_due(
        status, SEGMENT_ACTION, Reason.SEGMENT_CONTINUED, text, now, conditions, generation, now
    )
    return Transition(due.status, (Event(NORMAL, Reason.SEGMENT_CONTINUED, text),))


def _chain_failed(
    status: SlurmJobStatus, reason: Reason, text: str, generation: int | None, now: datetime
) -> Transition:
    attempt = status.current_attempt
    assert attempt is not None
    attempt = attempt.model_copy(update={"retry_action": "Fail"})
    updates: list[tuple[str, ConditionStatus, str, str]] = [
        (ConditionType.RUNNING, "False", reason, text),
        (ConditionType.READY, "False", reason, text),
        (ConditionType.SUCCEEDED, "False", reason, text),
        (ConditionType.FAILED, "True", reason, text),
    ]
    new = with_conditions(status, updates, generation, now).model_copy(
        update={
            "attempts": replace_attempt(status, attempt),
            "phase": Phase.FAILED,
            "message": text,
            "completion_time": status.completion_time or rfc3339(now),
        }
    )
    return Transition(new, (Event(WARNING, reason, text),))
