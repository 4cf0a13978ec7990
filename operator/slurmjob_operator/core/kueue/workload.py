"""The Workload the operator makes for a SlurmJob: its name, labels and podSets, its
spec.active, and whether a Workload found under its name is that one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.core import naming
from slurmjob_operator.core.kueue.flavors import node_selector

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


def queue_of(labels: Mapping[str, str]) -> str | None:
    queue = labels.get(QUEUE_LABEL)
    return queue if queue else None


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
