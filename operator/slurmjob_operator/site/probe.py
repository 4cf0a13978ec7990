"""What the batch script's collective probe is given (`templates/probe.sh.j2`): the site's
program and ladder for the job's runtime, the rung a fresh cache entry names, the least bus
bandwidth the job's GPU series accept."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.core.probe import ProbePlan, wants_probe
from slurmjob_operator.site.artifacts import Artifact
from slurmjob_operator.site.catalogs import GpuSeries


def probe_runs(spec: SlurmJobSpec, runtime: Artifact) -> bool:
    """Whether this job's script probes (or takes a cached rung): a probe is configured for
    its runtime and the job is one TAO probes (`core.probe.wants_probe`)."""
    return runtime.probe is not None and wants_probe(spec)


def least_bandwidth(series: Mapping[str, GpuSeries | None]) -> float | None:
    """The least bus bandwidth among the pools' series minimums: one all-reduce spans them
    all, so the slowest series' floor is the one a passing probe can be held to."""
    floors = [s.min_bus_bandwidth for s in series.values() if s and s.min_bus_bandwidth]
    return min(floors) if floors else None


def probe_values(
    spec: SlurmJobSpec,
    runtime: Artifact,
    series: Mapping[str, GpuSeries | None],
    plan: ProbePlan | None,
) -> dict[str, Any]:
    probe = runtime.probe
    if probe is None or not probe_runs(spec, runtime):
        return {"probe": False}
    cached = plan.cached_rung if plan is not None else None
    floor = least_bandwidth(series)
    return {
        "probe": True,
        "probe_command": list(probe.command),
        "probe_timeout": probe.timeout_seconds,
        # Slurm's own limit on the step, behind the script's: whole minutes, with a margin.
        "probe_step_minutes": probe.timeout_seconds // 60 + 2,
        "probe_rungs": [[f"{n}={v}" for n, v in probe.rung_env(i)] for i in range(probe.rungs)],
        "probe_cached_rung": cached if cached is not None and cached < probe.rungs else None,
        "probe_min_bandwidth": f"{floor:g}" if floor is not None else "",
    }
