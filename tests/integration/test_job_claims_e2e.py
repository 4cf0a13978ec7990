"""A tenant that writes its own status to claim another tenant's Slurm job gets nothing done
to it, on the real stack: Slurm 26.05, kube-apiserver, Kueue, the tenants file with the test
bed's Unix users (team-a 2101, team-b 2102, each its own `slurmUser`) and a clusters file
naming a second cluster, `east`, on the same slurmrestd, which team-a may not use.

team-b's job runs in Slurm (submitted as team-b, as its own operator would have). team-a then
points three of its SlurmJobs at that job id, through the three paths that change a job
without a fold first: a dependent whose upstream fails (the operator would cancel it), a Kueue
eviction (`spec.suspend` deactivates the Workload; the operator would cancel the running job),
and the attempt's `cluster` field naming `east` (the operator would act there as itself, team-a
having no Slurm user there) followed by a deletion. Each gets `JobIdentityMismatch` or
`JobChangeRefused`; team-b's job runs on; and the operator sends no mutating request for it
(counted from its own metrics, whichever user it would have acted as): the one it sends is
the deletion's cancel of the deleted SlurmJob's own job, found by name whatever its status
claims.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.helpers import ask_slurm, cpu_spec
from tests.integration.sitefiles import site_env
from tests.integration.test_operator_e2e import CRD, Operator, _operator
from tests.integration.test_tenants_e2e import PROFILE, TEAM_A_UID, TEAM_B_UID, _require_users
from tests.k8s.kube import KubeTestbed, keep_requested
from tests.k8s.kueue import start_kueue, stop_kueue
from tests.testbed.handles import cancel_own
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.core.launch import JobComponent, LaunchRequest
from slurmjob_operator.core.probe import avoid_key, cache_key

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

FIRST, EAST = "tb2605", "east"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _requests(methods: str) -> re.Pattern[str]:
    """The request counts of `/job/{job_id}` and `/jobs` by the methods matched."""
    return re.compile(
        r"^slurmjob_operator_slurmrestd_request_seconds_count\{[^}]*"
        r'endpoint="/slurm/[^"]+/(?:job/\{job_id\}|jobs)"[^}]*'
        rf'method="(?:{methods})"[^}}]*\}}'
        r"\s+(\S+)$",
        re.MULTILINE,
    )


CHANGING, READING = _requests("POST|DELETE"), _requests("GET")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: The site's collective probe, on every runtime: the stand-in fails on n1 (issue 42's probe
#: claims need a record to fold).
PROBE = {"command": ["collective-probe", "--fail-on", "n1"], "timeoutSeconds": 5}


def _files(slurm: SlurmTestbed, tmp: Path, namespace: str) -> dict[str, str]:
    env = site_env(slurm, PROFILE, tmp)
    registry = Path(env["SLURMJOB_RUNTIME_REGISTRY_FILE"])
    runtimes = json.loads(registry.read_text())
    for runtime in runtimes["runtimes"]:
        runtime["probe"] = PROBE
    registry.write_text(json.dumps(runtimes))
    clusters = tmp / "clusters.yaml"
    clusters.write_text(
        json.dumps(
            {
                "clusters": [
                    {"name": FIRST},
                    {
                        "name": EAST,
                        "restUrl": env["SLURMJOB_SLURM_REST_URL"],
                        "jwtKeyFile": env["SLURMJOB_SLURM_JWT_KEY_FILE"],
                    },
                ]
            }
        )
    )
    common = {"accounts": ["a"], "partitions": ["debug"], "mountSources": ["datasets/public"]}
    tenants = tmp / "tenants.yaml"
    tenants.write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"name": "team-a", "namespaces": [namespace], **common,
                     "slurmUser": "team-a", "uid": TEAM_A_UID, "clusters": {FIRST: {}}},
                    {"name": "team-b", "namespaces": [f"{namespace}-b"], **common,
                     "slurmUser": "team-b", "uid": TEAM_B_UID},
                ]
            }
        )
    )  # fmt: skip
    return {"SLURMJOB_CLUSTERS_FILE": str(clusters), "SLURMJOB_TENANTS_FILE": str(tenants)}


@pytest.fixture(scope="module")
def claims(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Operator, int, int]]:
    _require_users(slurm_2605)
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    start_kueue(kube)
    tmp = tmp_path_factory.mktemp("claims")
    port = _free_port()
    tag = uuid.uuid4().hex[:6]
    placeholder = _files(slurm_2605, tmp, "claims-placeholder")
    archive = tmp / "archive"
    archive.mkdir(mode=0o700)
    env = {
        "SLURMJOB_KUEUE": "true",
        "SLURMJOB_METRICS_PORT": str(port),
        "SLURMJOB_ARCHIVE_ROOT": str(archive),
        # The probe book's ConfigMap, in `default` (no pod namespace here), of this module only.
        "SLURMJOB_PROBE_CONFIGMAP": f"sj-probe-claims-{tag}",
        **placeholder,
    }
    for op in _operator(kube, slurm_2605, tmp, PROFILE, **env):
        # The namespace is made by `_operator`: name it in the tenants file, then restart,
        # watching team-b's namespace too.
        op.stop()
        _files(slurm_2605, tmp, op.namespace)
        kube.kubectl("create", "namespace", f"{op.namespace}-b")
        op.also_watched = (f"{op.namespace}-b",)
        op.start()
        flavor, cq = f"sj-cpu-{tag}", f"sj-claims-{tag}"
        kube.apply(
            yaml.safe_dump_all(
                [
                    {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                     "metadata": {"name": flavor}},
                    {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                     "metadata": {"name": cq},
                     "spec": {"namespaceSelector": {"matchLabels": {
                                  "kubernetes.io/metadata.name": op.namespace}},
                              "resourceGroups": [{
                                  "coveredResources": ["cpu", "memory"],
                                  "flavors": [{"name": flavor, "resources": [
                                      {"name": "cpu", "nominalQuota": 4},
                                      {"name": "memory", "nominalQuota": "16Gi"}]}]}]}},
                    {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                     "metadata": {"name": "team-a", "namespace": op.namespace},
                     "spec": {"clusterQueue": cq}},
                ]
            )
        )  # fmt: skip
        victim = _victim(op)
        try:
            yield op, port, victim
        finally:
            _cancel_as(op, "team-b", victim)
            kube.kubectl("delete", "namespace", f"{op.namespace}-b", "--wait=false", check=False)
            kube.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
            kube.kubectl("delete", "resourceflavor", flavor, "--wait=false", check=False)
            if not keep_requested():
                stop_kueue()


def _as(op: Operator, user: str) -> dict[str, str]:
    """The settings of a client acting as Slurm user `user` (tokens minted for it)."""
    return {**op.env, "SLURMJOB_SLURM_REST_USER": user}


def _victim(op: Operator) -> int:
    """team-b's running job, submitted as team-b with another resource's identity."""
    request = LaunchRequest(
        job_name=f"sj-{op.namespace}-b-victim-00000000-a1",
        comment=f"slurmjob.io ns={op.namespace}-b name=victim uid=0000-victim attempt=1",
        script="#!/bin/bash\nsleep 600\n",
        working_directory="/tmp",
        standard_output="/dev/null",
        standard_error="/dev/null",
        environment={"PATH": "/usr/bin:/bin"},
        components=[JobComponent(pool="main", nodes=1, cpus_per_task=1, memory_mb=256)],
        partition="debug",
        time_limit_minutes=15,
    )
    receipt = ask_slurm(_as(op, "team-b"), lambda client: client.submit(request))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        [job] = op.slurm_job(receipt.job_id)
        if job.base_state is BaseState.RUNNING:
            assert job.user == "team-b"
            return receipt.job_id
        time.sleep(0.5)
    raise AssertionError(f"team-b's job {receipt.job_id} did not start")


def _cancel_as(op: Operator, user: str, job_id: int | None) -> None:
    """Cancel a job as its own Slurm user (a refused cancel would stall this slurmctld)."""
    if job_id is None:
        return
    [job] = op.slurm_job(job_id)
    if not job.is_final and job.user == user:
        ask_slurm(_as(op, user), lambda client: cancel_own(client, job_id))


def _claim(op: Operator, name: str, job_id: int, **extra: Any) -> None:
    """What team-a, with write access to its own slurmjobs/status, writes."""
    obj = op.get(name)
    assert obj is not None
    attempts = obj["status"]["attempts"]
    attempts[-1].update({"jobId": job_id, "sluid": None, **extra})
    op.kube.kubectl(
        "patch", "slurmjob", name, "-n", op.namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"attempts": attempts}}),
    )  # fmt: skip


def _job_id(obj: dict[str, Any]) -> int | None:
    attempts = (obj.get("status") or {}).get("attempts") or []
    return attempts[-1].get("jobId") if attempts else None


def _reasons(op: Operator, name: str) -> list[str]:
    return [e["reason"] for e in op.events(name)]


def _requests_made(port: int) -> tuple[float, float]:
    """(changing, reading) requests to the job endpoints, from the operator's metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    changing, reading = (sum(float(v) for v in p.findall(text)) for p in (CHANGING, READING))
    return changing, reading


