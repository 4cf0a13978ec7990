"""End to end, the operator's tests that need Slurm 26.05's nodes to themselves (an exclusive
module, `[lanes]` in tests/budgets.toml): one sets a node down under a running job, one holds
both nodes with blockers to keep a job queued, one runs a heterogeneous job over both nodes'
GPUs. The rest of the operator's end-to-end set (test_operator_e2e.py) runs in a lane."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import (
    Operator,
    _attempt,
    _condition,
    _operator,
    het_spec,
)
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def op_2605(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(kube, slurm_2605, tmp_path_factory.mktemp("opnodes"))


@pytest.mark.slurm2605
def test_heterogeneous_gpu_job_succeeds_on_both_nodes(op_2605: Operator) -> None:
    op = op_2605
    op.apply("het", het_spec(["bash", "-c", "sleep 2; echo world=$WORLD_SIZE"]))
    obj = op.wait_phase("het", "Succeeded", "Failed", "Cancelled", within=90)
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    assert set(obj["status"]["nodes"].split(",")) == {"n1", "n2"}
    assert "world=2" in obj["status"]["logs"]["stdout"]["tail"]


@pytest.mark.slurm2605
def test_node_failure_is_retried_as_a_new_attempt(op_2605: Operator) -> None:
    op = op_2605
    op.apply(
        "nodefail",
        cpu_spec(
            [
                "bash",
                "-c",
                'if [ "$SLURMJOB_ATTEMPT" = 1 ]; then sleep 300; else echo second-attempt-ok; fi',
            ],
            retry={"limit": 1, "backoffSeconds": 0},
        ),
    )
    obj = op.wait_phase("nodefail", "Running")
    node = obj["status"]["nodes"]
    try:
        op.testbed.scontrol("update", f"nodename={node}", "state=down", "reason=e2e-node-failure")
        obj = op.wait_for(
            "nodefail",
            lambda o: (
                (o.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                and len(o["status"].get("attempts", [])) == 2
            ),
            within=90,
            what="second attempt finished",
        )
    finally:
        # ReturnToService=2 may have brought the node back already (resume then refuses).
        with contextlib.suppress(Exception):
            op.testbed.scontrol("update", f"nodename={node}", "state=resume")
    first, second = obj["status"]["attempts"]
    assert first["nativeState"] == "NODE_FAIL"
    assert first["retryAction"] == "Retry"
    assert obj["status"]["phase"] == "Succeeded", obj["status"]
    assert "second-attempt-ok" in obj["status"]["logs"]["stdout"]["tail"]
    assert second["retryOf"] == 1


@pytest.mark.slurm2605
def test_suspend_gates_submission_and_holds_a_queued_job(op_2605: Operator) -> None:
    op = op_2605
    # Suspended from the start: nothing reaches Slurm until it is lifted.
    op.apply("gated", cpu_spec(["bash", "-c", "echo released"], suspend=True))
    obj = op.wait_for(
        "gated",
        lambda o: (_condition(o, "Suspended") or {}).get("status") == "True",
        what="Suspended=True",
    )
    assert obj["status"]["phase"] == "Pending"
    assert obj["status"].get("attempts", []) == []
    op.kube.kubectl(
        "patch",
        "slurmjob",
        "gated",
        "-n",
        op.namespace,
        "--type=merge",
        "-p",
        '{"spec": {"suspend": false}}',
    )
    obj = op.wait_phase("gated", "Succeeded", "Failed")
    assert "released" in obj["status"]["logs"]["stdout"]["tail"]
    # A queued job is held in Slurm while suspended, and released after.
    blockers = [f"blocker-{i}" for i in range(2)]
    for name in blockers:  # each takes a whole node (2 CPUs)
        op.apply(
            name,
            cpu_spec(
                ["sleep", "300"],
                pools=[{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 2, "memoryGb": 1}],
            ),
        )
    for name in blockers:
        op.wait_phase(name, "Running")
    op.apply("queued", cpu_spec(["bash", "-c", "echo ran-after-release"]))
    op.wait_phase("queued", "Queued")
    op.kube.kubectl(
        "patch",
        "slurmjob",
        "queued",
        "-n",
        op.namespace,
        "--type=merge",
        "-p",
        '{"spec": {"suspend": true}}',
    )
    obj = op.wait_for(
        "queued",
        lambda o: (_condition(o, "Suspended") or {}).get("reason") == "Held",
        what="Suspended=True Held",
    )
    [job] = op.slurm_job(_attempt(obj)["jobId"])
    assert job.reason == "JobHeldUser"
    for name in blockers:
        op.kube.kubectl("delete", "slurmjob", name, "-n", op.namespace, "--timeout=60s", timeout=70)
    time.sleep(2)
    assert (op.get("queued") or {})["status"]["phase"] == "Queued"  # held: does not start
    op.kube.kubectl(
        "patch",
        "slurmjob",
        "queued",
        "-n",
        op.namespace,
        "--type=merge",
        "-p",
        '{"spec": {"suspend": false}}',
    )
    obj = op.wait_phase("queued", "Succeeded", "Failed")
    assert obj["status"]["phase"] == "Succeeded"
    assert (_condition(obj, "Suspended") or {}).get("reason") == "Released"
