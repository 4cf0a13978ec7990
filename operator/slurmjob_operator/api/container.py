"""What the job's container is made of: its framework and runtime artifact, its environment
(literal or from a Secret) and its storage-root mounts, with the platform volumes refused in
their place.

Part of the SlurmJob spec (`api.spec`); the path alphabet and the reserved env names come
from `api.scriptwords`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from slurmjob_operator.api.model import Model as _Model
from slurmjob_operator.api.scriptwords import (
    ABSOLUTE_PATH_RE,
    PATH_TEXT,
    RELATIVE_PATH_RE,
    path_problem,
    reserved_env_name,
)

ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"

CUSTOM = "custom"
CUSTOM_RUNTIME_PREFIX = "custom-"


# The shape of an OCI reference with an explicit registry and an explicit tag or digest, as
# the CRD and pydantic check it (both linear-time engines). The image cache parses it fully
# (imagecache/reference.py: the component grammar, the tenant's registries).
IMAGE_REF_RE = (
    r"^[a-z0-9][-a-z0-9.]*(:[0-9]{1,5})?/[a-z0-9._/-]+"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$"
)
IMAGE_REF_MAX = 512


class Framework(_Model):
    """What runs: a framework kind/name and either a runtime artifact of the site's registry
    or an OCI image the site's image cache makes ready (docs/images.md)."""

    kind: str = Field(min_length=1, max_length=63, description="Framework kind, e.g. custom.")
    name: str = Field(min_length=1, max_length=63, description="Framework name, e.g. custom.")
    runtime_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description=(
            "Id of a runtime artifact (SQSH or SIF) in the site's runtime registry. Exactly "
            "one of runtimeId and image."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=IMAGE_REF_MAX,
        pattern=IMAGE_REF_RE,
        description=(
            "OCI image, registry/repository:tag or registry/repository@sha256:digest, from a "
            "registry the tenant lists, where the site enables images: imported once per "
            "digest by an import job off the GPU allocation, never pulled by the job itself. "
            "Exactly one of runtimeId and image."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> Framework:
        if (self.runtime_id is None) == (self.image is None):
            raise ValueError("framework: set exactly one of runtimeId and image")
        return self

    @model_validator(mode="after")
    def _custom_runtime_prefix(self) -> Framework:
        if (
            self.kind == CUSTOM
            and self.runtime_id is not None
            and not self.runtime_id.startswith(CUSTOM_RUNTIME_PREFIX)
        ):
            raise ValueError(
                f"runtimeId {self.runtime_id!r}: custom runtimes must have ids starting with "
                f"{CUSTOM_RUNTIME_PREFIX!r}"
            )
        return self

    @property
    def is_custom(self) -> bool:
        return self.kind == CUSTOM and self.name == CUSTOM


class SecretKeyRef(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the job's namespace.")
    key: str = Field(min_length=1, max_length=253, description="Key within the Secret.")


class EnvVarSource(_Model):
    secret_key_ref: SecretKeyRef


class EnvVar(_Model):
    name: str = Field(pattern=ENV_NAME_RE, max_length=255, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Value read from a Secret; never written into the script."
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if reserved_env_name(value):
            raise ValueError(
                f"{value}: reserved: read outside the container (by the batch shell, the dynamic "
                "loader, Slurm, Pyxis, enroot or apptainer) or set by the batch script"
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: set exactly one of value and valueFrom")
        return self

    @property
    def is_secret(self) -> bool:
        return self.value_from is not None


class Mount(_Model):
    source: str = Field(
        min_length=1,
        max_length=4096,
        pattern=RELATIVE_PATH_RE,
        description=f"Path relative to the storage root (no '..', not absolute; {PATH_TEXT}).",
    )
    target: str = Field(
        min_length=2,
        max_length=4096,
        pattern=ABSOLUTE_PATH_RE,
        description=f"Absolute path inside the container ({PATH_TEXT}).",
    )
    read_only: bool = Field(default=False, description="Mount read-only.")

    # mode="before": these messages say more than the pattern's, which backs them up.
    @field_validator("source", mode="before")
    @classmethod
    def _relative_inside(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if value.startswith("/"):
            raise ValueError(
                f"{value!r}: mount sources are paths relative to the storage root, "
                "not absolute host paths"
            )
        parts = value.split("/")
        if ".." in parts:
            raise ValueError(f"{value!r}: '..' would leave the storage root")
        if all(part in ("", ".") for part in parts):
            raise ValueError(
                f"{value!r}: a mount source names a folder under the storage root, not the root "
                "itself (it holds every job's staging files)"
            )
        problem = path_problem(value, absolute=False)
        if problem:
            raise ValueError(f"{value!r}: mount sources {problem}")
        return value

    @field_validator("target", mode="before")
    @classmethod
    def _absolute_target(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if not value.startswith("/"):
            raise ValueError(f"{value!r}: mount targets must be absolute paths")
        if ".." in value.split("/"):
            raise ValueError(f"{value!r}: mount targets cannot contain '..'")
        problem = path_problem(value, absolute=True)
        if problem:
            raise ValueError(f"{value!r}: mount targets {problem}")
        return value


class DataSpec(_Model):
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Refused when non-empty: this backend cannot mount platform volumes.",
    )

    @field_validator("volumes")
    @classmethod
    def _no_volumes(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if value:
            raise ValueError(
                "volume mounts are not supported on Slurm: the bind list of a SIF/SQSH image "
                "is not under the platform's control; use spec.mounts under the storage root"
            )
        return value