def _running(op: Operator, job_id: int) -> SlurmJobView:
    [job] = op.slurm_job(job_id)
    assert job.base_state is BaseState.RUNNING, job
    assert job.user == "team-b"
    return job


def test_claims_on_another_tenants_job_change_nothing(claims: tuple[Operator, int, int]) -> None:
    op, port, victim = claims
    own: list[int | None] = []
    try:
        # 1. A dependent whose upstream fails: its queued job would be cancelled.
        op.apply("pre", cpu_spec(["bash", "-c", "sleep 20; exit 1"], PROFILE))
        op.apply("post", cpu_spec(["true"], PROFILE, dependsOn=[{"name": "pre"}]))
        post = op.wait_for("post", lambda o: _job_id(o) is not None, 90, "post's job id")
        own.append(_job_id(post))
        _claim(op, "post", victim)
        op.wait_phase("pre", "Failed", within=90)
        op.wait_for(
            "post",
            lambda o: "JobIdentityMismatch" in _reasons(op, "post"),
            60,
            "JobIdentityMismatch on post",
        )
        _running(op, victim)

        # 2. A Kueue eviction of a running job (spec.suspend deactivates the Workload).
        queued = cpu_spec(["sleep", "300"], PROFILE)
        manifest = {
            "apiVersion": "slurmjob.io/v1alpha1",
            "kind": "SlurmJob",
            "metadata": {"name": "kq", "namespace": op.namespace,
                         "labels": {QUEUE_LABEL: "team-a"}},
            "spec": queued,
        }  # fmt: skip
        op.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
        kq = op.wait_phase("kq", "Running", within=90)
        own.append(_job_id(kq))
        _claim(op, "kq", victim)
        op.kube.kubectl(
            "patch", "slurmjob", "kq", "-n", op.namespace, "--type=merge",
            "-p", json.dumps({"spec": {"suspend": True}}),
        )  # fmt: skip
        op.wait_for(
            "kq",
            lambda o: any(a.get("retryAction") == "Evicted" for a in o["status"]["attempts"]),
            90,
            "the eviction recorded",
        )
        assert "JobIdentityMismatch" in _reasons(op, "kq")
        _running(op, victim)

        # Nothing that changes a job was sent so far, as any user.
        changing, reading = _requests_made(port)
        assert reading > 0, "the metrics are read as the operator counts them"
        assert changing == 0

        # 3. The attempt's cluster rewritten to one team-a may not use, then a deletion.
        op.apply("cl", cpu_spec(["sleep", "300"], PROFILE))
        cl = op.wait_phase("cl", "Running", within=90)
        own_cl = _job_id(cl)
        own.append(own_cl)
        _claim(op, "cl", victim, cluster=EAST)
        op.kube.kubectl("delete", "slurmjob", "cl", "-n", op.namespace, "--wait=false", timeout=30)
        deadline = time.monotonic() + 60
        while op.get("cl") is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert op.get("cl") is None, "the finalizer is released with the refusal told"
        refused = [e for e in op.events("cl") if e["reason"] == "JobChangeRefused"]
        assert refused, _reasons(op, "cl")
        assert f"may not use cluster {EAST}" in refused[0]["message"]
        _running(op, victim)
        # The deletion looked for cl's own jobs by name where cl belongs, whatever its status
        # claims (issue 42): its own job, and nothing else, was cancelled, in one request.
        assert own_cl is not None
        [gone] = op.slurm_job(own_cl)
        assert gone.is_final, gone
        changing, _ = _requests_made(port)
        assert changing == 1
    finally:
        for job_id in own:
            _cancel_as(op, "team-a", job_id)
        for name in ("pre", "post", "kq", "cl"):
            op.kube.kubectl(
                "delete", "slurmjob", name, "-n", op.namespace, "--wait=false", check=False
            )


