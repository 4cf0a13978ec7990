"""Site catalogs: the runtime registry and the GPU series catalog (YAML files named by env)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from slurmjob_operator.config import RuntimeProfile

_M = TypeVar("_M", bound=BaseModel)


class CatalogError(ValueError):
    """A catalog file is missing or malformed; the message names the file and the entry."""


class ArtifactFormat(StrEnum):
    SQSH = "sqsh"
    SIF = "sif"


PROFILE_FORMAT: dict[RuntimeProfile, ArtifactFormat] = {
    RuntimeProfile.ENROOT_PYXIS: ArtifactFormat.SQSH,
    RuntimeProfile.APPTAINER: ArtifactFormat.SIF,
}


class _Entry(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class RuntimeArtifact(_Entry):
    id: str = Field(min_length=1)
    format: ArtifactFormat
    path: str = Field(min_length=1, description="Relative to the storage root.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError(f"{value!r}: artifact paths are relative to the storage root")
        return value


class GpuSeries(_Entry):
    name: str = Field(min_length=1)
    slurm_constraint: str | None = None
    gpus_per_node: int = Field(ge=1)


class RuntimeRegistry(_Entry):
    runtimes: list[RuntimeArtifact] = Field(default_factory=list)

    def get(self, runtime_id: str) -> RuntimeArtifact | None:
        return next((r for r in self.runtimes if r.id == runtime_id), None)


class GpuSeriesCatalog(_Entry):
    series: list[GpuSeries] = Field(default_factory=list)

    def get(self, name: str) -> GpuSeries | None:
        return next((s for s in self.series if s.name == name), None)


def _load(path: Path | None, model: type[_M]) -> _M:
    if path is None:
        return model.model_validate({})
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"{path}: {where}: {first['msg']}") from exc


def load_runtime_registry(path: Path | None) -> RuntimeRegistry:
    return _load(path, RuntimeRegistry)


def load_gpu_series(path: Path | None) -> GpuSeriesCatalog:
    return _load(path, GpuSeriesCatalog)
