"""Walltime segments through Pyxis and Enroot (issue 43): Slurm's warning signal reaches the
program inside an Enroot container started by Pyxis, as test_walltime_e2e.py shows for
Apptainer. A module of its own: it waits two two-minute segments on Slurm's clock, in a lane
of its own beside the others (`[lanes] own` in tests/budgets.toml)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.integration.test_operator_e2e import Operator, _operator
from tests.integration.test_walltime_e2e import count_through_three_segments
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]


@pytest.fixture(scope="module")
def op(
    kube: KubeTestbed, crd: None, slurm_2605: SlurmTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    yield from _operator(kube, slurm_2605, tmp_path_factory.mktemp("walltime"), "enroot-pyxis")


def test_the_warning_signal_reaches_the_program_in_an_enroot_container(op: Operator) -> None:
    count_through_three_segments(op)
