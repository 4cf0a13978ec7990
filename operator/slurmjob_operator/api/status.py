"""The SlurmJob status: what the operator last observed, written through the status subresource.

The models generate the CRD's status schema (`api.crd`), and the operator writes them with
`SlurmJobStatus.dump()`. Conditions follow the Kubernetes convention: a list keyed by `type`,
whose `lastTransitionTime` moves only when `status` flips (`set_condition`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from slurmjob_operator.api.claim import Claim
from slurmjob_operator.api.model import Model
from slurmjob_operator.api.probestatus import AttemptProbe
from slurmjob_operator.api.segmentstatus import AttemptSegment
from slurmjob_operator.times import rfc3339


class _Model(Model):
    # A status a newer release wrote is read by this one (a rollback, or two releases side by
    # side during an upgrade): fields it does not know are left out, not refused.
    model_config = ConfigDict(**{**Model.model_config, "extra": "ignore"})


# metav1.Condition's own limits and patterns, so a condition the operator writes is also a
# valid Kubernetes condition.
CONDITION_TYPE_RE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_RE = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_RFC3339: JsonDict = {"format": "date-time"}

ConditionStatus = Literal["True", "False", "Unknown"]
#: metav1.Condition's bound on a message.
CONDITION_MESSAGE_MAX = 32768

#: The most tasks one SlurmJob array may have (`spec.array.count`). The status keeps the
#: indices of each attempt and their outcomes as compact text: in the worst case (every other
#: task failing) about six characters per index, and the whole object must stay well inside
#: etcd's limit of 1.5 MiB. (Slurm's own default MaxArraySize is 1001.)
MAX_ARRAY_TASKS = 10_000
#: The longest compact text of indices below MAX_ARRAY_TASKS ("0,2,4,...,9998").
MAX_INDEX_TEXT = 6 * MAX_ARRAY_TASKS


class Phase(StrEnum):
    """A one-word summary for `kubectl get`; the conditions carry the detail."""

    PENDING = "Pending"
    SUBMITTING = "Submitting"
    QUEUED = "Queued"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    UNKNOWN = "Unknown"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_PHASES


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})


class Condition(_Model):
    """One observation, in the shape of a Kubernetes metav1.Condition."""

    type: str = Field(
        pattern=CONDITION_TYPE_RE,
        max_length=316,
        description="Condition type in CamelCase, e.g. Submitted, Running, Succeeded, Ready.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        pattern=CONDITION_REASON_RE,
        min_length=1,
        max_length=1024,
        description="Machine-readable reason for the last transition, in CamelCase.",
    )
    message: str = Field(
        default="",
        max_length=CONDITION_MESSAGE_MAX,
        description="Human-readable detail; may be empty.",
    )
    last_transition_time: Annotated[str, Claim("the TTL's start (Finished)")] = Field(
        json_schema_extra=_RFC3339,
        description="When status last changed (RFC 3339).",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was computed from."
    )


class TaskEnd(_Model):
    """How one task of an array ended, kept once seen: Slurm forgets an ended task's record
    (MinJobAge) while its array still runs, and the retry rules may need it later."""

    index: int = Field(ge=0, description="The task's index (SLURM_ARRAY_TASK_ID).")
    native_state: str | None = Field(default=None, description="Slurm's base state of the task.")
    native_flags: list[str] = Field(
        default_factory=list, max_length=32, description="Slurm's state flags of the task."
    )
    reason: str | None = Field(default=None, description="The condition reason it ended with.")
    slurm_reason: str | None = Field(default=None, description="Slurm's state reason.")
    exit_code: int | None = Field(default=None, description="Exit code of the task.")
    signal: int | None = Field(default=None, ge=0, description="Signal that ended the task.")
    infrastructure: bool = Field(
        default=False, description="Whether the cluster, not the program, failed it."
    )


class ArrayAttempt(_Model):
    """The tasks of an array that one attempt ran, and how those that ended did. Indices are
    compact lists of ranges ("0-19", "5,13")."""

    indices: str = Field(
        max_length=MAX_INDEX_TEXT, description="Task indices this attempt submitted."
    )
    succeeded: str = Field(
        default="", max_length=MAX_INDEX_TEXT, description="Indices of its tasks that succeeded."
    )
    failed: str = Field(
        default="", max_length=MAX_INDEX_TEXT, description="Indices of its tasks that failed."
    )
    cancelled: str = Field(
        default="",
        max_length=MAX_INDEX_TEXT,
        description="Indices of its tasks that were cancelled (or preempted).",
    )
    first_failed: TaskEnd | None = Field(
        default=None,
        description="The lowest-index task that failed, else the lowest cancelled one.",
    )


class AttemptDependency(_Model):
    """A Slurm dependency an attempt was submitted with: on the upstream SlurmJob's job."""

    name: str = Field(description="The upstream SlurmJob.")
    uid: str = Field(description="Its uid (a new object of the same name is another job).")
    attempt: int = Field(ge=1, description="The upstream attempt whose Slurm job it names.")
    job_id: int = Field(ge=1, description="That Slurm job's id.")
    type: str = Field(description="The Slurm dependency type, e.g. afterok.")


