"""What the operator writes in a Workload's status: a condition of its own (PodsReady,
Finished), and the quota given back once an evicted job has stopped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def condition(
    kind: str, reason: str, message: str, generation: int | None, now: str
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
        **({"observedGeneration": generation} if generation is not None else {}),
    }


def with_condition(
    workload: Mapping[str, Any], new: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """The Workload's conditions with `new` set; None when it is set already (nothing to
    write)."""
    status = workload.get("status")
    items = status.get("conditions") if isinstance(status, Mapping) else None
    current = [dict(c) for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []
    for cond in current:
        if cond.get("type") == new["type"]:
            if cond.get("status") == new["status"] and cond.get("reason") == new["reason"]:
                return None
            cond.update(new)
            return current
    return [*current, dict(new)]


#: Evictions after which Kueue's own job integrations set Requeued=True.
REQUEUED_EVICTIONS = frozenset({"Preempted", "NodeFailures"})


def reservation_cleared(
    workload: Mapping[str, Any], reason: str, message: str, now: str
) -> dict[str, Any]:
    """The status patch that gives an evicted Workload's quota back, once its job has stopped
    (what jobframework does: Requeued, QuotaReserved=False "Pending", Admitted=False, no
    admission); without it Kueue never admits the preemptor."""
    conditions: list[dict[str, Any]] = [
        dict(c)
        for c in ((workload.get("status") or {}).get("conditions") or [])
        if isinstance(c, Mapping) and c.get("type") not in ("Requeued", "QuotaReserved", "Admitted")
    ]
    generation = (workload.get("metadata") or {}).get("generation")
    extra = {"observedGeneration": generation} if isinstance(generation, int) else {}
    requeued = "True" if reason in REQUEUED_EVICTIONS else "False"
    conditions += [
        {"type": "Requeued", "status": requeued, "reason": reason or "Evicted",
         "message": message[:32768], "lastTransitionTime": now, **extra},
        {"type": "QuotaReserved", "status": "False", "reason": "Pending",
         "message": message[:32768], "lastTransitionTime": now, **extra},
        {"type": "Admitted", "status": "False", "reason": "NoReservation",
         "message": "The workload has no reservation", "lastTransitionTime": now, **extra},
    ]  # fmt: skip
    return {"conditions": conditions, "admission": None}
