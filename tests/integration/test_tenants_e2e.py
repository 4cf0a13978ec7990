"""Tenancy end to end: `slurmjob-operator run` with SLURMJOB_TENANTS_FILE against the real
kube-apiserver and Slurm 26.05. A SlurmJob in a namespace of no tenant is refused with
TenantUnknown, and one that breaks its tenant's limits with InvalidSpec naming the field;
neither reaches Slurm. A tenant with its own `slurmUser` and `uid` (the testbed's Unix users
team-a 2101 and team-b 2102) has its job submitted and cancelled as that Slurm user, running
as that uid, with attempt files the operator owns and an ACL opens to that uid alone."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import CRD, Operator, _attempt, _condition, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.core import naming
from slurmjob_operator.core.jobview import BaseState
from slurmjob_operator.storage import acl
from slurmjob_operator.storage.acl import Tag

pytestmark = pytest.mark.integration


def write_tenants(path: Path, namespace: str | None = None) -> None:
    """A tenant of some other namespace, and with `namespace` a tenant "e2e" owning it."""
    tenants: list[dict[str, Any]] = [
        {
            "name": "other",
            "namespaces": ["tenant-other-ns"],
            "accounts": ["other-acct"],
            "partitions": ["debug"],
        }
    ]
    if namespace is not None:
        tenants.append(
            {
                "name": "e2e",
                "namespaces": [namespace],
                "accounts": ["e2e-acct"],
                "partitions": ["debug"],
                "mountSources": ["datasets/e2e"],
                "maxTimeLimit": "30m",
            }
        )
    path.write_text(yaml.safe_dump({"tenants": tenants}))


@pytest.fixture(scope="module")
def tenant_op(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Operator, Path]]:
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    tmp = tmp_path_factory.mktemp("tenants")
    path = tmp / "tenants.yaml"
    write_tenants(path)
    # One pass: after the tests, `_operator` stops the operator and deletes its namespace.
    for op in _operator(kube, slurm_2605, tmp, SLURMJOB_TENANTS_FILE=str(path)):
        yield op, path


def refused(op: Operator, name: str, reason: str) -> dict[str, Any]:
    """Wait for Ready=False with `reason`; prove nothing was recorded or reached Slurm."""
    obj = op.wait_for(
        name,
        lambda o: (_condition(o, "Ready") or {}).get("reason") == reason,
        what=f"Ready=False {reason}",
    )
    ready = _condition(obj, "Ready")
    assert ready is not None
    assert ready["status"] == "False"
    assert obj["status"].get("attempts", []) == []
    uid8 = obj["metadata"]["uid"][:8]
    assert op.slurm_jobs_named(f"sj-{op.namespace}-{name}-{uid8}-a1") == []
    assert reason in [e["reason"] for e in op.events(name)]
    return ready


@pytest.mark.slurm2605
def test_a_namespace_of_no_tenant_submits_nothing(tenant_op: tuple[Operator, Path]) -> None:
    op, _ = tenant_op
    op.apply("orphan", cpu_spec(["true"]))
    ready = refused(op, "orphan", "TenantUnknown")
    assert f"namespace '{op.namespace}' belongs to no tenant" in ready["message"]
    op.kube.kubectl(
        "delete", "slurmjob", "orphan", "-n", op.namespace, "--timeout=60s", check=False
    )


@pytest.mark.slurm2605
def test_a_tenants_limits_are_enforced_before_submit(tenant_op: tuple[Operator, Path]) -> None:
    op, path = tenant_op
    # The file is read at start: list the namespace, then restart the operator.
    op.stop()
    write_tenants(path, op.namespace)
    op.start()
    op.apply("foreign-account", cpu_spec(["true"], account="other-acct"))
    ready = refused(op, "foreign-account", "InvalidSpec")
    assert ready["message"].startswith(
        "spec.account: 'other-acct' is not in tenant e2e's accounts (e2e-acct)"
    )
    mounts = [{"source": "datasets/e2e-other", "target": "/data", "readOnly": True}]
    op.apply("foreign-mount", cpu_spec(["true"], mounts=mounts))
    ready = refused(op, "foreign-mount", "InvalidSpec")
    assert ready["message"].startswith("spec.mounts[0].source: 'datasets/e2e-other' is not under")
    op.apply("too-long", cpu_spec(["true"], timeLimit="2h"))
    ready = refused(op, "too-long", "InvalidSpec")
    assert ready["message"].startswith("spec.timeLimit: 120 minutes is longer than")


# -- tenants with their own Slurm user and uid ------------------------------------------------

TEAM_A_UID = 2101
TEAM_B_UID = 2102
# The tenants' jobs run through real Pyxis and Enroot, as each tenant's uid (Enroot's per-user
# directories for both are made by tests/testbed/runtimes.sh).
PROFILE = "enroot-pyxis"


def write_user_tenants(path: Path, namespace_a: str, namespace_b: str) -> None:
    def tenant(name: str, namespace: str, uid: int) -> dict[str, Any]:
        return {
            "name": name,
            "namespaces": [namespace],
            "accounts": [name],
            "partitions": ["debug"],
            "mountSources": [f"datasets/{name}", "datasets/public"],
            "slurmUser": name,
            "uid": uid,
        }

    tenants = [tenant("team-a", namespace_a, TEAM_A_UID), tenant("team-b", namespace_b, TEAM_B_UID)]
    path.write_text(yaml.safe_dump({"tenants": tenants}))


def _require_users(testbed: SlurmTestbed) -> None:
    """The tenants' Unix users, on the host and in the 26.05 chroot (tests/testbed/install.sh)."""
    assert testbed.chroot is not None
    passwd = (testbed.chroot / "etc" / "passwd").read_text().splitlines()
    for name, uid in (("team-a", TEAM_A_UID), ("team-b", TEAM_B_UID)):
        try:
            host = pwd.getpwnam(name).pw_uid
        except KeyError:
            host = None
        inside = [line for line in passwd if line.startswith(f"{name}:")]
        if host != uid or not inside or inside[0].split(":")[2] != str(uid):
            pytest.fail(
                f"user {name} (uid {uid}) is missing on the host or in {testbed.chroot}: "
                "run `bash tests/testbed/install.sh`",
                pytrace=False,
            )
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing", pytrace=False)