class Attempt(_Model):
    """One submission to Slurm. A retry is a new attempt with its own job and staging dir."""

    number: int = Field(ge=1, description="1 for the first attempt, counting up on retries.")
    job_name: str = Field(description="Slurm job name used to find the job again.")
    job_id: int | None = Field(
        default=None, ge=1, description="Slurm job id; the leader's id for a heterogeneous job."
    )
    sluid: str | None = Field(default=None, description="Slurm's unique job id, when it has one.")
    cluster: Annotated[str | None, Claim("routing")] = Field(
        default=None,
        description=(
            "Name of the Slurm cluster the attempt was submitted to (unset: written by a "
            "release with one cluster, which is the first of the clusters file)."
        ),
    )
    staging_dir: str | None = Field(
        default=None, description="Staging directory of this attempt, as the operator sees it."
    )
    submitted_at: str | None = Field(
        default=None, json_schema_extra=_RFC3339, description="When the submit was sent."
    )
    started_at: str | None = Field(
        default=None, json_schema_extra=_RFC3339, description="When Slurm started the job."
    )
    finished_at: str | None = Field(
        default=None, json_schema_extra=_RFC3339, description="When Slurm ended the job."
    )
    native_state: str | None = Field(
        default=None, description="Slurm's base job state, e.g. PENDING, RUNNING, COMPLETED."
    )
    native_flags: list[str] = Field(
        default_factory=list, description="Slurm's state flags, e.g. REQUEUED, COMPLETING."
    )
    reason: str | None = Field(default=None, description="Slurm's state reason, e.g. Resources.")
    exit_code: int | None = Field(default=None, description="Exit code of the batch step.")
    signal: int | None = Field(default=None, ge=0, description="Signal that ended the job.")
    confirmed: bool = Field(
        default=False, description="Whether the submission receipt was confirmed with Slurm."
    )
    declared_lost: bool = Field(
        default=False,
        description=(
            "Set from the slurmjob.io/declare-lost annotation: an unconfirmed submission a "
            "person checked by hand and declared lost, so a new attempt may be submitted."
        ),
    )
    proven_absent_at: str | None = Field(
        default=None,
        json_schema_extra=_RFC3339,
        description=(
            "When the operator proved this unconfirmed attempt absent from Slurm (neither in "
            "the controller nor in accounting after the fencing window): a new attempt "
            "follows, and a job of this attempt that appears later is cancelled."
        ),
    )
    retry_of: int | None = Field(
        default=None, ge=1, description="Number of the attempt this one retries."
    )
    retry_action: Annotated[str | None, Claim("the attempt budgets")] = Field(
        default=None,
        description="What the retry rules decided when this attempt failed: Retry, Ignore or Fail.",
    )
    array: ArrayAttempt | None = Field(
        default=None, description="For a job array: the tasks this attempt ran and their ends."
    )
    dependencies: list[AttemptDependency] | None = Field(
        default=None,
        max_length=16,
        description=(
            "The Slurm dependencies this attempt was submitted with (afterok on each upstream "
            "SlurmJob's current job), repointed when an upstream is retried."
        ),
    )
    probe: Annotated[AttemptProbe | None, Claim("the probe's keys, avoid list and retries")] = (
        Field(default=None, description="The collective probe of this attempt, when it has one.")
    )
    segment: Annotated[AttemptSegment | None, Claim("a chain's segments and time")] = Field(
        default=None, description="The walltime segment this attempt ran (spec.walltime)."
    )


