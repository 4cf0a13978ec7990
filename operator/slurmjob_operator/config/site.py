"""The site's part of `Settings`: who owns what is staged, and the files the platform admin
writes (runtime registry, GPU series, clusters, tenants, batch-script templates)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

# A cluster's name (the clusters file, spec.cluster); api.spec checks spec.cluster against it.
CLUSTER_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"

# The probe ConfigMap's bound (`core.shares`), in bytes of keys and values as the apiserver
# counts them against its 1 MiB: at most 960 KiB leaves room for the object's metadata and
# the quoting of its JSON. 900 KiB holds about 140 full avoid lists (64 nodes of 64-character
# names: about 6.5 KiB each), or some 7,000 cached rungs.
PROBE_CAPACITY_BYTES = 900 * 1024
PROBE_CAPACITY_MAX = 960 * 1024
PROBE_FLOOR_BYTES = 16 * 1024


def parse_owner(value: str | None) -> tuple[int, int] | None:
    """`uid:gid` (Settings.staging_owner, already checked against its pattern) as two ints."""
    if value is None:
        return None
    uid, _, gid = value.partition(":")
    return int(uid), int(gid)


class SiteSettings(BaseSettings):
    """A part of `Settings`, never read alone: staging ownership and the site's files."""

    staging_owner: str | None = Field(
        default=None,
        pattern=r"^\d+:\d+$",
        description=(
            "uid:gid that staging directories and files are handed to, when the operator runs "
            "as another user than the Slurm job user (needs CAP_CHOWN)."
        ),
    )
    runtime_registry_file: Path | None = Field(
        default=None,
        description=(
            "YAML runtime registry: runtimes: [{id, format, path, sha256}]. Re-read when it "
            "changes; an edit that does not validate is refused and the last good copy kept."
        ),
    )
    gpu_series_file: Path | None = Field(
        default=None,
        description=(
            "YAML GPU series catalog: series: [{name, slurmConstraint, gpusPerNode}]. Re-read "
            "when it changes, as the runtime registry."
        ),
    )
    clusters_file: Path | None = Field(
        default=None,
        description=(
            "YAML clusters file: clusters: [{name, restUrl, apiVersion, user, jwtFile, "
            "jwtKeyFile, partition, runtimeProfile, storageRoot, ...}], several Slurm clusters "
            "behind one operator (spec.cluster picks one; the first is the default). A key "
            "left out takes the SLURMJOB_* setting. Unset: one cluster, from these settings."
        ),
    )
    cluster_name: str = Field(
        default="default",
        pattern=CLUSTER_NAME_RE,
        description=(
            "Name of the one cluster when there is no clusters file (what spec.cluster may say)."
        ),
    )
    tenants_file: Path | None = Field(
        default=None,
        description=(
            "YAML tenants file: tenants: [{name, namespaces, accounts, partitions, qos, "
            "mountSources, maxTimeLimit, maxTotalTime, slurmUser, uid, defaultCluster, "
            "clusters}]. Unset: "
            "single-tenant; set: a SlurmJob in a namespace of no tenant is refused, and each "
            "tenant's limits are enforced before submit."
        ),
    )
    mpi_plugins: str | None = Field(
        default=None,
        pattern=r"^([a-z][a-z0-9_]{0,31}(,[a-z][a-z0-9_]{0,31})*)?$",
        description=(
            "Comma-separated srun --mpi plugins a SlurmJob's launch.mpi may name (launch shape "
            "tasks), e.g. pmi2,pmix; empty: none."
        ),
    )
    templates_dir: Path | None = Field(
        default=None, description="Directory with site copies of the batch-script templates."
    )
    archive_root: Path | None = Field(
        default=None,
        description=(
            "Directory, on a volume only the operator mounts, where a deleted SlurmJob's logs, "
            "scripts and final status are kept (docs/states.md). Unset: they go with it."
        ),
    )
    archive_retention_days: int = Field(
        default=30, ge=1, le=3650, description="Days an archived SlurmJob is kept."
    )
    archive_max_bytes: int = Field(
        default=10 * 1024**3,
        ge=1024**2,
        description=(
            "The archive's size cap in bytes, shared by its owners (tenants, else namespaces): "
            "beyond it the owner furthest over its share loses its oldest entries first."
        ),
    )
    archive_entry_max_bytes: int | None = Field(
        default=None,
        ge=64 * 1024,
        description=(
            "Bytes one archived SlurmJob may keep, shared by its files (each keeps its end); "
            "also every owner's floor in the archive. Unset: archive_max_bytes / 16."
        ),
    )
    archive_file_max_bytes: int = Field(
        default=16 * 1024**2,
        ge=64 * 1024,
        le=1024**3,
        description="Bytes kept of each archived file (its end, whole lines).",
    )

    max_total_time: int | str = Field(
        default="30d",
        description=(
            "The longest spec.walltime.totalTime a SlurmJob may ask for (minutes or a "
            "duration); a tenant's maxTotalTime may lower it for its namespaces."
        ),
    )
    probe_attempts: int = Field(
        default=2,
        ge=0,
        le=10,
        description=(
            "New attempts a SlurmJob gets after collective probes that failed on every rung "
            "and blamed nodes (each excludes them); 0: a failed probe ends the job."
        ),
    )
    probe_cache_seconds: int = Field(
        default=86400,
        ge=0,
        description="How long a probe's passing rung lets later jobs of the same key skip it.",
    )
    probe_avoid_seconds: int = Field(
        default=86400,
        ge=60,
        description="How long a node a tenant's probe blamed stays excluded from its jobs.",
    )
    probe_configmap: str = Field(
        default="slurmjob-probe-cache",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description=(
            "The ConfigMap, in the operator's namespace (the Lease's), holding the probe "
            "cache and the avoid lists."
        ),
    )
    probe_capacity_bytes: int = Field(
        default=PROBE_CAPACITY_BYTES,
        ge=64 * 1024,
        le=PROBE_CAPACITY_MAX,
        description=(
            "Bytes (keys and values) the probe ConfigMap may hold; past it the owner (tenant, "
            "else namespace) furthest over its share loses its oldest entries first."
        ),
    )
    probe_floor_bytes: int = Field(
        default=PROBE_FLOOR_BYTES,
        ge=0,
        le=PROBE_CAPACITY_MAX,
        description=(
            "The least share of the probe ConfigMap an owner has: max(floor, capacity / "
            "owners), the floor shrunk to capacity / owners when the floors add up to more."
        ),
    )

    @property
    def archive_entry_cap(self) -> int:
        """The per-entry cap: the setting (at most the archive's cap), else 1/16 of the cap.
        A sixteenth: an entry at the cap is a small part of the whole (16 of them fit), and
        it bounds the time one deletion's archiving takes (docs/benchmarks.md)."""
        if self.archive_entry_max_bytes is None:
            return self.archive_max_bytes // 16  # at least 64 KiB: the cap is 1 MiB or more
        return min(self.archive_entry_max_bytes, self.archive_max_bytes)

    @property
    def allowed_mpi_plugins(self) -> tuple[str, ...]:
        return tuple(p for p in (self.mpi_plugins or "").split(",") if p)
