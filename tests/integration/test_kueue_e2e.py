"""Kueue's admission over SlurmJobs, on a real Kueue (v0.17, built from Go modules and run
against the test bed's kube-apiserver; see tests/k8s/kueue.py) and the real Slurm 26.05.

One ClusterQueue holds the GPUs of the test bed's two nodes (2 h100 on n1, 2 a100 on n2) as two
ResourceFlavors whose nodeLabels name the GPU series and the partition `short` (the flavor
mapping of docs/kueue.md); two LocalQueues point at it. Every SlurmJob here is a heterogeneous
job needing all of it (one h100 node and one a100 node, 2 GPUs each), so Slurm may hold only
one of them at a time: they are admitted one after another in priority order; a high-priority
one preempts a running low-priority one (cancelled, requeued, run again); one evicted while
still pending in Slurm is held, not cancelled, and released once admitted again; deleting an
admitted one releases its quota.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.test_operator_e2e import Operator, _condition, _operator, het_spec
from tests.k8s.kube import KubeTestbed, keep_requested
from tests.k8s.kueue import start_kueue, stop_kueue
from tests.testbed.slurm import SHORT_PARTITION, SlurmTestbed

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITIES = {"low": 100, "mid": 500, "high": 1000, "top": 10000}


def _flavor(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "resources": [
            {"name": "cpu", "nominalQuota": 8},
            {"name": "memory", "nominalQuota": "64Gi"},
            {"name": "nvidia.com/gpu", "nominalQuota": 2},  # one node's GPUs of this series
        ],
    }


@pytest.fixture(scope="module")
def queued(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Operator, str]]:
    start_kueue(kube)
    tag = uuid.uuid4().hex[:6]
    cq = f"sj-gpus-{tag}"
    flavors = {series: f"sj-{series}-{tag}" for series in ("h100", "a100")}
    env = {"SLURMJOB_KUEUE": "true"}
    for op in _operator(kube, slurm_2605, tmp_path_factory.mktemp("kueue"), **env):
        objects: list[dict[str, Any]] = [
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
             "metadata": {"name": name},
             "spec": {"nodeLabels": {"slurmjob.io/gpu-series": series,
                                     "slurmjob.io/partition": SHORT_PARTITION}}}
            for series, name in flavors.items()
        ]  # fmt: skip
        objects += [
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": f"{cls}-{tag}"}, "value": value}
            for cls, value in PRIORITIES.items()
        ]  # fmt: skip
        objects.append(
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
             "metadata": {"name": cq},
             "spec": {"preemption": {"withinClusterQueue": "LowerPriority"},
                      "namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": op.namespace}},
                      "resourceGroups": [{
                          "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                          "flavors": [_flavor(name) for name in flavors.values()]}]}}
        )  # fmt: skip
        objects += [
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": queue, "namespace": op.namespace},
             "spec": {"clusterQueue": cq}}
            for queue in ("team-a", "team-b")
        ]  # fmt: skip
        kube.apply(yaml.safe_dump_all(objects))
        try:
            yield op, tag
        finally:
            kube.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
            for name in flavors.values():
                kube.kubectl("delete", "resourceflavor", name, "--wait=false", check=False)
            for cls in PRIORITIES:
                kube.kubectl(
                    "delete", "workloadpriorityclass", f"{cls}-{tag}", "--wait=false", check=False
                )
            if not keep_requested():
                stop_kueue()


def _apply(
    op: Operator,
    name: str,
    command: str,
    priority: str | None = None,
    queue: str | None = "team-a",
) -> None:
    labels = {QUEUE_LABEL: queue} if queue else {}
    if priority is not None:
        labels["kueue.x-k8s.io/priority-class"] = priority
    manifest = {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": name, "namespace": op.namespace, "labels": labels},
        "spec": het_spec(["bash", "-c", command]),
    }
    op.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def _reason(obj: dict[str, Any]) -> str | None:
    return (_condition(obj, "Ready") or {}).get("reason")


def _workload(op: Operator, obj: dict[str, Any]) -> dict[str, Any]:
    name = f"slurmjob-{obj['metadata']['name']}-{obj['metadata']['uid'][:8]}"
    proc = op.kube.kubectl("get", "workload", name, "-n", op.namespace, "-o", "json")
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _workload_condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    conds = (workload.get("status") or {}).get("conditions") or []
    found: dict[str, Any] = next(c for c in conds if c["type"] == kind)
    return found


def test_jobs_needing_the_whole_quota_are_admitted_one_at_a_time_in_priority_order(
    queued: tuple[Operator, str], tmp_path: Path
) -> None:
    op, tag = queued
    _apply(op, "top", "sleep 8; echo top-done", f"top-{tag}")
    op.wait_phase("top", "Running", within=90)
    # Queued behind it in this order, in two LocalQueues: admitted high, mid, low.
    for name, queue in (("low", "team-a"), ("mid", "team-b"), ("high", "team-a")):
        _apply(op, name, f"sleep 2; echo {name}-done", f"{name}-{tag}", queue)
        time.sleep(0.5)
    for name in ("low", "mid", "high"):
        waiting = op.wait_for(
            name, lambda o: _reason(o) == "WaitingForAdmission", within=60, what="waiting"
        )
        assert not waiting["status"].get("attempts"), "nothing in Slurm before admission"
        assert (_condition(waiting, "QuotaReserved") or {}).get("status") == "False"
    names = ["top", "high", "mid", "low"]
    done = {name: op.wait_phase(name, "Succeeded", "Failed", within=300) for name in names}
    admitted_at = {}
    latencies = []
    runs = []
    for name in names:
        obj = done[name]
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        [attempt] = obj["status"]["attempts"]
        assert (_condition(obj, "Admitted") or {}).get("status") == "True"
        workload = _workload(op, obj)
        admitted = _when(_workload_condition(workload, "Admitted")["lastTransitionTime"])
        submitted = _when(attempt["submittedAt"])
        assert submitted >= admitted, (name, admitted, submitted)
        admitted_at[name] = admitted
        latencies.append((submitted - admitted).total_seconds())
        assert _workload_condition(workload, "Finished")["status"] == "True"
        runs.append((_when(obj["status"]["startTime"]), _when(obj["status"]["completionTime"])))
        # The flavors placed it: partition `short`, each component on its series' node.
        views = op.slurm_job(attempt["jobId"])
        assert {v.partition for v in views} == {SHORT_PARTITION}, views
    assert sorted(names, key=lambda n: admitted_at[n]) == names
    # Slurm never held two of them at once: each ran only after the one before had ended.
    for (_, end), (start, _) in itertools.pairwise(sorted(runs)):
        assert start >= end, runs
    print(f"admission -> submit latency (s): {latencies}")
    (tmp_path / "latency.json").write_text(json.dumps(latencies))


def test_a_higher_priority_job_preempts_and_the_evicted_one_runs_again(
    queued: tuple[Operator, str],
) -> None:
    op, tag = queued
    _apply(op, "victim", "sleep 12; echo victim-done", f"low-{tag}")
    op.wait_phase("victim", "Running", within=90)
    _apply(op, "boss", "sleep 2; echo boss-done", f"high-{tag}", queue="team-b")
    boss = op.wait_phase("boss", "Succeeded", "Failed", within=120)
    victim = op.wait_phase("victim", "Succeeded", "Failed", within=180)
    assert boss["status"]["phase"] == "Succeeded", boss["status"]
    assert victim["status"]["phase"] == "Succeeded", victim["status"]
    first, second = victim["status"]["attempts"]
    assert first["retryAction"] == "Evicted"  # not a failure, no retry spent
    assert first["jobId"] != second["jobId"]
    # The preemptor ran only once the evicted job was gone; the evicted one ran again after.
    assert _when(boss["status"]["startTime"]) >= _when(first["finishedAt"])
    assert _when(second["submittedAt"]) >= _when(boss["status"]["completionTime"])
    evictions = [e for e in op.events("victim") if e["reason"] == "Evicted"]
    assert evictions
    assert "Preempted" in evictions[0]["message"]  # Kueue's reason
    assert all(j.is_final for j in op.slurm_job(first["jobId"]))


def test_a_job_evicted_while_pending_in_slurm_is_held_then_released(
    queued: tuple[Operator, str],
) -> None:
    op, tag = queued
    # A job outside Kueue takes both nodes' GPUs: what Kueue admits stays pending in Slurm.
    _apply(op, "squatter", "sleep 20", queue=None)
    op.wait_phase("squatter", "Running", within=90)
    _apply(op, "waiter", "echo waiter-done", f"low-{tag}")
    pending = op.wait_for(
        "waiter",
        lambda o: bool((((o.get("status") or {}).get("attempts") or [{}])[0]).get("jobId")),
        within=60,
        what="waiter submitted on its admission",
    )
    [attempt] = pending["status"]["attempts"]
    job = attempt["jobId"]
    _apply(op, "chief", "echo chief-done", f"high-{tag}", queue="team-b")
    held = op.wait_for(
        "waiter",
        lambda o: (_condition(o, "Evicted") or {}).get("status") == "True",
        within=60,
        what="waiter evicted",
    )
    assert (_condition(held, "Evicted") or {}).get("reason") == "Preempted"
    assert [a["jobId"] for a in held["status"]["attempts"]] == [job]
    states = {v.base_state.value for v in op.slurm_job(job) if v.base_state is not None}
    assert states == {"PENDING"}, "held in Slurm, not cancelled"
    chief = op.wait_phase("chief", "Succeeded", "Failed", within=120)
    waiter = op.wait_phase("waiter", "Succeeded", "Failed", within=120)
    assert chief["status"]["phase"] == "Succeeded", chief["status"]
    assert waiter["status"]["phase"] == "Succeeded", waiter["status"]
    # The same job, released once re-admitted, and only after the preemptor.
    assert [a["jobId"] for a in waiter["status"]["attempts"]] == [job]
    assert _when(waiter["status"]["startTime"]) >= _when(chief["status"]["completionTime"])
    assert (_condition(waiter, "Evicted") or {}).get("status") == "False"
    assert "Released" in [e["reason"] for e in op.events("waiter")]


def test_deleting_an_admitted_slurmjob_releases_its_quota(queued: tuple[Operator, str]) -> None:
    op, _ = queued
    _apply(op, "hog", "sleep 300")
    op.wait_phase("hog", "Running", within=90)
    _apply(op, "next", "echo next-done", queue="team-b")
    op.wait_for(
        "next",
        lambda o: _reason(o) == "WaitingForAdmission",
        within=60,
        what="next waits for the quota",
    )
    hog = op.get("hog") or {}
    op.kube.kubectl("delete", "slurmjob", "hog", "-n", op.namespace, "--timeout=60s", timeout=70)
    gone = op.kube.kubectl(
        "get", "workload", f"slurmjob-hog-{hog['metadata']['uid'][:8]}", "-n", op.namespace,
        check=False,
    )  # fmt: skip
    assert gone.returncode != 0, "the Workload is deleted with the SlurmJob"
    assert op.wait_phase("next", "Succeeded", "Failed", within=120)["status"]["phase"] == (
        "Succeeded"
    )


def test_spec_suspend_deactivates_the_workload_and_lifting_it_runs_the_same_job(
    queued: tuple[Operator, str],
) -> None:
    op, tag = queued
    _apply(op, "blocker", "sleep 25", queue=None)  # outside Kueue: what it admits stays pending
    op.wait_phase("blocker", "Running", within=90)
    _apply(op, "napper", "echo napper-done", f"low-{tag}")
    pending = op.wait_for(
        "napper",
        lambda o: bool((((o.get("status") or {}).get("attempts") or [{}])[0]).get("jobId")),
        within=60,
        what="napper submitted on its admission",
    )
    job = pending["status"]["attempts"][0]["jobId"]
    patch = json.dumps({"spec": {"suspend": True}})
    op.kube.kubectl("patch", "slurmjob", "napper", "-n", op.namespace, "--type=merge", "-p", patch)
    held = op.wait_for(
        "napper",
        lambda o: (
            (_condition(o, "Evicted") or {}).get("status") == "True"
            and (_condition(o, "QuotaReserved") or {}).get("status") == "False"
        ),
        within=60,
        what="napper deactivated, its quota given back",
    )
    assert (_condition(held, "Evicted") or {}).get("reason") == "Deactivated"  # Kueue's
    assert _workload(op, held)["spec"]["active"] is False
    states = {v.base_state.value for v in op.slurm_job(job) if v.base_state is not None}
    assert states == {"PENDING"}, "held in Slurm, not cancelled"
    patch = json.dumps({"spec": {"suspend": False}})
    op.kube.kubectl("patch", "slurmjob", "napper", "-n", op.namespace, "--type=merge", "-p", patch)
    done = op.wait_phase("napper", "Succeeded", "Failed", within=120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert [a["jobId"] for a in done["status"]["attempts"]] == [job]
