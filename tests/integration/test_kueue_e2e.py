"""Kueue's admission over SlurmJobs, on a real Kueue (v0.17, built from Go modules and run
against the test bed's kube-apiserver; see tests/k8s/kueue.py) and the real Slurm 26.05.

A ClusterQueue whose CPU quota holds one of these jobs at a time: three SlurmJobs in its
LocalQueue are admitted one after the other, each submitted to Slurm only once admitted, and
never two in Slurm at once; deleting an admitted SlurmJob releases its quota to the next.
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
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import Operator, _condition, _operator
from tests.k8s.kube import KubeTestbed, keep_requested
from tests.k8s.kueue import start_kueue, stop_kueue
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.fixture(scope="module")
def queued(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Operator, str]]:
    start_kueue(kube)
    tag = uuid.uuid4().hex[:6]
    cq, flavor = f"sj-cq-{tag}", f"sj-flavor-{tag}"
    env = {"SLURMJOB_KUEUE": "true"}
    for op in _operator(kube, slurm_2605, tmp_path_factory.mktemp("kueue"), **env):
        queues = [
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
             "metadata": {"name": flavor}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": f"low-{tag}"}, "value": 100},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": f"high-{tag}"}, "value": 1000},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
             "metadata": {"name": cq},
             "spec": {"preemption": {"withinClusterQueue": "LowerPriority"},
                 "namespaceSelector": {"matchLabels": {
                 "kubernetes.io/metadata.name": op.namespace}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                     {"name": flavor, "resources": [
                         {"name": "cpu", "nominalQuota": 1},
                         {"name": "memory", "nominalQuota": "64Gi"}]}]}]}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": "team", "namespace": op.namespace},
             "spec": {"clusterQueue": cq}},
        ]  # fmt: skip
        kube.apply(yaml.safe_dump_all(queues))
        try:
            yield op, tag
        finally:
            kube.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
            kube.kubectl("delete", "resourceflavor", flavor, "--wait=false", check=False)
            for cls in (f"low-{tag}", f"high-{tag}"):
                kube.kubectl("delete", "workloadpriorityclass", cls, "--wait=false", check=False)
            if not keep_requested():
                stop_kueue()


def _apply(op: Operator, name: str, spec: dict[str, Any], priority: str | None = None) -> None:
    labels = {QUEUE_LABEL: "team"}
    if priority is not None:
        labels["kueue.x-k8s.io/priority-class"] = priority
    manifest = {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": name, "namespace": op.namespace, "labels": labels},
        "spec": spec,
    }
    op.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


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


def test_admitted_one_at_a_time_and_submitted_only_once_admitted(
    queued: tuple[Operator, str], tmp_path: Path
) -> None:
    op, _ = queued
    names = ["first", "second", "third"]
    for name in names:
        _apply(op, name, cpu_spec(["bash", "-c", f"sleep 3; echo {name}-done"]))
        time.sleep(0.5)  # queued in this order
    waiting = op.wait_for(
        "third",
        lambda o: (_condition(o, "Ready") or {}).get("reason") == "WaitingForAdmission",
        within=60,
        what="WaitingForAdmission",
    )
    assert not waiting["status"].get("attempts"), "nothing in Slurm before admission"
    done = {name: op.wait_phase(name, "Succeeded", "Failed", within=180) for name in names}
    runs = []
    latencies = []
    for name in names:
        obj = done[name]
        assert obj["status"]["phase"] == "Succeeded", obj["status"]
        [attempt] = obj["status"]["attempts"]
        workload = _workload(op, obj)
        admitted = _when(_workload_condition(workload, "Admitted")["lastTransitionTime"])
        submitted = _when(attempt["submittedAt"])
        assert submitted >= admitted, (name, admitted, submitted)
        latencies.append((submitted - admitted).total_seconds())
        assert _workload_condition(workload, "Finished")["status"] == "True"
        runs.append((_when(obj["status"]["startTime"]), _when(obj["status"]["completionTime"])))
    # Never two in Slurm at once: each admitted only after the one before finished.
    ordered = sorted(runs)
    for (_, end), (start, _) in itertools.pairwise(ordered):
        assert start >= end, runs
    print(f"admission -> submit latency (s): {latencies}")
    (tmp_path / "latency.json").write_text(json.dumps(latencies))


def test_deleting_an_admitted_slurmjob_releases_its_quota(queued: tuple[Operator, str]) -> None:
    op, _ = queued
    _apply(op, "hog", cpu_spec(["sleep", "300"]))
    op.wait_phase("hog", "Running", within=90)
    _apply(op, "next", cpu_spec(["echo", "next-done"]))
    op.wait_for(
        "next",
        lambda o: (_condition(o, "Ready") or {}).get("reason") == "WaitingForAdmission",
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


def test_a_higher_priority_job_preempts_and_the_evicted_one_runs_again(
    queued: tuple[Operator, str],
) -> None:
    op, tag = queued
    _apply(op, "low", cpu_spec(["bash", "-c", "sleep 15; echo low-done"]), f"low-{tag}")
    op.wait_phase("low", "Running", within=90)
    _apply(op, "high", cpu_spec(["bash", "-c", "sleep 2; echo high-done"]), f"high-{tag}")
    high = op.wait_phase("high", "Succeeded", "Failed", within=120)
    low = op.wait_phase("low", "Succeeded", "Failed", within=180)
    assert high["status"]["phase"] == "Succeeded", high["status"]
    assert low["status"]["phase"] == "Succeeded", low["status"]
    first, second = low["status"]["attempts"]
    assert first["retryAction"] == "Evicted"  # not a failure, no retry spent
    assert first["jobId"] != second["jobId"]
    # The preemptor ran only once the evicted job was gone; the evicted one ran again after.
    assert _when(high["status"]["startTime"]) >= _when(first["finishedAt"])
    assert _when(second["submittedAt"]) >= _when(high["status"]["completionTime"])
    assert "Evicted" in [e["reason"] for e in op.events("low")]
    jobs = op.slurm_job(first["jobId"])
    assert all(j.is_final for j in jobs)
