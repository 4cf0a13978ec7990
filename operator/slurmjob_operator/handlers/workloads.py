"""Kueue Workload events (registered only with SLURMJOB_KUEUE): a Workload of a SlurmJob
changed (admitted, evicted, ...), so its SlurmJob is reconciled now rather than at its next
retry. Thin: it finds the SlurmJob and delegates."""

from __future__ import annotations

from typing import Any

import kopf

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.controller.fleet import Fleet
from slurmjob_operator.core.kueue.workload import GROUP, PLURAL, SLURMJOB_LABEL, VERSION, owner_of


async def workload_changed(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    fleet: Fleet | None = memo.get("controller")
    if fleet is None or type == "DELETED":
        return
    owner = owner_of(body)
    if owner is None:
        return
    ref = ObjectRef(str((body.get("metadata") or {}).get("namespace")), owner[0], owner[1])
    await fleet.wakes.attempt(ref, fleet.wake(ref))


def register() -> None:
    """Watch the Workloads the operator made (its label on them)."""
    kopf.on.event(GROUP, VERSION, PLURAL, labels={SLURMJOB_LABEL: kopf.PRESENT})(workload_changed)
