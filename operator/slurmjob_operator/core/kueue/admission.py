"""What Kueue's conditions on a Workload say: the verdict the submission waits on, and
whether the Workload still holds quota."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from slurmjob_operator.core.kueue.workload import NAME_MAX

#: The verdict's reason when Kueue could not be asked (the Kueue conditions are left as they are).
KUEUE_UNAVAILABLE = "KueueUnavailable"
#: The waits the operator itself says (Kueue was not asked, or its answer is not to be used).
OPERATOR_WAITS = frozenset(
    {
        KUEUE_UNAVAILABLE,
        "WorkloadNotOurs",
        "PriorityClassNotFound",
        "LocalQueueNotFound",
        "FlavorNotFound",
    }
)


class Admission(Enum):
    MISSING = "missing"  # no Workload yet
    WAITING = "waiting"  # no quota reserved, or reserved and admission checks pending
    ADMITTED = "admitted"
    EVICTED = "evicted"  # Kueue asks for the job to stop (preemption, a queue change)
    FINISHED = "finished"


@dataclass(frozen=True)
class Verdict:
    admission: Admission
    reason: str = ""
    message: str = ""
    cluster_queue: str | None = None
    #: QuotaReserved is True (admission checks may still be pending).
    reserved: bool = False
    #: Where the admission's flavors place the job (`flavors.placement`), once admitted.
    partition: str | None = None
    #: Why the admission's flavors cannot be honoured for this spec (nothing is submitted).
    refusal: str | None = None


def _conditions(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = workload.get("status")
    items = status.get("conditions") if isinstance(status, Mapping) else None
    out: dict[str, Mapping[str, Any]] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("type"), str):
            out[item["type"]] = item
    return out


def _true(conds: Mapping[str, Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    cond = conds.get(kind)
    return cond if cond is not None and cond.get("status") == "True" else None


#: At most this much of a reason or message read from a Workload (its status may be written by
#: anyone with rights on Workloads; Kueue's own are far shorter).
TEXT_MAX = 1024


def _said(cond: Mapping[str, Any], key: str, default: str = "") -> str:
    value = cond.get(key)
    return (value if isinstance(value, str) and value else default)[:TEXT_MAX]


def verdict(workload: Mapping[str, Any] | None) -> Verdict:
    """What Kueue says of the Workload now (its reasons and messages bounded)."""
    if workload is None:
        return Verdict(Admission.MISSING)
    conds = _conditions(workload)
    status = workload.get("status")
    admission = status.get("admission") if isinstance(status, Mapping) else None
    queue = admission.get("clusterQueue") if isinstance(admission, Mapping) else None
    queue = queue[:NAME_MAX] if isinstance(queue, str) else None
    if (done := _true(conds, "Finished")) is not None:
        return Verdict(Admission.FINISHED, _said(done, "reason"), _said(done, "message"))
    if (evicted := _true(conds, "Evicted")) is not None:
        return Verdict(
            Admission.EVICTED, _said(evicted, "reason"), _said(evicted, "message"), queue
        )
    reserved = _true(conds, "QuotaReserved") is not None
    if _true(conds, "Admitted") is not None and reserved:
        return Verdict(Admission.ADMITTED, "Admitted", "", queue, reserved=True)
    if reserved:
        checks = conds.get("Admitted") or {}
        message = _said(checks, "message", "quota reserved; admission checks pending")
        return Verdict(
            Admission.WAITING, _said(checks, "reason", "QuotaReserved"), message, queue, True
        )
    pending = conds.get("QuotaReserved") or {}
    message = _said(pending, "message", "waiting for quota in its ClusterQueue")
    return Verdict(Admission.WAITING, _said(pending, "reason", "Pending"), message, queue)


def kueue_says(found: Verdict) -> bool:
    """Kueue's own answer that the Workload has no quota now (not reserved, and not a wait
    the operator says)."""
    return (
        found.admission is Admission.WAITING
        and not found.reserved
        and found.reason not in OPERATOR_WAITS
    )


def holds_quota(workload: Mapping[str, Any]) -> bool:
    """Kueue still counts the Workload's quota: QuotaReserved, or an admission left."""
    status = workload.get("status")
    admission = status.get("admission") if isinstance(status, Mapping) else None
    return _true(_conditions(workload), "QuotaReserved") is not None or admission is not None