def _apply_in(op: Operator, namespace: str, name: str, spec: dict[str, Any]) -> None:
    manifest = {
        "apiVersion": "slurmjob.io/v1alpha1",
        "kind": "SlurmJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    op.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def _get_in(op: Operator, namespace: str, name: str) -> dict[str, Any] | None:
    found = op.kube.kubectl("get", "slurmjob", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def _until(what: str, within: float, check: Any) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {within} s")


def _entry_files(entry: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(entry)): p.read_bytes() for p in sorted(entry.rglob("*")) if p.is_file()
    }


def test_status_claims_move_nothing_of_another_tenants_archive_or_probe_cache(
    claims: tuple[Operator, int, int],
) -> None:
    """Issue 42: team-a, writing its own status, names team-b's staging directory, attempt,
    job and probe keys; its deletion archives its own files only, team-b's archive entry is
    left byte for byte, and the probe ConfigMap gains nothing of team-b's."""
    op, _, victim = claims
    team_b = f"{op.namespace}-b"
    # No admission policy refuses the status writes below: what holds is the operator's own.
    bindings = json.loads(
        op.kube.kubectl("get", "validatingadmissionpolicybindings", "-o", "json").stdout
    )["items"]
    assert not [b for b in bindings if "slurmjob" in json.dumps(b)], bindings
    archive = Path(op.env["SLURMJOB_ARCHIVE_ROOT"])

    _apply_in(op, team_b, "b-logs", cpu_spec(["bash", "-c", "echo team-b-only-line"], PROFILE))
    done_b = _until(
        "team-b's job done",
        120,
        lambda: (
            (o := _get_in(op, team_b, "b-logs"))
            and (o.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            and o
        ),
    )
    assert done_b["status"]["phase"] == "Succeeded", done_b["status"]
    b_uid = done_b["metadata"]["uid"]
    b_staging = done_b["status"]["attempts"][-1]["stagingDir"]
    op.kube.kubectl("delete", "slurmjob", "b-logs", "-n", team_b, "--wait=true", timeout=90)
    b_entry = archive / team_b / b_uid
    _until("team-b's archive entry", 60, lambda: (b_entry / "record.json").exists())
    before = _entry_files(b_entry)
    assert any(b"team-b-only-line" in v for v in before.values())

    op.apply("a-logs", cpu_spec(["bash", "-c", "echo team-a-line"], PROFILE))
    done_a = op.wait_phase("a-logs", "Succeeded", "Failed", within=120)
    a_uid = done_a["metadata"]["uid"]
    owner_b = "tenant:team-b"
    attempts = done_a["status"]["attempts"]
    attempts[-1].update(
        {
            "stagingDir": b_staging,
            "jobId": victim,
            "probe": {
                "key": cache_key(owner_b, FIRST, "debug", "custom-sif", "a100"),
                "avoid": avoid_key(owner_b, FIRST),
                "ladder": 1,
            },
        }
    )
    op.kube.kubectl(
        "patch", "slurmjob", "a-logs", "-n", op.namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"attempts": attempts}}),
    )  # fmt: skip
    op.kube.kubectl("delete", "slurmjob", "a-logs", "-n", op.namespace, "--wait=true", timeout=90)
    a_entry = archive / op.namespace / a_uid
    _until("team-a's archive entry", 60, lambda: (a_entry / "record.json").exists())
    mine = _entry_files(a_entry)
    assert any(b"team-a-line" in v for v in mine.values())
    assert not any(b"team-b-only-line" in v for v in mine.values()), "team-b's logs archived"
    assert _entry_files(b_entry) == before, "team-b's entry changed"
    _running(op, victim)
    # The probe ConfigMap, if the operator made one, holds nothing of team-b's.
    found = op.kube.kubectl(
        "get", "configmap", "slurmjob-probe-cache", "-n", op.namespace, "-o", "json",
        check=False,
    )  # fmt: skip
    if found.returncode == 0:
        data = json.loads(found.stdout).get("data") or {}
        assert not [k for k, v in data.items() if owner_b in v], data


