"""An upstream's fate in a submitted dependent's status (`spec.dependsOn`, decided in
`dependencies`): failed for good, so the dependent fails too; or retried, so the dependent
now waits on the upstream's new job.

Pure functions (no I/O, `now` passed in), like `following`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from slurmjob_operator.api.status import AttemptDependency, Phase, SlurmJobStatus
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import FAILED, READY, RUNNING, SUCCEEDED
from slurmjob_operator.core.transition import (
    NORMAL,
    WARNING,
    Event,
    Transition,
    replace_attempt,
    with_conditions,
)
from slurmjob_operator.times import rfc3339


def dependency_failed(
    status: SlurmJobStatus, message: str, generation: int | None, now: datetime
) -> Transition:
    """A submitted job waits in Slurm on an upstream that ended failed for good: its job was
    cancelled, and the SlurmJob ends Failed (not Cancelled: nobody asked for it)."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("nothing was submitted")
    attempt = attempt.model_copy(update={"finished_at": attempt.finished_at or rfc3339(now)})
    reason = Reason.DEPENDENCY_FAILED
    new = with_conditions(
        status,
        [
            (RUNNING, "False", reason, message),
            (READY, "False", reason, message),
            (SUCCEEDED, "False", reason, message),
            (FAILED, "True", reason, message),
        ],
        generation,
        now,
    ).model_copy(
        update={
            "phase": Phase.FAILED,
            "attempts": replace_attempt(status, attempt),
            "completion_time": attempt.finished_at,
            "message": message,
        }
    )
    return Transition(new, (Event(WARNING, reason, message),))


def dependency_repointed(
    status: SlurmJobStatus, records: Sequence[AttemptDependency], message: str
) -> Transition:
    """The pending job now waits on the upstream's new job (it was retried)."""
    attempt = status.current_attempt
    if attempt is None:
        raise ValueError("nothing was submitted")
    attempt = attempt.model_copy(update={"dependencies": list(records) or None})
    new = status.model_copy(update={"attempts": replace_attempt(status, attempt)})
    return Transition(new, (Event(NORMAL, "DependencyRepointed", message),))
