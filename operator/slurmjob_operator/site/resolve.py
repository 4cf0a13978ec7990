"""Validation of a spec against the site: runtime registry, GPU series catalog, settings and,
when the site has a tenants file, the limits of the tenant of the SlurmJob's namespace.

The intrinsic rules live in `api.spec`; here are the ones that need the site's catalogs.
Every refusal is a `SpecError` whose messages start with the offending field's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
from slurmjob_operator.site.mounts import mount_problems
from slurmjob_operator.site.tenantentry import Tenant
from slurmjob_operator.site.tenants import TenantScope

_MAX_LISTED = 10


@dataclass(frozen=True)
class SiteResolution:
    """What the site makes of a valid spec; the renderer takes it from here."""

    runtime: RuntimeArtifact | None
    """The runtime registry's artifact, or None for `spec.framework.image`: the image cache
    checks and makes ready what such a spec names (imagecache/), never the site's registry."""
    series: dict[str, GpuSeries | None]
    """Per pool: its catalog entry, or None when the pool names no gpuSeries (CPU-only)."""
    partition: str | None
    exclusive: dict[str, bool]
    """Per pool: True when it asks for every GPU of its nodes, so it may as well own them."""
    account: str | None = None
    qos: str | None = None
    time_limit_minutes: int | None = None
    """The account, QOS and time limit the job is submitted with: the spec's, or the
    tenant's defaults when the spec gives none."""
    tenant: Tenant | None = None
    """The tenant of the SlurmJob's namespace (None without a tenants file): its slurmUser
    and uid say whom the job runs as."""

    def applied_to(self, spec: SlurmJobSpec) -> SlurmJobSpec:
        """The spec with the account, QOS and time limit resolved here (unchanged when they
        are the spec's own)."""
        update: dict[str, Any] = {}
        if self.account != spec.account:
            update["account"] = self.account
        if self.qos != spec.qos:
            update["qos"] = self.qos
        if self.time_limit_minutes != spec.time_limit_minutes:
            update["time_limit"] = self.time_limit_minutes
        return spec.model_copy(update=update) if update else spec

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
    if runtime_id is None:  # spec.framework.image: the image cache's to check
        return None
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


def _one_of(
    field: str, value: str | None, allowed: list[str], key: str, tenant: Tenant, errors: list[str]
) -> str:
    """`value` when the tenant allows it, the tenant's default (its first) when it is unset."""
    if value is None:
        return allowed[0]
    if value not in allowed:
        errors.append(
            f"{field}: {value!r} is not in tenant {tenant.name}'s {key} ({', '.join(allowed)})"
        )
    return value


@dataclass(frozen=True)
class _Limited:
    partition: str | None
    account: str | None
    qos: str | None
    time_limit_minutes: int | None


def _tenant_limits(
    spec: SlurmJobSpec,
    settings: Settings,
    registry: RuntimeRegistry,
    scope: TenantScope,
    errors: list[str],
) -> _Limited:
    """The tenant's limits, each refusal naming its field; the tenant's defaults fill what the
    spec leaves out, so Slurm's own defaults (which may lie outside them) never apply."""
    tenant, limits = scope.tenant, scope.limits
    partition = spec.partition
    if partition is not None and "," in partition:
        errors.append(
            f"spec.partition: {partition!r} is a list; a tenant's job names one partition "
            f"(one of {', '.join(limits.partitions)})"
        )
    else:
        partition = _one_of(
            "spec.partition", partition, limits.partitions, "partitions", tenant, errors
        )
    account = _one_of("spec.account", spec.account, limits.accounts, "accounts", tenant, errors)
    qos = spec.qos
    if limits.qos is not None:
        qos = _one_of("spec.qos", qos, limits.qos, "qos list", tenant, errors)
    minutes = spec.time_limit_minutes
    longest = limits.max_time_minutes
    if longest is not None:
        if minutes is None:
            minutes = longest
        elif minutes > longest:
            errors.append(
                f"spec.timeLimit: {minutes} minutes is longer than tenant {tenant.name}'s "
                f"maxTimeLimit of {longest} minutes"
            )
    errors.extend(mount_problems(spec.mounts, settings.storage_root, registry, scope))
    return _Limited(partition, account, qos, minutes)


def resolve_site(
    spec: SlurmJobSpec,
    settings: Settings,
    registry: RuntimeRegistry,
    gpu_series: GpuSeriesCatalog,
    scope: TenantScope | None = None,
) -> SiteResolution:
    """Check the spec against the site's catalogs and, with a `scope` (the site has a tenants
    file), against the limits of the namespace's tenant; every problem is reported at once."""
    errors: list[str] = []
    runtime = _runtime(spec, settings, registry, errors)
    if scope is None:
        limited = _Limited(
            spec.partition or settings.slurm_partition,
            spec.account,
            spec.qos,
            spec.time_limit_minutes,
        )
    else:
        limited = _tenant_limits(spec, settings, registry, scope, errors)
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
    mpi = spec.launch.mpi if spec.launch is not None else None
    if mpi and mpi not in settings.allowed_mpi_plugins:
        allowed = ", ".join(settings.allowed_mpi_plugins) or "none (SLURMJOB_MPI_PLUGINS)"
        errors.append(f"spec.launch.mpi: MPI plugin {mpi!r} is not one the site allows: {allowed}")
    if errors or (runtime is None and spec.framework.image is None):
        raise SpecError(errors)
    return SiteResolution(
        runtime=runtime,
        series=series,
        partition=limited.partition,
        exclusive=exclusive,
        account=limited.account,
        qos=limited.qos,
        time_limit_minutes=limited.time_limit_minutes,
        tenant=scope.tenant if scope is not None else None,
    )
