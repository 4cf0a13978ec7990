"""Limits checked before submit, and a staging directory the job user cannot write, on the
real stack: the testbed's partition `short` has MaxTime=30 (tests/testbed/slurm.py).

- A timeLimit over the partition's MaxTime is refused before anything is staged: Failed,
  reason LimitExceeded, the message naming the field and the limit, no Slurm job made.
- An operator without SLURMJOB_STAGING_OWNER (running as root) makes root-owned 0755 attempt
  directories that the job user `slurmci` cannot write: Slurm fails the job on its node with
  `RaisedSignal:53`, and the status says StagingNotWritable with the path, the user and the
  owner. `doctor`'s probe job finds the same before any job is run.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import OPERATOR, cpu_spec
from tests.integration.sitefiles import site_env
from tests.integration.test_operator_e2e import (
    RELEASES,
    Operator,
    _condition,
    _operator,
    release_testbed,
)
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SHORT_MAX_TIME, SHORT_PARTITION, SlurmTestbed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=RELEASES)
def limits_op(
    request: pytest.FixtureRequest,
    kube: KubeTestbed,
    crd: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    yield from _operator(kube, release_testbed(request), tmp_path_factory.mktemp("limits"))


@pytest.fixture(scope="module")
def rootowned_op(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(
        kube, slurm_2605, tmp_path_factory.mktemp("rootowned"), SLURMJOB_STAGING_OWNER=None
    )


def test_a_time_limit_over_the_partitions_max_time_is_refused(limits_op: Operator) -> None:
    op = limits_op
    over = SHORT_MAX_TIME + 30
    op.apply("too-long", cpu_spec(["true"], partition=SHORT_PARTITION, timeLimit=f"{over}m"))
    obj = op.wait_phase("too-long", "Failed", "Queued", "Running", "Succeeded")
    status = obj["status"]
    assert status["phase"] == "Failed", status
    failed = _condition(obj, "Failed")
    assert failed is not None
    assert failed["reason"] == "LimitExceeded"
    assert failed["message"] == (
        f"spec.timeLimit: {over} minutes exceeds the MaxTime of partition {SHORT_PARTITION} "
        f"({SHORT_MAX_TIME} minutes)"
    )
    assert status.get("attempts", []) == []
    assert "LimitExceeded" in [e["reason"] for e in op.events("too-long")]
    # Within the limit the same job runs.
    op.apply("fits", cpu_spec(["true"], partition=SHORT_PARTITION, timeLimit=f"{SHORT_MAX_TIME}m"))
    assert op.wait_phase("fits", "Succeeded", "Failed", within=90)["status"]["phase"] == (
        "Succeeded"
    )


def test_a_partition_that_does_not_exist_is_named(limits_op: Operator) -> None:
    op = limits_op
    op.apply("nowhere", cpu_spec(["true"], partition="no-such-partition"))
    obj = op.wait_phase("nowhere", "Failed", "Queued", "Running", "Succeeded")
    failed = _condition(obj, "Failed")
    assert failed is not None
    assert failed["reason"] == "LimitExceeded"
    assert failed["message"].startswith("spec.partition: partition no-such-partition does not")
    assert SHORT_PARTITION in failed["message"]


@pytest.mark.slurm2605
def test_a_staging_directory_the_job_user_cannot_write_is_named(rootowned_op: Operator) -> None:
    op = rootowned_op
    op.apply("unwritable", cpu_spec(["echo", "never seen"]))
    obj = op.wait_phase("unwritable", "Failed", "Succeeded", within=90)
    failed = _condition(obj, "Failed")
    assert failed is not None
    assert failed["status"] == "True"
    assert failed["reason"] == "StagingNotWritable", failed
    staging = obj["status"]["attempts"][-1]["stagingDir"]
    message = failed["message"]
    assert f"output file {staging}/stdout.log as the job user slurmci (uid " in message
    assert f"{staging} is owned by 0:0 with mode 0755" in message


def _doctor(testbed: SlurmTestbed, tmp: Path, **overrides: str | None) -> dict[str, Any]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), **site_env(testbed, "apptainer", tmp)}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    proc = subprocess.run(
        [str(OPERATOR), "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    checks: list[dict[str, Any]] = json.loads(proc.stdout)["checks"]
    [probe] = [c for c in checks if c["name"] == "staging writable"]
    return probe


@pytest.mark.slurm2605
def test_doctor_probes_the_staging_root_as_the_job_user(
    slurm_2605: SlurmTestbed, tmp_path: Path
) -> None:
    good = _doctor(slurm_2605, tmp_path)
    assert good["outcome"] == "ok", good
    assert "Slurm user slurmci" in good["detail"]
    bad = _doctor(slurm_2605, tmp_path, SLURMJOB_STAGING_OWNER=None)
    assert bad["outcome"] == "fail", bad
    assert "owned by 0:0 with mode 0755" in bad["detail"]
    assert "StagingNotWritable" in bad["detail"]
    leftovers = [p.name for p in slurm_2605.storage_root.iterdir() if "doctor" in p.name]
    assert leftovers == []
