"""Operator settings, read once from `SLURMJOB_*` environment variables.

Every field carries its env name and meaning in `json_schema_extra`/description so that
`docs/configuration.md` and `doctor` can list them; a test keeps the docs in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "SLURMJOB_"
AUTO = "auto"


class RuntimeProfile(StrEnum):
    ENROOT_PYXIS = "enroot-pyxis"
    APPTAINER = "apptainer"


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slurm_rest_url: str = Field(
        default="http://127.0.0.1:6820", description="Base URL of slurmrestd."
    )
    slurm_rest_api_version: str = Field(
        default=AUTO,
        description="REST API version such as v0.0.45, or auto: the newest the server serves.",
    )
    slurm_rest_user: str | None = Field(
        default=None, description="Slurm user the operator acts as (X-SLURM-USER-NAME)."
    )
    slurm_jwt_file: Path | None = Field(
        default=None, description="File holding a JWT; re-read when it changes (rotation)."
    )
    slurm_jwt_key_file: Path | None = Field(
        default=None, description="HS256 key file: mint short-lived tokens instead of a file."
    )
    slurm_jwt_lifespan: int = Field(
        default=1800, ge=60, description="Lifespan in seconds of minted tokens."
    )
    slurm_rest_timeout: float = Field(
        default=30.0, gt=0, description="Seconds before a slurmrestd request times out."
    )
    slurm_partition: str | None = Field(
        default=None, description="Partition used when spec.partition is empty."
    )
    slurm_runtime_profile: RuntimeProfile = Field(
        default=RuntimeProfile.ENROOT_PYXIS, description="enroot-pyxis or apptainer."
    )
    storage_root: Path = Field(
        default=Path("/var/lib/slurmjob"),
        description="The shared storage root as the operator sees it.",
    )
    slurm_storage_root: Path | None = Field(
        default=None, description="The same root as the cluster mounts it, when the path differs."
    )
    slurm_tls_verify: bool = Field(default=True, description="Verify slurmrestd's TLS certificate.")
    slurm_ca_bundle: Path | None = Field(
        default=None, description="CA bundle for slurmrestd's TLS certificate."
    )
    slurm_job_path: str = Field(
        default="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        description="PATH given to the batch script on the compute node.",
    )
    staging_owner: str | None = Field(
        default=None,
        pattern=r"^\d+:\d+$",
        description=(
            "uid:gid that staging directories and files are handed to, when the operator runs "
            "as another user than the Slurm job user (needs CAP_CHOWN)."
        ),
    )
    runtime_registry_file: Path | None = Field(
        default=None, description="YAML runtime registry: runtimes: [{id, format, path, sha256}]."
    )
    gpu_series_file: Path | None = Field(
        default=None,
        description="YAML GPU series catalog: series: [{name, slurmConstraint, gpusPerNode}].",
    )
    templates_dir: Path | None = Field(
        default=None, description="Directory with site copies of the batch-script templates."
    )
    poll_interval: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two polls of slurmrestd for every tracked job.",
    )
    delete_timeout: float = Field(
        default=120.0,
        gt=0,
        description="Seconds a deletion waits for a cancelled job to end before trying again.",
    )
    metrics_port: int = Field(
        default=9090, ge=0, le=65535, description="Port of /metrics (Prometheus); 0 disables it."
    )

    @field_validator("slurm_rest_api_version")
    @classmethod
    def _version(cls, value: str) -> str:
        from slurmjob_operator.versions import SUPPORTED_VERSIONS

        if value != AUTO and value not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"{value!r} is not supported; use auto or one of {', '.join(SUPPORTED_VERSIONS)}"
            )
        return value

    @property
    def cluster_storage_root(self) -> Path:
        return self.slurm_storage_root or self.storage_root

    def to_cluster_path(self, path: Path) -> Path:
        """Translate a path under the operator's storage root to the cluster's view of it."""
        return self.cluster_storage_root / path.relative_to(self.storage_root)

    @classmethod
    def env_name(cls, field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        for field in cls.model_fields:
            raw = env.get(cls.env_name(field))
            if raw is not None and raw != "":
                values[field] = raw
        if "slurm_tls_verify" in values:
            values["slurm_tls_verify"] = str(
                values["slurm_tls_verify"].strip().lower() not in {"0", "false", "no", "off"}
            )
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = cls.env_name(str(first["loc"][0])) if first["loc"] else ENV_PREFIX
            raise ConfigError(f"{name}: {first['msg']}") from exc
