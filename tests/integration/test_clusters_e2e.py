"""Two real Slurm clusters behind one `slurmjob-operator run`: Slurm 26.05 (v0.0.45, the
first and default cluster) and Slurm 22.05 (v0.0.38, `spec.cluster: tb2205`), from one
clusters file.

A job runs on each; the 22.05 cluster's controller and slurmrestd are stopped while both run:
its job is marked `SlurmReachable=False` while the 26.05 job goes on and succeeds untouched;
once 22.05 is back (slurmctld on its saved state) its job is picked up and succeeds. Every
attempt names its cluster, each Slurm job is on its own cluster only, and `doctor` checks both.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import OPERATOR, free_port, slurm_jobs_named
from tests.integration.sitefiles import site_env
from tests.integration.test_operator_e2e import CRD, Operator, cpu_spec
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed, start_control, stop_control

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605, pytest.mark.slurm2205]

FIRST, SECOND = "tb2605", "tb2205"


def clusters_env(slurm_2605: SlurmTestbed, slurm_2205: SlurmTestbed, tmp: Path) -> dict[str, str]:
    """The 26.05 cluster from the environment, the 22.05 one from the clusters file."""
    first = site_env(slurm_2605, "apptainer", tmp)
    second = site_env(slurm_2205, "apptainer", tmp / "second")
    path = tmp / "clusters.yaml"
    path.write_text(
        json.dumps(
            {
                "clusters": [
                    {"name": FIRST},
                    {
                        "name": SECOND,
                        "restUrl": second["SLURMJOB_SLURM_REST_URL"],
                        "apiVersion": "auto",
                        "jwtKeyFile": second["SLURMJOB_SLURM_JWT_KEY_FILE"],
                        "partition": second["SLURMJOB_SLURM_PARTITION"],
                        "runtimeRegistryFile": second["SLURMJOB_RUNTIME_REGISTRY_FILE"],
                        "gpuSeriesFile": second["SLURMJOB_GPU_SERIES_FILE"],
                    },
                ]
            }
        )
    )
    return {**first, "SLURMJOB_CLUSTERS_FILE": str(path)}


@pytest.fixture(scope="module")
def fleet_op(
    kube: KubeTestbed,
    slurm_2605: SlurmTestbed,
    slurm_2205: SlurmTestbed,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "second").mkdir()
    namespace = f"fleet-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", namespace)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        **kube.env(),
        **clusters_env(slurm_2605, slurm_2205, tmp),
        "SLURMJOB_POLL_INTERVAL": "1",
        "SLURMJOB_METRICS_PORT": str(free_port()),
        "SLURMJOB_METRICS_ADDRESS": "127.0.0.1",
        "SLURMJOB_DELETE_TIMEOUT": "20",
    }
    op = Operator(kube, slurm_2605, namespace, env, tmp / "operator.log")
    op.start()
    try:
        yield op
    finally:
        kube.kubectl(
            "delete", "slurmjobs", "--all", "-n", namespace, "--timeout=40s",
            check=False, timeout=50,
        )  # fmt: skip
        op.stop()
        print(f"--- operator log ({namespace}) ---\n{op.log_tail(120)}")
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _attempt(obj: dict[str, Any]) -> dict[str, Any]:
    attempts: list[dict[str, Any]] = (obj.get("status") or {}).get("attempts") or []
    return attempts[-1] if attempts else {}


def _reachable(obj: dict[str, Any]) -> tuple[str, str] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == "SlurmReachable":
            return cond["status"], cond["reason"]
    return None


def _per_cluster(op: Operator, metric: str) -> dict[str, float]:
    """The operator's `/metrics` series of `metric`, by their cluster label."""
    url = f"http://127.0.0.1:{op.env['SLURMJOB_METRICS_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    found = re.findall(rf'^slurmjob_operator_{metric}\{{cluster="([^"]+)"\}} (\S+)$', text, re.M)
    return {cluster: float(value) for cluster, value in found}


def _until_metrics(op: Operator, metric: str, wanted: dict[str, float]) -> None:
    deadline = time.monotonic() + 20
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        seen = _per_cluster(op, metric)
        if seen == wanted:
            return
        time.sleep(0.5)
    raise AssertionError(f"{metric}: {seen}, not {wanted}")


