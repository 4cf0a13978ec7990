"""Session fixture for the local Kubernetes API server (see tests/k8s/kube.py).

``kube`` starts (or, with SLURMJOB_TESTBED_KEEP=1, re-uses) etcd + kube-apiserver and stops
them at session end unless SLURMJOB_TESTBED_KEEP=1. Run ``bash tests/k8s/build.sh`` (``make
test`` does) before the first use. Register it from tests/integration/conftest.py with::

    from tests.k8s.fixtures import KubeTestbed, kube  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.k8s.kube import (
    KubeTestbed,
    TestbedError,
    keep_requested,
    start_testbed,
    stop_testbed,
)

__all__ = ["KubeTestbed", "kube"]


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeTestbed]:
    """etcd + kube-apiserver (RBAC on) on 127.0.0.1:22443; admin kubeconfig, kubectl, helm."""
    try:
        testbed = start_testbed()
    except TestbedError as exc:
        pytest.fail(f"Kubernetes test bed did not start:\n{exc}", pytrace=False)
    try:
        yield testbed
    finally:
        if not keep_requested():
            stop_testbed()