def test_status_claims_move_nothing_of_another_tenants_probe_cache(
    claims: tuple[Operator, int, int],
) -> None:
    """Issue 42: team-a's probe job, its status rewritten to name team-b's cache and avoid
    keys while it waits behind its upstream, steers only team-a's own entries: team-b's
    cached rung and avoid list (seeded as the operator writes them) stay as they were, the
    planted keys neither forget, plant nor blame anything of team-b's."""
    op, _, _ = claims
    name = op.env["SLURMJOB_PROBE_CONFIGMAP"]
    far = "2099-01-01T00:00:00Z"
    b_cache = "probe-" + "b" * 40
    b_avoid = avoid_key("tenant:team-b", FIRST)
    seeded = {
        b_cache: json.dumps({"rung": 0, "until": far, "owner": "tenant:team-b"}),
        b_avoid: json.dumps({"owner": "tenant:team-b", "nodes": {"b-node": far}}),
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": seeded,
    }
    op.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(configmap))
    pool = {"name": "main", "gpuSeries": "l40s", "nodes": 1, "gpusPerNode": 2}
    pool |= {"cpus": 1, "memoryGb": 1}
    op.apply("gate", cpu_spec(["sleep", "20"], PROFILE))
    op.apply(
        "probed",
        cpu_spec(
            ["true"], PROFILE, pools=[pool], launch={"shape": "nodes"}, dependsOn=[{"name": "gate"}]
        ),
    )
    try:
        waiting = op.wait_for(
            "probed",
            lambda o: _job_id(o) is not None and o["status"]["attempts"][-1].get("probe"),
            90,
            "probed's job sent with its probe planned, behind gate",
        )
        attempts = waiting["status"]["attempts"]
        assert attempts[-1]["probe"]["avoid"] == avoid_key("tenant:team-a", FIRST)
        attempts[-1]["probe"].update({"key": b_cache, "avoid": b_avoid})
        op.kube.kubectl(
            "patch", "slurmjob", "probed", "-n", op.namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": {"attempts": attempts}}),
        )  # fmt: skip
        op.wait_phase("gate", "Succeeded", within=90)
        op.wait_for(
            "probed",
            lambda o: (o["status"]["attempts"][0].get("probe") or {}).get("outcome"),
            150,
            "probed's probe record taken",
        )
        data = json.loads(
            op.kube.kubectl("get", "configmap", name, "-n", "default", "-o", "json").stdout
        )["data"]
        assert data[b_cache] == seeded[b_cache], "team-b's cached rung changed"
        assert data[b_avoid] == seeded[b_avoid], "team-b's avoid list changed"
        # What the record taught went under team-a's keys, made again from the resource.
        ours = {k: v for k, v in data.items() if k not in seeded}
        assert ours, data
        for key, value in ours.items():
            assert json.loads(value)["owner"] == "tenant:team-a", (key, value)
    finally:
        for job in ("gate", "probed"):
            op.kube.kubectl(
                "delete", "slurmjob", job, "-n", op.namespace, "--wait=false", check=False
            )
        op.kube.kubectl("delete", "configmap", name, "-n", "default", check=False)
