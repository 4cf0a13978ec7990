"""The image cache's part of `Settings` (docs/images.md): whether a SlurmJob may name an OCI
image, where the cache is, and what its import jobs ask of Slurm.

Off by default: `spec.framework.image` is then refused with a reason naming
SLURMJOB_IMAGES_ENABLED. On, an image is made ready by an import job that runs as the cache
user on a CPU partition, never inside the job's own (GPU) allocation. The cache paths, the
cache user, the partition and the account may differ per cluster (site/clusters.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

# A registry as the site and the tenants file list it: host[:port], optionally followed by a
# path prefix on component boundaries (`nvcr.io/nvidia`). The reference grammar proper is the
# image cache's (imagecache/reference.py); this only bounds what a setting may hold.
REGISTRY_ENTRY_RE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9._/-]+)?$"
_REGISTRY = r"[a-z0-9][-a-z0-9.]*(:[0-9]{1,5})?(/[a-z0-9._/-]+)?"
_REGISTRY_LIST_RE = rf"^({_REGISTRY}(,{_REGISTRY})*)?$"
_ABSOLUTE_WORD = r"^/[A-Za-z0-9._/-]*$"
_SLURM_NAME = r"^[A-Za-z0-9._-]+$"


class ImageSettings(BaseSettings):
    """A part of `Settings`, never read alone: OCI images made ready by import jobs."""

    images_enabled: bool = Field(
        default=False,
        description=(
            "Let SlurmJobs name spec.framework.image, an OCI reference from a registry their "
            "tenant lists, made ready once per digest by an import job on a CPU partition "
            "(docs/images.md). Off: spec.framework.image is refused."
        ),
    )
    image_registries: str | None = Field(
        default=None,
        pattern=_REGISTRY_LIST_RE,
        max_length=4096,
        description=(
            "Comma-separated registries (host[:port], optionally /path prefix) images may come "
            "from when there is no tenants file; with one, each tenant's imageRegistries."
        ),
    )
    image_cache_root: Path | None = Field(
        default=None,
        description=(
            "The image cache on the shared filesystem as the operator sees it (it only reads "
            "it); only the cache user may write it."
        ),
    )
    slurm_image_cache_root: str | None = Field(
        default=None,
        pattern=_ABSOLUTE_WORD,
        description="The image cache as the compute nodes see it; unset: image_cache_root.",
    )
    image_cache_user: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$",
        description=(
            "Slurm user the import, eviction and check jobs run as: the only user that may "
            "write the cache. Needs minted tokens (SLURMJOB_SLURM_JWT_KEY_FILE)."
        ),
    )
    image_cache_uid: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Unix uid of the cache user: the owner a published entry must have, and whom an "
            "import's staged credentials are readable by (ACLs)."
        ),
    )
    image_import_partition: str | None = Field(
        default=None,
        pattern=_SLURM_NAME,
        description="The CPU partition import jobs run in (never a GPU allocation).",
    )
    image_import_account: str | None = Field(
        default=None, pattern=_SLURM_NAME, description="Slurm account import jobs are charged to."
    )
    image_import_cpus: int = Field(default=4, ge=1, le=256, description="CPUs of an import job.")
    image_import_memory_mb: int = Field(
        default=7200, ge=256, description="Memory of an import job in MB."
    )
    image_import_time_minutes: int = Field(
        default=120, ge=5, le=7 * 24 * 60, description="Time limit of an import job in minutes."
    )
    image_import_tmp: str = Field(
        default="/tmp",
        pattern=_ABSOLUTE_WORD,
        description="Node-local directory an import job unpacks layers under.",
    )
    image_import_ca_file: str | None = Field(
        default=None,
        pattern=_ABSOLUTE_WORD,
        description=(
            "CA bundle (as the nodes see it) an import trusts registries with: SSL_CERT_FILE "
            "for Enroot and Apptainer, curl's --cacert. Unset: the nodes' own trust store."
        ),
    )
    image_tag_reuse_seconds: int = Field(
        default=600,
        ge=0,
        le=7 * 86400,
        description=(
            "How long the digest an import found for a tag is reused for a new SlurmJob naming "
            "that tag; a SlurmJob keeps the digest it started with whatever the tag becomes."
        ),
    )
    image_import_retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description=(
            "New import jobs after a transient failure (a registry 5xx, a node failure); a "
            "permanent one (unknown manifest, access denied, bad image) fails at once."
        ),
    )
    image_cache_max_bytes: int = Field(
        default=500 * 1024**3,
        ge=1024**2,
        description=(
            "The cache's size cap in bytes, shared by its owners (tenants for private images, "
            "the shared owner for anonymous pulls): past it the least recently used entries "
            "of the owner furthest over its share are evicted."
        ),
    )
    image_cache_floor_bytes: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The least share of the cache an owner has (entries its waiting and running "
            "SlurmJobs use are kept within it). Unset: image_cache_max_bytes / 16."
        ),
    )
    image_cache_sweep_seconds: float = Field(
        default=300.0,
        ge=1.0,
        le=86400.0,
        description=(
            "How often the leader sweeps the image cache: releases the entries of final or "
            "deleted SlurmJobs, evicts what is over the cap (a job of the cache user deletes "
            "the files) and updates the cache's metrics."
        ),
    )
    image_cache_check_seconds: float = Field(
        default=21600.0,
        ge=60.0,
        le=7 * 86400.0,
        description=(
            "How often a housekeeping job of the cache user checks the cache when nothing is "
            "evicted: every recorded entry still there, bytes and files, dead imports' "
            "directories removed."
        ),
    )
    image_imports_per_tenant: int = Field(
        default=2, ge=1, le=64, description="Import jobs one tenant may have at once."
    )
    image_imports_max: int = Field(
        default=8, ge=1, le=256, description="Import jobs the operator has at once, all tenants."
    )
    artifact_verify_jobs: bool = Field(
        default=False,
        description=(
            "Verify each runtime-registry artifact (runtimeId) once, by a job of the cache user "
            "on the import partition that hashes it in full and checks that only root and its "
            "owner can change it, then check jobs on their nodes by a recorded stat line "
            "instead of hashing the artifact again (docs/images.md). Off: every job's node "
            "hashes it in full. Needs the cache settings and minted tokens."
        ),
    )

    @property
    def allowed_image_registries(self) -> tuple[str, ...]:
        return tuple(r for r in (self.image_registries or "").split(",") if r)

    @property
    def image_cache_floor(self) -> int:
        if self.image_cache_floor_bytes is None:
            return self.image_cache_max_bytes // 16
        return min(self.image_cache_floor_bytes, self.image_cache_max_bytes)
