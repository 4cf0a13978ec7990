"""One normalised view of a Slurm job, whatever the REST API version that described it.

State normalisation rules (also used for `/jobs/state` entries and accounting records):

* v0.0.40+ send `job_state` as a list: the base state first, then flags. The first entry that
  is one of the twelve base states becomes `base_state`; every other entry becomes a flag.
* v0.0.38 sends one string, and Slurm shows some flags *instead of* the base state. Those are
  mapped to the base state the job must be in while the flag is shown, plus the flag:
  COMPLETING, STAGE_OUT, CONFIGURING, SIGNALING, RESIZING -> RUNNING (the job still holds its
  nodes; the real outcome is not visible yet, so the job must not look final);
  REQUEUED, REQUEUE_HOLD, REQUEUE_FED, RESV_DEL_HOLD, SPECIAL_EXIT -> PENDING (a requeued or
  held job goes back to the queue under the same id; SPECIAL_EXIT is a requeue-hold, so it is
  not a final FAILED); STOPPED -> SUSPENDED; REVOKED -> CANCELLED (a federation sibling ran it).
* Any other string is kept as a flag and `base_state` is None. A job whose base state is
  unknown is never final, so an unexpected state cannot make the operator forget a live job.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

#: Slurm job ids are uint32 (slurmrestd fact sheet, 5.2: `job_id` "plain uint32"); NO_VAL
#: (0xfffffffe) and INFINITE (0xffffffff) are markers, never ids; 0 is "no job". Federated
#: ids put the cluster id into the high bits, so the whole range below the markers is used.
JOB_ID_MAX = 0xFFFFFFFD
UINT32_MAX = 0xFFFFFFFF
#: A job id as read from slurmrestd: an int (not a bool, a float or a string) in Slurm's range.
JobId = Annotated[int, Field(strict=True, ge=1, le=JOB_ID_MAX)]
#: Counts, offsets, minutes: uint32 fields (NO_VAL and INFINITE included, as v0.0.38 sends them).
Uint32 = Annotated[int, Field(ge=0, le=UINT32_MAX)]
#: Exit codes and signal numbers: whatever fits a C int or a uint32, nothing unbounded.
ExitNumber = Annotated[int, Field(ge=-(2**31), le=UINT32_MAX)]


def valid_job_id(value: object) -> int | None:
    """`value` when it can be a Slurm job id, else None (a bool, a string, 0, out of range)."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= JOB_ID_MAX:
        return value
    return None


class BaseState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"


class JobSource(StrEnum):
    CONTROLLER = "controller"
    ACCOUNTING = "accounting"


ACTIVE_STATES = frozenset({BaseState.PENDING, BaseState.RUNNING, BaseState.SUSPENDED})
# While one of these is set the job still holds resources or its outcome may still change.
NOT_FINAL_FLAGS = frozenset({"COMPLETING", "STAGE_OUT", "CONFIGURING"})

FLAG_SHOWN_AS_STATE: dict[str, BaseState] = {
    "COMPLETING": BaseState.RUNNING,
    "STAGE_OUT": BaseState.RUNNING,
    "CONFIGURING": BaseState.RUNNING,
    "SIGNALING": BaseState.RUNNING,
    "RESIZING": BaseState.RUNNING,
    "REQUEUED": BaseState.PENDING,
    "REQUEUE_HOLD": BaseState.PENDING,
    "REQUEUE_FED": BaseState.PENDING,
    "RESV_DEL_HOLD": BaseState.PENDING,
    "SPECIAL_EXIT": BaseState.PENDING,
    "STOPPED": BaseState.SUSPENDED,
    "REVOKED": BaseState.CANCELLED,
}

_BASE_NAMES = frozenset(s.value for s in BaseState)


def normalise_state(raw: str | Iterable[str] | None) -> tuple[BaseState | None, frozenset[str]]:
    """Split a v0.0.38 state string or a v0.0.40+ state list into (base state, flags)."""
    if raw is None:
        return None, frozenset()
    items = [raw] if isinstance(raw, str) else list(raw)
    names = [s.strip().upper() for s in items if s and s.strip()]
    base: BaseState | None = None
    flags: set[str] = set()
    for name in names:
        if base is None and name in _BASE_NAMES:
            base = BaseState(name)
        else:
            flags.add(name)
    if base is None:
        for name in names:
            if name in FLAG_SHOWN_AS_STATE:
                base = FLAG_SHOWN_AS_STATE[name]
                break
    return base, frozenset(flags)


def state_is_final(base: BaseState | None, flags: frozenset[str]) -> bool:
    return base is not None and base not in ACTIVE_STATES and not (flags & NOT_FINAL_FLAGS)


