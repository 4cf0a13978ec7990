"""Validation of a spec against the site: runtime registry, GPU series catalog, settings.

The intrinsic rules live in `api.spec`; here are the ones that need the site's catalogs.
Every refusal is a `SpecError` whose messages start with the offending field's path.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.config import Settings
from slurmjob_operator.site.catalogs import (
    PROFILE_FORMAT,
    GpuSeries,
    GpuSeriesCatalog,
    RuntimeArtifact,
    RuntimeRegistry,
)

_MAX_LISTED = 10


@dataclass(frozen=True)
class SiteResolution:
    """What the site makes of a valid spec; the renderer takes it from here."""

    runtime: RuntimeArtifact
    series: dict[str, GpuSeries | None]
    """Per pool: its catalog entry, or None when the pool names no gpuSeries (CPU-only)."""
    partition: str | None
    exclusive: dict[str, bool]
    """Per pool: True when it asks for every GPU of its nodes, so it may as well own them."""

    def constraint(self, pool: str) -> str | None:
        series = self.series.get(pool)
        return series.slurm_constraint if series is not None else None


def _known(names: list[str]) -> str:
    if not names:
        return "the catalog is empty"
    shown = ", ".join(sorted(names)[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return f"known: {shown}" + (f" and {more} more" if more > 0 else "")


def _runtime(
    spec: SlurmJobSpec, settings: Settings, registry: RuntimeRegistry, errors: list[str]
) -> RuntimeArtifact | None:
    field = "spec.framework.runtimeId"
    runtime_id = spec.framework.runtime_id
    runtime = registry.get(runtime_id)
    if runtime is None:
        errors.append(
            f"{field}: runtime {runtime_id!r} is not in the site's runtime registry "
            f"({_known([r.id for r in registry.runtimes])})"
        )
        return None
    profile = settings.slurm_runtime_profile
    wanted = PROFILE_FORMAT[profile]
    if runtime.format is not wanted:
        errors.append(
            f"{field}: runtime {runtime_id!r} is a {runtime.format.value} artifact, but this "
            f"site's runtime profile {profile.value} runs {wanted.value} artifacts"
        )
    return runtime


def resolve_site(
    spec: SlurmJobSpec,
    settings: Settings,
    registry: RuntimeRegistry,
    gpu_series: GpuSeriesCatalog,
) -> SiteResolution:
    """Check the spec against the site's catalogs; every problem found is reported at once."""
    errors: list[str] = []
    runtime = _runtime(spec, settings, registry, errors)
    heterogeneous = spec.is_heterogeneous
    series: dict[str, GpuSeries | None] = {}
    exclusive: dict[str, bool] = {}
    known = [s.name for s in gpu_series.series]
    for index, pool in enumerate(spec.pools):
        at = f"spec.pools[{index}]"
        entry: GpuSeries | None = None
        if pool.gpu_series:
            entry = gpu_series.get(pool.gpu_series)
            if entry is None:
                errors.append(
                    f"{at}.gpuSeries: unknown GPU series {pool.gpu_series!r} ({_known(known)})"
                )
        if heterogeneous and pool.gpus_per_node == 0:
            errors.append(
                f"{at}.gpusPerNode: pool {pool.name} asks for no GPUs; every component of a "
                "heterogeneous job is a GPU pool (a CPU-only job has exactly one pool)"
            )
        if entry is not None and pool.gpus_per_node > entry.gpus_per_node:
            errors.append(
                f"{at}.gpusPerNode: {pool.gpus_per_node} GPUs per node, but series "
                f"{entry.name!r} has {entry.gpus_per_node} per node"
            )
        if heterogeneous and entry is not None and not entry.slurm_constraint:
            errors.append(
                f"{at}.gpuSeries: series {entry.name!r} declares no slurmConstraint, so a "
                "heterogeneous component could land on arbitrary GPU nodes; refused "
                "(fail-closed): give the series a slurmConstraint in the GPU series catalog"
            )
        series[pool.name] = entry
        exclusive[pool.name] = entry is not None and pool.gpus_per_node == entry.gpus_per_node
    if errors or runtime is None:
        raise SpecError(errors)
    return SiteResolution(
        runtime=runtime,
        series=series,
        partition=spec.partition or settings.slurm_partition,
        exclusive=exclusive,
    )
