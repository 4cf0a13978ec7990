"""A one-round smoke of `bench/container_start.py` on Slurm 22.05: every mode of entering a
container ran in the same job, and the figures are measurements (each mode's first line came
after srun started, the container modes cost more than the plain step)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.testbed.slurm import SlurmTestbed

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.container_start import MODES, measure  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slurm2205]


def test_container_start_bench_smoke(slurm_2205: SlurmTestbed) -> None:
    figures = measure(slurm_2205, "base", rounds=1)
    assert figures["rounds"] == 1
    for mode in MODES:
        assert figures[mode]["median_s"] > 0, figures
    assert figures["plain"]["overhead_s"] == 0
    for mode in ("pyxis-squashfuse", "enroot-create", "apptainer"):
        assert figures[mode]["overhead_s"] > 0, figures