def split_wait_status(status: int | None) -> tuple[int | None, int | None]:
    """(return code, signal) from a raw wait(2) status as v0.0.38 reports `exit_code`.

    A signalled process has no return code; a process that exited normally has no signal.
    """
    if status is None or status < 0:
        return None, None
    signal = status & 0x7F
    if signal:
        return None, signal
    return (status >> 8) & 0xFF, None


class JobExit(BaseModel):
    """How the batch script ended. Both None while the job has not ended (or is unknown)."""

    model_config = ConfigDict(frozen=True)

    return_code: ExitNumber | None = None
    signal: ExitNumber | None = None


class SlurmJobView(BaseModel):
    """A Slurm job (one heterogeneous component per view) as the operator sees it.

    Times are aware UTC datetimes. Before a job ends, `end_time` is Slurm's *expected* end
    (start + time limit; a year ahead for unlimited jobs), and `start_time` of a pending job
    is the expected start; only `is_final` says whether they are facts.
    `standard_output`/`standard_error` are the expanded paths where the server provides them
    (v0.0.39-v0.0.42 expand `standard_output` itself; v0.0.43+ in `stdout_expanded`); on
    v0.0.38 they are as submitted (`%j` unexpanded), None when not given.
    Every number is bounded (ids by `JobId`, counts by `Uint32`): slurmrestd's answers are
    untrusted, and a Python int has no bound of its own.
    """

    model_config = ConfigDict(frozen=True)

    job_id: JobId
    source: JobSource = JobSource.CONTROLLER
    sluid: str | None = None
    het_job_id: JobId | None = None
    het_job_offset: Uint32 | None = None
    array_job_id: JobId | None = None
    array_task_id: Uint32 | None = None
    array_tasks: str | None = None
    """The array's own record while tasks are pending: Slurm's task string of the tasks it
    stands for ("2-5%2"); None on every started task."""
    name: str = ""
    comment: str | None = None
    user: str | None = None
    user_id: Uint32 | None = None
    """The uid Slurm runs the job as (controller records only); named in messages."""
    partition: str | None = None
    cluster: str | None = None
    raw_state: tuple[str, ...] = ()
    base_state: BaseState | None = None
    flags: frozenset[str] = frozenset()
    reason: str | None = None
    description: str | None = None
    exit: JobExit = JobExit()
    nodes: str | None = None
    node_count: Uint32 | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    standard_output: str | None = None
    standard_error: str | None = None
    working_directory: str | None = None
    constraints: str | None = None
    time_limit_minutes: Uint32 | None = None
    """None when unlimited or unset."""

    @property
    def is_final(self) -> bool:
        """The job has ended and will not change any more (short of a requeue)."""
        return state_is_final(self.base_state, self.flags)

    @property
    def is_heterogeneous(self) -> bool:
        return self.het_job_id is not None


def job_of(view: SlurmJobView) -> int:
    """The id of the job a view is part of: a heterogeneous component's leader, an array
    task's array (the id its submit returned), else its own."""
    return view.het_job_id or view.array_job_id or view.job_id


def by_leader(views: Iterable[SlurmJobView]) -> dict[int, list[SlurmJobView]]:
    """Views grouped by job: a heterogeneous job's components under their leader's id, an
    array's tasks under the array's id."""
    groups: dict[int, list[SlurmJobView]] = {}
    for view in views:
        groups.setdefault(job_of(view), []).append(view)
    return groups


class JobStateEntry(BaseModel):
    """One entry of `GET /jobs/state`: an id as Slurm formats it and the state list.

    `raw_job_id` may be "123", "123+1" (het component 1 of leader 123) or "123_[1-3]" /
    "123_4" (array tasks); `job_id` is the numeric part before "+" or "_".
    """

    model_config = ConfigDict(frozen=True)

    raw_job_id: str
    job_id: JobId
    het_job_offset: Uint32 | None = None
    array_task: str | None = None
    raw_state: tuple[str, ...] = ()
    base_state: BaseState | None = None
    flags: frozenset[str] = frozenset()

    @property
    def is_final(self) -> bool:
        return state_is_final(self.base_state, self.flags)

    @property
    def component_job_id(self) -> int:
        """The component's own job id: Slurm numbers het components consecutively."""
        return self.job_id + (self.het_job_offset or 0)


def leader(views: Sequence[SlurmJobView]) -> SlurmJobView:
    """The component that stands for the whole job (offset 0 of a heterogeneous job; an
    array's own record, whose id is the array's)."""
    return min(views, key=lambda v: (v.het_job_offset or 0, v.job_id != job_of(v), v.job_id))


def group_states(entries: Iterable[JobStateEntry]) -> dict[int, list[JobStateEntry]]:
    """`/jobs/state` entries by the leader's job id (het components share it)."""
    groups: dict[int, list[JobStateEntry]] = defaultdict(list)
    for entry in entries:
        groups[entry.job_id].append(entry)
    return groups
