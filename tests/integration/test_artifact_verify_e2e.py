"""Verified registry artifacts end to end (issue 44, section 4): with
SLURMJOB_ARTIFACT_VERIFY_JOBS on, a SlurmJob naming a runtimeId against a real kube-apiserver,
the operator as its own process and real Slurm 22.05 (Enroot + Pyxis).

The runtime is a copy of the test bed's base image that the site publishes as a site should:
a file of root's, mode 0444, in a directory of root's, mode 0755. Its own copy, never a hard
link of the shared image: every link made or removed (another module publishing the same
image) changes the inode's ctime, and with it the stat line the jobs compare.

The verification job is a real Slurm job of the cache user (`slurmimg`) on the `debug`
partition running the operator's verification script; the SlurmJobs then run in that very
squashfs through Pyxis, checked on the node by the recorded stat line: their staged script
carries no sha256 at all, so a node that hashed would have refused to start.

Images themselves stay off: the setting needs the cache's settings, not images.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import cpu_spec
from tests.integration.test_image_cache_e2e import (
    CACHE_USER,
    cache_user_env,
    condition,
    new_cache_root,
)
from tests.integration.test_operator_e2e import Operator, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed import images
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration]

MARKER = "/etc/slurmjob-testbed-image"
RUNTIME_ID = "custom-verified-sqsh"
VERIFY_WITHIN = 240


@pytest.fixture(scope="module")
def cache_root() -> Iterator[Path]:
    yield from new_cache_root("verify")


@pytest.fixture(scope="module")
def runtime(slurm_2205: SlurmTestbed) -> Iterator[dict[str, Any]]:
    """The runtime registry's entry of a copy of the base image, root's and read-only, in a
    directory of root's that no one else may write."""
    root = slurm_2205.storage_root
    folder = root / f"verified-runtimes-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    os.chown(folder, 0, 0)
    folder.chmod(0o755)
    source = images.image("base", "sqsh")
    path = folder / "testbed-base.sqsh"
    shutil.copyfile(source, path)
    os.chown(path, 0, 0)
    path.chmod(0o444)
    yield {
        "id": RUNTIME_ID,
        "format": "sqsh",
        "path": str(path.relative_to(root)),
        "sha256": images.sha256(source),
    }
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def op(
    kube: KubeTestbed,
    crd: None,
    slurm_2205: SlurmTestbed,
    cache_root: Path,
    runtime: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    tmp = tmp_path_factory.mktemp("verify")
    registry = tmp / "verified-runtimes.yaml"
    registry.write_text(json.dumps({"runtimes": [runtime]}))
    yield from _operator(
        kube,
        slurm_2205,
        tmp,
        "enroot-pyxis",
        SLURMJOB_RUNTIME_REGISTRY_FILE=str(registry),
        SLURMJOB_ARTIFACT_VERIFY_JOBS="1",
        **cache_user_env(slurm_2205, cache_root),
    )
    # The records are the operator's, in `default`: this module's go with it.
    for record in _records(kube, slurm_2205.storage_root / runtime["path"]):
        kube.kubectl(
            "delete", "configmap", f"slurmjob-{record['key']}", "-n", "default", check=False
        )


def _records(kube: KubeTestbed, node_path: Path) -> list[dict[str, Any]]:
    """The operator's verification records of the artifact at `node_path` (its ConfigMaps in
    its namespace)."""
    proc = kube.kubectl("get", "configmaps", "-n", "default", "-o", "json")
    found = []
    for item in json.loads(proc.stdout)["items"]:
        if not item["metadata"]["name"].startswith("slurmjob-artifact-"):
            continue
        record = json.loads((item.get("data") or {}).get("record", "{}"))
        if record.get("path") == str(node_path):
            found.append(record)
    return found


def _spec(command: list[str]) -> dict[str, Any]:
    spec = cpu_spec(command, "enroot-pyxis")
    spec["framework"] = {"kind": "custom", "name": "custom", "runtimeId": RUNTIME_ID}
    return spec


@pytest.mark.slurm2205
def test_a_runtime_verified_once_runs_its_jobs_on_the_stat_check(
    op: Operator, runtime: dict[str, Any], cache_root: Path
) -> None:
    path = op.testbed.storage_root / runtime["path"]
    command = ["sh", "-c", f"cat {MARKER}; echo ran-verified"]
    op.apply("verified-a", _spec(command))
    op.wait_for(
        "verified-a",
        lambda o: (
            condition(o, "ImageReady").get("reason") in ("ArtifactVerifying", "ArtifactVerified")
        ),
        within=60,
        what="ImageReady",
    )
    first = op.wait_phase("verified-a", "Succeeded", "Failed", within=VERIFY_WITHIN)
    status = first["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert "ran-verified" in json.dumps((status.get("logs") or {}).get("stdout") or {})

    # One verification job: the cache user's, on the import partition, its result recorded.
    (record,) = _records(op.kube, path)
    assert record["state"] == "Verified", record
    assert record["attempt"]["number"] == 1
    name = record["attempt"]["jobName"]
    job = op.slurm_job(int(record["attempt"]["jobId"]))
    assert job, record
    assert job[0].user == CACHE_USER
    assert [j.job_id for j in op.slurm_jobs_named(name)] == [record["attempt"]["jobId"]]
    result = cache_root / "verify" / f"{name}.result"
    assert result.lstat().st_uid == pwd.getpwnam(CACHE_USER).pw_uid
    info = path.lstat()
    verified = record["verified"]
    assert verified["sha256"] == runtime["sha256"]
    assert (verified["size"], verified["inode"], verified["ctimeNs"]) == (
        info.st_size,
        info.st_ino,
        info.st_ctime_ns,
    )
    assert (verified["ownerUid"], verified["mode"]) == (0, 0o444)
    ready = condition(first, "ImageReady")
    assert (ready["status"], ready["reason"]) == ("True", "ArtifactVerified"), ready
    assert ready["message"].endswith(f"verified by {name}"), ready

    # The job's node compared the stat line: its script has no sha256 to compare at all.
    script = (Path(status["attempts"][0]["stagingDir"]) / "job.sh").read_text()
    seconds, ns = divmod(info.st_ctime_ns, 10**9)
    recorded = f"regular file 0 444 {info.st_size} {info.st_ino} {seconds}.{ns:09d}"
    assert f"artifact_recorded='{recorded}'" in script
    assert "artifact_sha256=''" in script
    assert runtime["sha256"] not in script

    # A second SlurmJob runs with no second verification job.
    op.apply("verified-b", _spec(command))
    second = op.wait_phase("verified-b", "Succeeded", "Failed", within=VERIFY_WITHIN)
    assert second["status"]["phase"] == "Succeeded", json.dumps(second["status"], indent=1)
    ready_b = condition(second, "ImageReady")
    assert (ready_b["status"], ready_b["reason"]) == ("True", "ArtifactVerified"), ready_b
    (again,) = _records(op.kube, path)
    assert again["attempt"] == record["attempt"], again  # the same, only job
    assert again["verified"] == record["verified"]
    assert [j.job_id for j in op.slurm_jobs_named(name)] == [record["attempt"]["jobId"]]
    events = [e["reason"] for e in op.events("verified-b")]
    assert "ArtifactVerifying" not in events, events
