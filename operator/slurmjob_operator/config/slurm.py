"""The Slurm side of `Settings`: slurmrestd and its credentials, the timeouts of the fencing
window, what a submit asks of the cluster, and the storage root as both sides see it.

These are (with the site's catalogs) what an entry of the clusters file may set per cluster:
site/clusters.py `PER_CLUSTER` names them.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from slurmjob_operator.versions import SUPPORTED_VERSIONS

AUTO = "auto"


# No docstring: it would become the enum's description in Settings.model_json_schema().
class RuntimeProfile(StrEnum):
    ENROOT_PYXIS = "enroot-pyxis"
    APPTAINER = "apptainer"


class SlurmSettings(BaseSettings):
    """A part of `Settings`, never read alone: the Slurm cluster the operator submits to."""

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
    slurm_message_timeout: float = Field(
        default=10.0,
        gt=0,
        description=(
            "slurmctld's MessageTimeout in seconds (slurm.conf; Slurm's default is 10): part of "
            "the fencing window after which an unconfirmed submit may be proven absent."
        ),
    )
    absence_margin: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds added to SLURMJOB_SLURM_REST_TIMEOUT + SLURMJOB_SLURM_MESSAGE_TIMEOUT: "
            "the fencing window after which an unconfirmed submit found neither in the "
            "controller nor in accounting is proven absent and the next attempt submitted."
        ),
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

    @field_validator("slurm_rest_api_version")
    @classmethod
    def _version(cls, value: str) -> str:
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
