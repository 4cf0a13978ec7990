"""The clusters file (`SLURMJOB_CLUSTERS_FILE`): several Slurm clusters behind one operator.

Each entry names a cluster and what differs for it: its slurmrestd and credentials, API
version, default partition, runtime profile, storage roots and catalogs. A key left out takes
the operator's own `SLURMJOB_*` setting, so the environment is the shorthand for one cluster
and the common part of several. What is the process's, not a cluster's (poll interval,
concurrency, metrics, leader election, tenants), cannot be set per cluster.

The file is trusted (the platform admin writes it); a mistake is refused at start with the
file, the entry and the key named, never discovered job by job.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from slurmjob_operator.config import CLUSTER_NAME_RE, ConfigError, RuntimeProfile, Settings
from slurmjob_operator.core.placement import Clusters

# The file's keys and the settings they stand for (the rest of Settings is the process's).
PER_CLUSTER: dict[str, str] = {
    "rest_url": "slurm_rest_url",
    "api_version": "slurm_rest_api_version",
    "user": "slurm_rest_user",
    "jwt_file": "slurm_jwt_file",
    "jwt_key_file": "slurm_jwt_key_file",
    "jwt_lifespan": "slurm_jwt_lifespan",
    "rest_timeout": "slurm_rest_timeout",
    "message_timeout": "slurm_message_timeout",
    "tls_verify": "slurm_tls_verify",
    "ca_bundle": "slurm_ca_bundle",
    "partition": "slurm_partition",
    "runtime_profile": "slurm_runtime_profile",
    "storage_root": "storage_root",
    "slurm_storage_root": "slurm_storage_root",
    "job_path": "slurm_job_path",
    "staging_owner": "staging_owner",
    "runtime_registry_file": "runtime_registry_file",
    "gpu_series_file": "gpu_series_file",
    "templates_dir": "templates_dir",
    "image_cache_root": "image_cache_root",
    "slurm_image_cache_root": "slurm_image_cache_root",
    "image_cache_user": "image_cache_user",
    "image_cache_uid": "image_cache_uid",
    "image_import_partition": "image_import_partition",
    "image_import_account": "image_import_account",
}
# One way to authenticate: a cluster that names one does not inherit the other.
_CREDENTIALS = ("jwt_file", "jwt_key_file")
# What belongs to one slurmrestd: a cluster with a slurmrestd of its own never inherits it
# (the operator's token or signing key must not be sent to another server unasked).
_SERVER_BOUND = (*_CREDENTIALS, "ca_bundle")


class ClusterEntry(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    name: str = Field(pattern=CLUSTER_NAME_RE, description="What spec.cluster says.")
    rest_url: str | None = None
    api_version: str | None = None
    user: str | None = None
    jwt_file: Path | None = None
    jwt_key_file: Path | None = None
    jwt_lifespan: int | None = None
    rest_timeout: float | None = None
    message_timeout: float | None = None
    tls_verify: bool | None = None
    ca_bundle: Path | None = None
    partition: str | None = None
    runtime_profile: RuntimeProfile | None = None
    storage_root: Path | None = None
    slurm_storage_root: Path | None = None
    job_path: str | None = None
    staging_owner: str | None = None
    runtime_registry_file: Path | None = None
    gpu_series_file: Path | None = None
    templates_dir: Path | None = None
    image_cache_root: Path | None = None
    slurm_image_cache_root: str | None = None
    image_cache_user: str | None = None
    image_cache_uid: int | None = None
    image_import_partition: str | None = None
    image_import_account: str | None = None


class ClustersFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    clusters: list[ClusterEntry] = Field(min_length=1)


@dataclass(frozen=True)
class ClusterSite:
    """One cluster: its name and the settings the operator's part for it runs with."""

    name: str
    settings: Settings


def _overrides(entry: ClusterEntry, base: Settings, where: str) -> dict[str, Any]:
    # Every key written, null included: `partition: null` unsets the shared default here.
    given = entry.model_dump(exclude={"name"}, exclude_unset=True)
    out: dict[str, Any] = {PER_CLUSTER[key]: value for key, value in given.items()}
    own_server = given.get("rest_url") not in (None, base.slurm_rest_url)
    if own_server and not any(given.get(key) for key in _CREDENTIALS):
        raise ConfigError(
            f"{where}: jwtFile or jwtKeyFile is required with a restUrl of its own (the "
            "operator's own token is never sent to another slurmrestd)"
        )
    if own_server or any(key in given for key in _CREDENTIALS):
        for key in _SERVER_BOUND if own_server else _CREDENTIALS:
            out.setdefault(PER_CLUSTER[key], None)
    return out


def cluster_settings(base: Settings, entry: ClusterEntry, where: str) -> Settings:
    """`base` with the entry's keys: validated like the environment is (ConfigError naming the
    entry and the key)."""
    values = {
        **base.model_dump(),
        **_overrides(entry, base, where),
        "cluster_name": entry.name,
        "clusters_file": None,
    }
    try:
        return Settings(**values)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        field = str(first["loc"][0]) if first["loc"] else ""
        key = next((k for k, v in PER_CLUSTER.items() if v == field), field)
        named = f".{to_camel(key)}" if key else ""
        raise ConfigError(f"{where}{named}: {message}") from exc


def _load(path: Path) -> ClustersFile:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"SLURMJOB_CLUSTERS_FILE {path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"SLURMJOB_CLUSTERS_FILE {path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"SLURMJOB_CLUSTERS_FILE {path}: must be a mapping with a clusters list")
    try:
        return ClustersFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"SLURMJOB_CLUSTERS_FILE {path}: {where.lstrip('.')}: {message}") from exc


def load_clusters(settings: Settings) -> list[ClusterSite]:
    """Every cluster, the default first: the clusters file's, else the one the settings
    describe (named `SLURMJOB_CLUSTER_NAME`)."""
    if settings.clusters_file is None:
        return [ClusterSite(settings.cluster_name, settings)]
    path = settings.clusters_file
    parsed = _load(path)
    names = [entry.name for entry in parsed.clusters]
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise ConfigError(
                f"SLURMJOB_CLUSTERS_FILE {path}: clusters[{index}].name: {name!r} is "
                "already a cluster's name"
            )
        seen.add(name)
    return [
        ClusterSite(
            entry.name,
            cluster_settings(settings, entry, f"SLURMJOB_CLUSTERS_FILE {path}: clusters[{i}]"),
        )
        for i, entry in enumerate(parsed.clusters)
    ]


def cluster_names(sites: list[ClusterSite], legacy: str | None = None) -> Clusters:
    """`legacy`: SLURMJOB_CLUSTER_NAME, the cluster an attempt that names none belongs to."""
    return Clusters(tuple(site.name for site in sites), legacy)
