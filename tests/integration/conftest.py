"""Session fixtures for the real Slurm test clusters (see tests/testbed/slurm.py).

``slurm_2205`` / ``slurm_2605`` start (or, with SLURMJOB_TESTBED_KEEP=1, re-use) one cluster
each and stop it at session end unless SLURMJOB_TESTBED_KEEP=1. ``slurm`` is parametrized
over both. Run ``bash tests/testbed/install.sh`` (``make test`` does) before the first use.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:  # tests/ is not a package; make tests.testbed importable
    sys.path.insert(0, str(_REPO_ROOT))

from tests.integration import leaks  # noqa: E402
from tests.k8s.fixtures import KubeTestbed, kube  # noqa: E402, F401
from tests.testbed import registry as registries  # noqa: E402
from tests.testbed.slurm import (  # noqa: E402
    SlurmTestbed,
    TestbedError,
    keep_requested,
    start_cluster,
    stop_cluster,
)

__all__ = ["SlurmTestbed"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """The leak scan (tests/integration/leaks.py) after the test's body, before its fixtures
    clean up what the operator wrote."""
    since = time.time() - 1
    result = yield
    funcargs = getattr(item, "funcargs", {})
    testbeds = [v for v in funcargs.values() if isinstance(v, SlurmTestbed)]
    testbeds += [v for k, v in funcargs.items() if k == "bed" and hasattr(v, "testbed")]
    beds = [getattr(b, "testbed", b) for b in testbeds]
    kube_bed = funcargs.get("kube")
    if not beds and kube_bed is None:
        return result
    kube_json = None
    if isinstance(kube_bed, KubeTestbed):
        proc = kube_bed.kubectl("get", "slurmjobs,events", "-A", "-o", "json", check=False)
        kube_json = proc.stdout if proc.returncode == 0 else None
    tmp = funcargs.get("tmp_path")
    logs = sorted(Path(tmp).rglob("*.log")) if isinstance(tmp, Path) else []
    found = leaks.scan(
        storage_roots={b.storage_root for b in beds} or {Path("/srv/slurmjob-testbed/storage")},
        key_files={b.jwt_key_file for b in beds},
        since=since,
        operator_logs=logs,
        kube_json=kube_json,
    )
    assert not found, "the operator wrote what must never leave a Secret or a key:\n" + "\n".join(
        found
    )
    return result


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


@pytest.fixture(scope="session")
def registry() -> Iterator[registries.Registries]:
    """The OCI registries on 127.0.0.1:25000 (open) and 25001 (private, Basic auth) with the
    test bed's images pushed (tests/testbed/registry.py); stopped at session end unless
    SLURMJOB_TESTBED_KEEP=1 (in tests/lanes.py the runner's, attached to)."""
    try:
        regs = registries.start_registries()
    except registries.RegistryError as exc:
        pytest.fail(f"the test bed's registries did not start:\n{exc}", pytrace=False)
    try:
        yield regs
    finally:
        if not registries.keep_requested():
            registries.stop_registries()


@pytest.fixture(scope="module")
def crd(request: pytest.FixtureRequest) -> None:
    """The CRD of this release, applied once per module (the upgrade test applies an older
    one, so every module asks for it again)."""
    bed: KubeTestbed = request.getfixturevalue("kube")
    bed.apply(Path(__file__).resolve().parents[2] / "crds/slurmjob.io_slurmjobs.yaml")
    bed.wait_established("slurmjobs.slurmjob.io")