def test_a_cluster_down_stops_only_its_own_jobs(
    fleet_op: Operator, slurm_2605: SlurmTestbed, slurm_2205: SlurmTestbed
) -> None:
    op = fleet_op
    op.apply("on-first", cpu_spec(["bash", "-c", "sleep 12; echo first-done"]))
    op.apply(
        "on-second", {**cpu_spec(["bash", "-c", "sleep 25; echo second-done"]), "cluster": SECOND}
    )
    for name in ("on-first", "on-second"):
        op.wait_phase(name, "Running", within=60)
    first, second = op.get("on-first") or {}, op.get("on-second") or {}
    assert _attempt(first)["cluster"] == FIRST
    assert _attempt(second)["cluster"] == SECOND
    # Each job is on its own cluster only (asked straight, not through the operator).
    assert [j.job_id for j in op.slurm_jobs_named(_attempt(first)["jobName"])] == [
        _attempt(first)["jobId"]
    ]
    env_2205 = {**op.env, **site_env(slurm_2205, "apptainer", Path(op.env["HOME"]) / "second")}
    assert slurm_jobs_named(env_2205, _attempt(first)["jobName"]) == []
    assert [j.job_id for j in slurm_jobs_named(env_2205, _attempt(second)["jobName"])] == [
        _attempt(second)["jobId"]
    ]

    stop_control("22.05")
    try:
        down = op.wait_for(
            "on-second",
            lambda o: _reachable(o) == ("False", "SlurmUnavailable"),
            30,
            "SlurmReachable=False on the stopped cluster's job",
        )
        assert "tb2205" in next(
            c["message"] for c in down["status"]["conditions"] if c["type"] == "SlurmReachable"
        )
        # Each cluster's poller reports under its own name: neither hides the other.
        _until_metrics(op, "slurmrestd_reachable", {FIRST: 1.0, SECOND: 0.0})
        tokens = _per_cluster(op, "token_expiry_seconds")
        assert tokens.keys() == {FIRST, SECOND}
        assert all(seconds > 0 for seconds in tokens.values()), tokens
        # The other cluster's job goes on to its end, never told its cluster is away.
        done = op.wait_phase("on-first", "Succeeded", "Failed", "Cancelled", within=60)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert "first-done" in done["status"]["logs"]["stdout"]["tail"]
        assert _reachable(done) in (None, ("True", "SlurmAnswering"))
        assert (op.get("on-second") or {})["status"]["phase"] == "Running"
    finally:
        start_control("22.05")
    back = op.wait_phase("on-second", "Succeeded", "Failed", "Cancelled", within=90)
    assert back["status"]["phase"] == "Succeeded", back["status"]
    assert "second-done" in back["status"]["logs"]["stdout"]["tail"]
    assert _reachable(back) == ("True", "SlurmAnswering")
    _until_metrics(op, "slurmrestd_reachable", {FIRST: 1.0, SECOND: 1.0})
    assert _attempt(back)["jobId"] == _attempt(second)["jobId"]  # the same job, picked up
    assert len((back.get("status") or {}).get("attempts") or []) == 1


def test_an_unknown_cluster_is_refused_naming_the_known_ones(fleet_op: Operator) -> None:
    op = fleet_op
    op.apply("nowhere", {**cpu_spec(["true"]), "cluster": "nowhere"})
    obj = op.wait_phase("nowhere", "Failed", within=30)
    assert "known: tb2605, tb2205" in obj["status"]["message"]
    assert obj["status"].get("attempts", []) == []


def test_spec_cluster_cannot_change(fleet_op: Operator) -> None:
    op = fleet_op
    op.apply("fixed", {**cpu_spec(["true"]), "cluster": SECOND, "suspend": True})
    proc = op.kube.kubectl(
        "patch", "slurmjob", "fixed", "-n", op.namespace, "--type=merge",
        "-p", json.dumps({"spec": {"cluster": FIRST}}), check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "spec.cluster is immutable: create a new SlurmJob" in proc.stderr


def test_doctor_checks_every_cluster(fleet_op: Operator) -> None:
    env = {k: v for k, v in fleet_op.env.items() if k.startswith("SLURMJOB_")}
    env.update(PATH="/usr/bin:/bin", HOME=fleet_op.env["HOME"])
    deadline = time.monotonic() + 30
    while True:  # the 22.05 cluster may still be coming back from the test above
        proc = subprocess.run(
            [str(OPERATOR), "doctor", "--json"], env=env, capture_output=True, text=True, timeout=60
        )
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        if checks.get(f"slurmrestd[{SECOND}]", {}).get("outcome") == "ok" or (
            time.monotonic() > deadline
        ):
            break
        time.sleep(2)
    assert checks["clusters"]["detail"] == f"{FIRST}, {SECOND}"
    for cluster, version in ((FIRST, "v0.0.45"), (SECOND, "v0.0.38")):
        assert checks[f"slurmrestd[{cluster}]"]["outcome"] == "ok", checks
        assert version in checks[f"slurmrestd[{cluster}]"]["detail"]
        assert checks[f"auth[{cluster}]"]["outcome"] == "ok"
    assert checks[f"accounting[{FIRST}]"]["outcome"] == "ok"
    assert checks[f"accounting[{SECOND}]"]["outcome"] == "warn"
