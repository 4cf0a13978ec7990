"""Tenancy end to end: `slurmjob-operator run` with SLURMJOB_TENANTS_FILE against the real
kube-apiserver and Slurm 26.05. A SlurmJob in a namespace of no tenant is refused with
TenantUnknown, and one that breaks its tenant's limits with InvalidSpec naming the field;
neither reaches Slurm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.helpers import cpu_spec
from tests.integration.test_operator_e2e import CRD, Operator, _condition, _operator
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

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
