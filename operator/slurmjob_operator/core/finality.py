"""When a SlurmJob is over: the one predicate every part asks, and the `Finished` condition.

Final means nothing will change the job's outcome any more: a terminal phase (Succeeded,
Failed, Cancelled) with no next attempt due, or Unknown because Slurm forgot the job without a
trace (reason JobLost, never resubmitted; any other Unknown may still be resolved). A refusal
made before anything was submitted (an invalid spec, a limit exceeded, a failed dependency) is
not final: an edit wakes it and it is decided again, so `kubectl wait --for=condition=Finished`
must not return on it. Since the spec is immutable but for suspend and ttlSecondsAfterFinished
(the CRD's transition rules), the edits left are a label (a tenant's required Kueue queue) and
those two fields, which make a new generation; a spec is fixed by a new SlurmJob. Nothing
here relies on the CRD's rule: a spec changed under an older CRD is decided again as before.
An attempt
followed by another (a retry, a probe's new attempt, a walltime segment) is written as Pending
with its next due time, so nothing keyed on "final" fires in between.

Dependencies, Kueue's Finished mark on the Workload, deletion and the `Finished` condition all
ask `is_final`; `docs/states.md` ("Final or not") tabulates it.
"""

from __future__ import annotations

from datetime import datetime

from slurmjob_operator.api.status import (
    ConditionStatus,
    Phase,
    SlurmJobStatus,
    get_condition,
    set_condition,
)
from slurmjob_operator.core.reasons import ConditionType, Reason

FINISHED = ConditionType.FINISHED

#: Refusals decided again when the SlurmJob is edited (while nothing was submitted): a label,
#: or a new generation (suspend, ttlSecondsAfterFinished; the rest of the spec is immutable).
REDECIDED = frozenset({Reason.INVALID_SPEC, Reason.LIMIT_EXCEEDED, Reason.DEPENDENCY_FAILED})


def is_lost(status: SlurmJobStatus) -> bool:
    """Slurm forgot the job without a trace (`lost`): Unknown for good, nobody asks again."""
    ready = get_condition(status.conditions, ConditionType.READY)
    return status.phase is Phase.UNKNOWN and ready is not None and ready.reason == Reason.JOB_LOST


def redecided_refusal(status: SlurmJobStatus) -> str | None:
    """The reason of a refusal that an edit decides again (nothing was ever submitted), or
    None."""
    if status.phase is not Phase.FAILED or status.current_attempt is not None:
        return None
    failed = get_condition(status.conditions, ConditionType.FAILED)
    if failed is None or failed.status != "True" or failed.reason not in REDECIDED:
        return None
    return failed.reason


def is_final(status: SlurmJobStatus) -> bool:
    """Whether the job is over for good (see the module's docstring)."""
    phase = status.phase
    if phase is None or status.next_attempt_at is not None:
        return False
    if phase is Phase.UNKNOWN:
        return is_lost(status)
    return phase.is_terminal and redecided_refusal(status) is None


def with_finished(status: SlurmJobStatus, generation: int | None, now: datetime) -> SlurmJobStatus:
    """`status` with its `Finished` condition in step with `is_final`: True with the phase as
    its reason; False with the refusal's reason on a refusal an edit decides again, or
    NotFinished on a job that was final and is not any more; absent on a job never final."""
    old = get_condition(status.conditions, FINISHED)
    value: ConditionStatus
    if is_final(status):
        assert status.phase is not None
        value, reason = "True", status.phase.value
    elif (refusal := redecided_refusal(status)) is not None:
        value, reason = "False", refusal
    elif old is not None:
        value, reason = "False", Reason.NOT_FINISHED
    else:
        return status
    message = status.message or ""
    if old is not None and (old.status, old.reason, old.message) == (value, reason, message):
        return status
    conditions = set_condition(status.conditions, FINISHED, value, reason, message, generation, now)
    return status.model_copy(update={"conditions": conditions})
