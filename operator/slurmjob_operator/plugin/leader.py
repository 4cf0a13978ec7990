"""`kubectl slurmjob leader`: which replica of the operator leads, read from its Lease.

The replicas elect a leader on a `coordination.k8s.io/v1` Lease in the operator's namespace;
its holder is the leader's pod name. Pods carry no leader label: labelling its own pod needed
`patch` on every pod of that namespace. Reading the Lease needs `get` (one Lease, `--lease`)
or `list` (every Lease of the namespace) on `leases` there, as `kubectl get lease` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from slurmjob_operator.plugin.render import age, cell, table
from slurmjob_operator.times import rfc3339


def micro_time(value: object) -> datetime | None:
    """A Lease's MicroTime (`2026-01-02T03:04:05.123456Z`); None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def expired(spec: Mapping[str, Any], now: datetime) -> bool:
    """Not renewed within its duration: no replica holds it now (the last one stopped or lost
    the apiserver), whatever `holderIdentity` still says."""
    renewed = micro_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int) or isinstance(duration, bool):
        return True
    return renewed + timedelta(seconds=duration) < now


def leader_table(leases: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """One row per Lease: its holder (`<none>` once given up, `(expired)` when not renewed in
    time), when it was renewed, how long a renewal holds and how often it changed hands."""
    rows = []
    for lease in leases:
        metadata = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        holder = cell(spec.get("holderIdentity") or "<none>", 80)
        if spec.get("holderIdentity") and expired(spec, now):
            holder += " (expired)"
        renewed = micro_time(spec.get("renewTime"))
        rows.append(
            [
                cell(metadata.get("name"), 80),
                holder,
                f"{age(rfc3339(renewed), now)} ago" if renewed else "-",
                cell(spec.get("leaseDurationSeconds")),
                cell(spec.get("leaseTransitions") or 0),
            ]
        )
    return table(["LEASE", "HOLDER", "RENEWED", "DURATION", "TRANSITIONS"], rows)
