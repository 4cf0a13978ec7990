"""Kueue's admission over SlurmJobs: the Workload the operator owns for each SlurmJob labelled
with a LocalQueue, and what Kueue's conditions on it mean for the submission.

Kueue's integration library (`jobframework`) is Go only, so the contract is kept here the way
an external framework keeps it: one Workload per SlurmJob, created and owned by the operator,
its podSets the job's resources (one per pool; nodes x tasks at once for an array); nothing is
submitted to Slurm before the Workload is admitted; `PodsReady` once the Slurm job runs;
`Finished` when it ends, which releases the quota. `spec.suspend` stays the user's own gate;
Kueue's admission is a second one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.core import naming

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
PLURAL = "workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: The SlurmJob a Workload stands for (the operator's own label: owner references are not
#: garbage-collected on the test bed, and a label lets a person find the pair).
SLURMJOB_LABEL = "slurmjob.io/slurmjob"
#: The spec.suspend the operator last set the Workload's spec.active for ("true"/"false"): a
#: Workload deactivated by Kueue or a person while spec.suspend stayed the same stays so.
SUSPEND_ANNOTATION = "slurmjob.io/suspend"
GPU = "nvidia.com/gpu"
NAME_MAX = 253
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


def workload_name(name: str, uid: str) -> str:
    """`slurmjob-<name>-<uid8>`, at most 253 characters (the uid tells two objects of one name
    apart)."""
    tail = f"-{naming.uid8(uid)}"
    head = f"slurmjob-{name}"[: NAME_MAX - len(tail)].rstrip("-.")
    return head + tail


def pod_sets(spec: SlurmJobSpec) -> list[dict[str, Any]]:
    """One podSet per pool: its nodes (times the tasks of an array that run at once), each
    asking for the pool's CPUs, memory and GPUs per node."""
    at_once = 1
    if spec.array is not None:
        at_once = min(spec.array.count, spec.array.parallelism or spec.array.count)
    sets: list[dict[str, Any]] = []
    for pool in spec.pools:
        requests: dict[str, str] = {"cpu": str(pool.cpus), "memory": f"{pool.memory_gb}Gi"}
        if pool.gpus_per_node:
            requests[GPU] = str(pool.gpus_per_node)
        template: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [
                {"name": "slurm", "image": "slurm", "resources": {"requests": requests}}
            ],
        }
        selector = node_selector(spec, pool.gpu_series if pool.gpus_per_node else None)
        if selector:
            template["nodeSelector"] = selector
        sets.append(
            {"name": pool.name, "count": pool.nodes * at_once, "template": {"spec": template}}
        )
    return sets


def workload_body(
    namespace: str,
    name: str,
    uid: str,
    spec: SlurmJobSpec,
    queue: str,
    priority_class: str | None,
    api_version: str,
    priority: int | None = None,
    suspended: bool = False,
) -> dict[str, Any]:
    """The Workload for a SlurmJob, owned by it; inactive while spec.suspend is true."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(name, uid),
            "namespace": namespace,
            "labels": {SLURMJOB_LABEL: name},
            "annotations": {SUSPEND_ANNOTATION: str(suspended).lower()},
            "ownerReferences": [
                {
                    "apiVersion": api_version,
                    "kind": "SlurmJob",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"queueName": queue, "active": not suspended, "podSets": pod_sets(spec)},
    }
    if priority_class:
        body["spec"]["priorityClassRef"] = {
            "group": GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
        # What Kueue's defaulting webhook would set: the class's value (required with it).
        body["spec"]["priority"] = priority if priority is not None else 0
    return body


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


def active_patch(workload: Mapping[str, Any], suspended: bool) -> dict[str, Any] | None:
    """The merge patch that makes the Workload's spec.active `!spec.suspend`, when spec.suspend
    changed since the operator last set it (None: nothing to write). Kueue deactivates
    Workloads too (a requeuing limit reached), and so may a person: that is not undone while
    spec.suspend stays the same. A Workload without the annotation (the previous release
    made it active, and never changed it) is taken as set for the spec.suspend it has now:
    a job suspended while it ran under the previous release is not cancelled by the
    upgrade."""
    meta = workload.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    mark = notes.get(SUSPEND_ANNOTATION) if isinstance(notes, Mapping) else None
    now = "true" if suspended else "false"
    if mark == now:
        return None
    patch: dict[str, Any] = {"metadata": {"annotations": {SUSPEND_ANNOTATION: now}}}
    if mark is not None:
        patch["spec"] = {"active": not suspended}
    return patch


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
    #: Where the admission's flavors place the job (`placement`), once admitted.
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


def queue_of(labels: Mapping[str, str]) -> str | None:
    queue = labels.get(QUEUE_LABEL)
    return queue if queue else None


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


def owner_of(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the SlurmJob a Workload was made for: its controller owner reference of
    kind SlurmJob, in the Workload's own namespace (owner references cannot cross one)."""
    meta = workload.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else []:
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == "SlurmJob"
            and ref.get("controller") is True
            and isinstance(ref.get("name"), str)
            and isinstance(ref.get("uid"), str)
        ):
            return ref["name"], ref["uid"]
    return None


def _shape(body: Mapping[str, Any]) -> Any:
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        return None
    sets = spec.get("podSets")
    shape = []
    for item in sets if isinstance(sets, list) else []:
        if not isinstance(item, Mapping):
            return None
        containers = ((item.get("template") or {}).get("spec") or {}).get("containers") or []
        requests = [
            ((c.get("resources") or {}).get("requests") or {}) if isinstance(c, Mapping) else None
            for c in (containers if isinstance(containers, list) else [])
        ]
        shape.append((item.get("name"), item.get("count"), requests))
    return spec.get("queueName"), shape


def is_ours(workload: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    """Whether a Workload found under the SlurmJob's Workload name is the one the operator
    makes for it: owned by that SlurmJob, in its queue, asking for its resources. Anyone who
    may create Workloads in the namespace could otherwise make a small one that Kueue admits
    cheaply, ahead of the operator, and have a large job sent to Slurm on it."""
    owner = owner_of(workload)
    mine = owner_of(expected)
    return owner is not None and owner == mine and _shape(workload) == _shape(expected)
