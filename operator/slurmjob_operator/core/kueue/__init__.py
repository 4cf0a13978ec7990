"""Kueue's admission over SlurmJobs: the Workload the operator owns for each SlurmJob labelled
with a LocalQueue, and what Kueue's conditions on it mean for the submission.

Kueue's integration library (`jobframework`) is Go only, so the contract is kept here the way
an external framework keeps it: one Workload per SlurmJob, created and owned by the operator,
its podSets the job's resources (one per pool; nodes x tasks at once for an array); nothing is
submitted to Slurm before the Workload is admitted; `PodsReady` once the Slurm job runs;
`Finished` when it ends, which releases the quota. `spec.suspend` stays the user's own gate;
Kueue's admission is a second one.

The parts: `workload` (the Workload's name, labels, podSets and body, and whether one found
is the operator's), `admission` (what Kueue's conditions on it say), `flavors` (what a podSet
asks of its ResourceFlavor, and where the admitted flavors place the job), `status` (what the
operator writes in the Workload's status).
"""

from __future__ import annotations

from slurmjob_operator.core.kueue.admission import (
    KUEUE_UNAVAILABLE,
    OPERATOR_WAITS,
    TEXT_MAX,
    Admission,
    Verdict,
    holds_quota,
    kueue_says,
    verdict,
)
from slurmjob_operator.core.kueue.flavors import (
    PARTITION_KEY,
    RESOURCES_PER_PODSET,
    SERIES_KEY,
    assigned_flavors,
    flavors_refusal,
    node_selector,
    placement,
)
from slurmjob_operator.core.kueue.status import (
    REQUEUED_EVICTIONS,
    condition,
    reservation_cleared,
    with_condition,
)
from slurmjob_operator.core.kueue.workload import (
    GPU,
    GROUP,
    NAME_MAX,
    PLURAL,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    SLURMJOB_LABEL,
    SUSPEND_ANNOTATION,
    VERSION,
    active_patch,
    is_ours,
    owner_of,
    pod_sets,
    queue_of,
    workload_body,
    workload_name,
)

# Everything core/kueue.py offered before it was split stays importable from here, where the
# controller looks for it; the rest of the operator imports from the parts.
__all__ = [
    "GPU",
    "GROUP",
    "KUEUE_UNAVAILABLE",
    "NAME_MAX",
    "OPERATOR_WAITS",
    "PARTITION_KEY",
    "PLURAL",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "REQUEUED_EVICTIONS",
    "RESOURCES_PER_PODSET",
    "SERIES_KEY",
    "SLURMJOB_LABEL",
    "SUSPEND_ANNOTATION",
    "TEXT_MAX",
    "VERSION",
    "Admission",
    "Verdict",
    "active_patch",
    "assigned_flavors",
    "condition",
    "flavors_refusal",
    "holds_quota",
    "is_ours",
    "kueue_says",
    "node_selector",
    "owner_of",
    "placement",
    "pod_sets",
    "queue_of",
    "reservation_cleared",
    "verdict",
    "with_condition",
    "workload_body",
    "workload_name",
]