@pytest.fixture(scope="module")
def users_op(
    kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    _require_users(slurm_2605)
    kube.apply(CRD)
    kube.wait_established("slurmjobs.slurmjob.io")
    tmp = tmp_path_factory.mktemp("tenant-users")
    path = tmp / "tenants.yaml"
    write_user_tenants(path, "tenant-users-placeholder-a", "tenant-users-placeholder-b")
    # The operator mints team-a's tokens with the key of its own (SLURMJOB_SLURM_JWT_KEY_FILE,
    # as every e2e operator runs); SLURMJOB_STAGING_OWNER (slurmci) stays set: a tenant uid
    # takes precedence for its jobs.
    for op in _operator(kube, slurm_2605, tmp, PROFILE, SLURMJOB_TENANTS_FILE=str(path)):
        assert op.env["SLURMJOB_SLURM_JWT_KEY_FILE"] == str(slurm_2605.jwt_key_file)
        assert op.env["SLURMJOB_SLURM_REST_USER"] == slurm_2605.user
        # The namespace is made by `_operator`: name it in the file, then restart (read once).
        op.stop()
        write_user_tenants(path, op.namespace, f"{op.namespace}-b")
        op.start()
        yield op


def _as_uid(uid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        check=False,
    )


def _read_acl(path: Path, *, default: bool = False) -> acl.Acl | None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return acl.read_acl(fd, default=default)
    finally:
        os.close(fd)


@pytest.mark.slurm2605
def test_a_tenants_job_runs_as_its_user_with_files_only_its_uid_can_use(
    users_op: Operator,
) -> None:
    op = users_op
    name = "as-team-a"
    op.apply(
        name,
        cpu_spec(["bash", "-c", 'echo "uid=$(id -u) user=$(id -un)"; sleep 300'], PROFILE),
    )
    try:
        obj = op.wait_for(
            name,
            lambda o: (
                "uid=2101"
                in (((o.get("status") or {}).get("logs") or {}).get("stdout") or {}).get("tail", "")
            ),
            within=90,
            what="team-a's stdout tail",
        )
        assert obj["status"]["phase"] == "Running", obj["status"]
        assert "user=team-a" in obj["status"]["logs"]["stdout"]["tail"]
        attempt = _attempt(obj)
        [job] = op.slurm_job(attempt["jobId"])
        assert job.user == "team-a", "submitted as the tenant's slurmUser"
        assert job.base_state is BaseState.RUNNING

        storage = op.testbed.storage_root
        staging = naming.staging_dir(storage, op.namespace, name, obj["metadata"]["uid"], 1)
        assert Path(attempt["stagingDir"]) == staging
        assert (staging / "stdout.log").stat().st_uid == TEAM_A_UID, "written by the job's uid"
        # The operator owns what it staged (no chown: not slurmci, SLURMJOB_STAGING_OWNER's).
        for path in (staging, staging / "job.sh", staging / "job.env"):
            assert path.stat().st_uid == os.geteuid(), path
        access = _read_acl(staging)
        assert access is not None
        assert access.get(Tag.USER, TEAM_A_UID) == acl.RWX
        assert access.get(Tag.USER, TEAM_B_UID) is None
        assert access.get(Tag.OTHER) == 0
        default = _read_acl(staging, default=True)
        assert default is not None
        assert default.get(Tag.USER, TEAM_B_UID) is None
        for parent in (staging.parent, staging.parent.parent):
            passing = _read_acl(parent)
            assert passing is not None
            assert passing.get(Tag.USER, TEAM_A_UID) == acl.X, parent
            assert passing.get(Tag.USER, TEAM_B_UID) is None, parent

        script = str(staging / "job.sh")
        mine = _as_uid(TEAM_A_UID, "cat", script)
        assert mine.returncode == 0, mine.stderr
        assert "#!/bin/bash" in mine.stdout.splitlines()[0]
        theirs = _as_uid(TEAM_B_UID, "cat", script)
        assert theirs.returncode != 0, "team-b read team-a's job.sh"
        assert "Permission denied" in theirs.stderr, theirs.stderr
        listing = _as_uid(TEAM_B_UID, "ls", str(staging.parent.parent))
        assert listing.returncode != 0, "team-b listed team-a's resources"

        # Deleting cancels it, as team-a: the operator's Slurm user (slurmci, no admin, no
        # accounting to make it one) may not cancel a job of another user. (Not tried here:
        # on this testbed's Slurm 26.05 such a refused cancel leaves slurmctld answering no
        # RPC at all until it is killed, which would take every later test down with it.)
        op.kube.kubectl("delete", "slurmjob", name, "-n", op.namespace, "--timeout=60s", timeout=70)
        assert op.get(name) is None
        [job] = op.slurm_job(attempt["jobId"])
        assert job.base_state is BaseState.CANCELLED
        assert job.user == "team-a"
        assert "Cancelled" in [e["reason"] for e in op.events(name)]
        assert not staging.parent.exists(), "the operator removed what the job wrote too"
    finally:
        op.kube.kubectl(
            "delete", "slurmjob", name, "-n", op.namespace, "--timeout=60s", check=False
        )


@pytest.mark.slurm2605
def test_a_tenant_with_its_own_user_stays_within_its_limits(users_op: Operator) -> None:
    op = users_op
    mounts = [{"source": "datasets/team-b", "target": "/data", "readOnly": True}]
    cases = [
        (
            "b-data",
            {"mounts": mounts},
            "spec.mounts[0].source: 'datasets/team-b' is not under tenant team-a's "
            "mountSources (datasets/team-a, datasets/public)",
        ),
        (
            "b-account",
            {"account": "team-b"},
            "spec.account: 'team-b' is not in tenant team-a's accounts (team-a)",
        ),
        (
            "partition-list",
            {"partition": "debug,debug"},
            "spec.partition: 'debug,debug' is a list; a tenant's job names one partition",
        ),
    ]
    try:
        for name, extra, _ in cases:
            op.apply(name, cpu_spec(["true"], PROFILE, **extra))
        for name, _, message in cases:
            ready = refused(op, name, "InvalidSpec")
            assert ready["message"].startswith(message), ready["message"]
    finally:
        for name, _, _ in cases:
            op.kube.kubectl(
                "delete", "slurmjob", name, "-n", op.namespace, "--timeout=60s", check=False
            )