class LogTail(_Model):
    """The end of one log file, as read back from the shared storage."""

    tail: str = Field(
        default="",
        description=(
            "The last whole lines of the file, redacted; at most SLURMJOB_STATUS_TAIL_BYTES "
            "(default 8 KiB)."
        ),
    )
    truncated: bool = Field(default=False, description="Whether earlier content was left out.")
    bytes: int = Field(default=0, ge=0, description="Size of the whole file in bytes.")
    lines: int = Field(default=0, ge=0, description="Number of lines in the tail.")


class Logs(_Model):
    stdout: LogTail | None = Field(default=None, description="Standard output of the job.")
    stderr: LogTail | None = Field(default=None, description="Standard error of the job.")


class ArrayStatus(_Model):
    """A job array's tasks by state, across attempts (a task that succeeded in an earlier
    attempt counts as succeeded)."""

    total: int = Field(ge=0, description="Tasks of the array (spec.array.count).")
    pending: int = Field(default=0, ge=0, description="Tasks waiting to start.")
    running: int = Field(default=0, ge=0, description="Tasks running (or still finishing).")
    succeeded: int = Field(default=0, ge=0, description="Tasks that succeeded.")
    failed: int = Field(default=0, ge=0, description="Tasks of the current attempt that failed.")
    cancelled: int = Field(
        default=0, ge=0, description="Tasks of the current attempt that were cancelled."
    )
    failed_indices: str = Field(
        default="",
        max_length=MAX_INDEX_TEXT,
        description=(
            "Indices of the failed and cancelled tasks, as ranges (e.g. 5,13): what a retry "
            "resubmits."
        ),
    )
    log_index: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The task whose log tails status.logs holds: the first failed one, else the first "
            "running one, else the first of the attempt."
        ),
    )


class SlurmJobStatus(_Model):
    """Observed state of a SlurmJob."""

    phase: Phase | None = Field(default=None, description="One-word summary of the job's state.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Observations, keyed by type."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed from."
    )
    attempts: list[Attempt] = Field(
        default_factory=list, description="Submissions to Slurm, oldest first."
    )
    slurm_job_id: int | None = Field(
        default=None, ge=1, description="Slurm job id of the current attempt."
    )
    nodes: str | None = Field(default=None, description="Nodes allocated to the current attempt.")
    start_time: str | None = Field(
        default=None, json_schema_extra=_RFC3339, description="When the job started running."
    )
    completion_time: str | None = Field(
        default=None, json_schema_extra=_RFC3339, description="When the job finished."
    )
    message: str | None = Field(default=None, description="Human-readable summary.")
    logs: Logs | None = Field(default=None, description="Tails of the job's log files.")
    array: ArrayStatus | None = Field(
        default=None, description="For a job array: its tasks by state."
    )
    next_attempt_at: str | None = Field(
        default=None,
        json_schema_extra=_RFC3339,
        description="When the scheduled retry will be submitted.",
    )
    attempt: int | None = Field(
        default=None,
        ge=1,
        description="Number of the current attempt (kept with every write, for kubectl get).",
    )
    cluster: str | None = Field(
        default=None,
        description="Slurm cluster of the current attempt, where the attempt names one.",
    )
    segment: int | None = Field(
        default=None,
        ge=0,
        description="Index of the current walltime segment (spec.walltime), for kubectl get.",
    )
    duration: str | None = Field(
        default=None,
        max_length=32,
        description=(
            "How long the current attempt ran, from startTime to completionTime (e.g. 1h2m3s), "
            "written when it ends (kubectl get -o wide)."
        ),
    )

    @classmethod
    def parse(cls, obj: Mapping[str, Any] | None) -> SlurmJobStatus:
        """The status from a resource body's `status`, ignoring fields this version doesn't know."""
        known = {f.alias or name for name, f in cls.model_fields.items()}
        return cls.model_validate({k: v for k, v in (obj or {}).items() if k in known})

    def dump(self) -> dict[str, Any]:
        """JSON-ready camelCase dict without nulls (the schema has no nullable fields)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @property
    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


def get_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """A new list with condition `type_` upserted in place (others keep their order).

    `lastTransitionTime` moves to `now` only when the condition is new or its status flips;
    a changed reason or message alone keeps the old time.
    """
    old = get_condition(conditions, type_)
    when = old.last_transition_time if old is not None and old.status == status else rfc3339(now)
    if len(message) > CONDITION_MESSAGE_MAX:  # a message may echo what a spec wrote
        message = message[: CONDITION_MESSAGE_MAX - 1] + "\u2026"
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=generation,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]
