"""The ResourceFlavor mapping (docs/kueue.md): what a pool's podSet asks of its flavor, and
where the flavors Kueue admitted the job on place it (or why they cannot be honoured)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from slurmjob_operator.api.spec import SlurmJobSpec

#: The ResourceFlavor nodeLabels that say where a Slurm job admitted on the flavor runs (the
#: flavor mapping of docs/kueue.md). A podSet carries the spec's own choices under the same
#: keys as its nodeSelector, so that Kueue assigns only a flavor that agrees with them.
PARTITION_KEY = "slurmjob.io/partition"
SERIES_KEY = "slurmjob.io/gpu-series"
#: A Kubernetes label value (a linear pattern: nothing to backtrack on).
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _label_value(value: str | None) -> bool:
    return value is not None and _LABEL_VALUE.fullmatch(value) is not None


def node_selector(spec: SlurmJobSpec, pool_series: str | None) -> dict[str, str]:
    """What a pool's podSet asks of its flavor: the pool's GPU series, and the spec's one
    partition (a comma list of partitions cannot be one label value: the flavor's partition
    is then checked against it after admission)."""
    selector: dict[str, str] = {}
    if _label_value(spec.partition):
        assert spec.partition is not None
        selector[PARTITION_KEY] = spec.partition
    if _label_value(pool_series):
        assert pool_series is not None
        selector[SERIES_KEY] = pool_series
    return selector


#: A ResourceFlavor's name (a DNS subdomain; a linear pattern).
_FLAVOR_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: What one podSet asks of a flavor: cpu, memory, nvidia.com/gpu, and Kueue's own `pods`.
RESOURCES_PER_PODSET = 4


def flavors_refusal(spec: SlurmJobSpec, assigned: Mapping[str, Collection[str]]) -> str | None:
    """Why the flavors a Workload's status names are not read at all (its status may be
    written by anyone with rights on Workloads): more than its podSets can have been given,
    or a name that is no ResourceFlavor's."""
    names = {f for flavors in assigned.values() for f in flavors}
    if len(names) > RESOURCES_PER_PODSET * len(spec.pools):
        return "the admission assigns more flavors than the podSets ask for"
    bad = sorted(n for n in names if not _FLAVOR_NAME.fullmatch(n))
    if bad:
        return f"the admission names a flavor that is no ResourceFlavor name: {bad[0][:64]!r}"
    return None


def assigned_flavors(workload: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """podSet name -> the ResourceFlavors its admission assigned (one per resource, sorted,
    without repeats)."""
    status = workload.get("status")
    admission = status.get("admission") if isinstance(status, Mapping) else None
    items = admission.get("podSetAssignments") if isinstance(admission, Mapping) else None
    out: dict[str, tuple[str, ...]] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            continue
        flavors = item.get("flavors")
        names = flavors.values() if isinstance(flavors, Mapping) else ()
        out[item["name"]] = tuple(sorted({n for n in names if isinstance(n, str)}))
    return out


def placement(
    spec: SlurmJobSpec,
    assigned: Mapping[str, Collection[str]],
    labels: Mapping[str, Mapping[str, str]],
) -> str | None:
    """The partition the admission's flavors choose for the job (None: they name none, and
    the spec's or the site's default stands). ValueError, naming the flavor, when they cannot
    be honoured: a flavor's partition that is not the spec's, two partitions for one job, a
    GPU series that is not the pool's. Fail-closed: what Kueue counted the quota against is
    where the job runs, or it does not run."""
    partitions: dict[str, str] = {}
    for pool in spec.pools:
        flavors = assigned.get(pool.name)
        if flavors is None:
            raise ValueError(f"the admission assigns no flavor to podSet {pool.name}")
        for flavor in flavors:
            nodes = labels.get(flavor, {})
            part = nodes.get(PARTITION_KEY)
            if part is not None:
                if not _label_value(part):
                    raise ValueError(f"ResourceFlavor {flavor}: {PARTITION_KEY} is not a name")
                partitions[part] = flavor
            series = nodes.get(SERIES_KEY)
            if pool.gpus_per_node and series is not None and series != pool.gpu_series:
                raise ValueError(
                    f"pool {pool.name} asks for GPU series {pool.gpu_series}, but Kueue admitted "
                    f"it on ResourceFlavor {flavor} ({SERIES_KEY}={series})"
                )
    if len(partitions) > 1:
        named = ", ".join(f"{p} ({f})" for p, f in sorted(partitions.items()))
        raise ValueError(f"the admission's flavors name more than one partition: {named}")
    if not partitions:
        return None
    [(chosen, flavor)] = partitions.items()
    wanted = [p.strip() for p in spec.partition.split(",")] if spec.partition else []
    if wanted and chosen not in wanted:
        raise ValueError(
            f"spec.partition is {spec.partition}, but Kueue admitted the job on ResourceFlavor "
            f"{flavor} ({PARTITION_KEY}={chosen})"
        )
    return chosen
