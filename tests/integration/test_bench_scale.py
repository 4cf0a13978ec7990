"""A small-N smoke of the scale bench (bench/scale, `make bench-scale`): both operators, one
shape, a short timeline. It checks that the harness measures real things, not the figures.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.k8s.kube import KubeTestbed
from tests.testbed.slurm import SlurmTestbed

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scale import __main__ as scale  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slurm2605]

N = 12
INTERVAL = 2.0


@pytest.mark.timeout(330)
def test_scale_bench_smoke(kube: KubeTestbed, slurm_2605: SlurmTestbed, tmp_path: Path) -> None:
    args = scale.parse(
        [
            f"--sizes={N}",
            "--shapes=live",
            "--repeats=1",
            f"--interval={INTERVAL:g}",
            "--steady-intervals=2",
            "--change-rounds=1",
            "--submit-timeout=60",
            "--delete-timeout=60",
            "--restart-window=5",
            f"--json={tmp_path / 'scale.json'}",  # never the repository's results
            "--no-logtail",
            "--no-report",
        ]
    )
    results = asyncio.run(scale.bench(args, tmp_path, slurm_2605, kube))
    assert (tmp_path / "scale.json").exists()
    runs: dict[str, dict[str, Any]] = {r["operator"]: r for r in results["runs"]}
    assert set(runs) == {"baseline", "operator"}
    for kind, run in runs.items():
        assert "error" not in run, (kind, run.get("error"))
        assert run["submit"]["all"], (kind, run["submit"])
        assert run["submit"]["count"] == N, (kind, run["submit"])
        assert run["submit"]["p50"] is not None
        assert run["submit"]["p50"] >= 0
        steady = run["steady"]
        assert steady["slurm"]["requests"] > 0, (kind, steady)
        assert steady["apiserver"]["requests"] >= 0
        assert run["rss_peak"] > 10e6, kind
        assert run["rss_series"], kind
        change = run["change"]
        assert change["cancelled"] >= 1
        assert change["seen"] == change["cancelled"], (kind, change)  # every one propagated
        assert all(0 <= d < 3 * INTERVAL + 30 for d in change["delays"]), (kind, change)
        assert run["restart"]["steady"], (kind, run["restart"])
        assert run["delete"]["deleted"] == N, (kind, run["delete"])
        assert run["etcd"]["etcd_mvcc_db_total_size_in_bytes"] > 0
    # The design difference the bench exists to show: per-job GETs against one sweep.
    base = runs["baseline"]["steady"]["slurm"]["by_kind"]
    ours = runs["operator"]["steady"]["slurm"]["by_kind"]
    assert base.get("GET job/{id}", 0) >= N * 0.8, base
    assert ours.get("GET jobs/state", 0) >= 0.5, ours
    assert ours.get("GET job/{id}", 0) == 0, ours
    # The operator's deletions look for their jobs in listings they share, never one read
    # per SlurmJob.
    deleting = runs["operator"]["delete"]["slurm"]["by_kind"]
    assert deleting.get("GET job/{id}", 0) == 0, deleting
    assert 1 <= deleting.get("GET jobs", 0) <= N, deleting
    # Operator status carries the log tails, the baseline's only a phase and a job id.
    assert runs["operator"]["status_bytes"]["mean"] > runs["baseline"]["status_bytes"]["mean"]
