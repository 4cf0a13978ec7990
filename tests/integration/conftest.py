"""Session fixtures for the real Slurm test clusters (see tests/testbed/slurm.py).

``slurm_2205`` / ``slurm_2605`` start (or, with SLURMJOB_TESTBED_KEEP=1, re-use) one cluster
each and stop it at session end unless SLURMJOB_TESTBED_KEEP=1. ``slurm`` is parametrized
over both. Run ``bash tests/testbed/install.sh`` (``make test`` does) before the first use.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:  # tests/ is not a package; make tests.testbed importable
    sys.path.insert(0, str(_REPO_ROOT))

from tests.k8s.fixtures import KubeTestbed, kube  # noqa: E402, F401
from tests.testbed.slurm import (  # noqa: E402
    SlurmTestbed,
    TestbedError,
    keep_requested,
    start_cluster,
    stop_cluster,
)

__all__ = ["SlurmTestbed"]


def _cluster(name: str) -> Iterator[SlurmTestbed]:
    try:
        testbed = start_cluster(name)
    except TestbedError as exc:
        pytest.fail(f"Slurm {name} test cluster did not start:\n{exc}", pytrace=False)
    try:
        yield testbed
    finally:
        if not keep_requested():
            stop_cluster(name)


@pytest.fixture(scope="session")
def slurm_2205() -> Iterator[SlurmTestbed]:
    """Debian 12's Slurm 22.05 on the host; slurmrestd v0.0.38 on 127.0.0.1:6820."""
    yield from _cluster("22.05")


@pytest.fixture(scope="session")
def slurm_2605() -> Iterator[SlurmTestbed]:
    """Slurm 26.05 in the debootstrap chroot; slurmrestd v0.0.45 on 127.0.0.1:26820."""
    yield from _cluster("26.05")


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("22.05", marks=pytest.mark.slurm2205),
        pytest.param("26.05", marks=pytest.mark.slurm2605),
    ],
)
def slurm(request: pytest.FixtureRequest) -> SlurmTestbed:
    """Each test using it runs once per cluster."""
    fixture = "slurm_2205" if request.param == "22.05" else "slurm_2605"
    testbed: SlurmTestbed = request.getfixturevalue(fixture)
    return testbed
