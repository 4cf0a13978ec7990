"""Site catalogs: the runtime registry and the GPU series catalog (YAML files named by env)."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from slurmjob_operator.api.scriptwords import reserved_env_name
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


#: A probe rung's variable: a plain name, and not one the batch script or a host program
#: acts on (the same rule as spec.env's names).
_RUNG_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Rungs a ladder may have besides the plain first run (each costs up to `timeoutSeconds`).
MAX_RUNGS = 8


class CollectiveProbe(_Entry):
    """The site's collective probe for a runtime: a program inside the job's own image, run
    once per node as one step before the command (an all-reduce across the allocation)."""

    command: list[str] = Field(min_length=1, max_length=64)
    timeout_seconds: int = Field(default=120, ge=5, le=3600)
    ladder: list[dict[str, str]] = Field(default_factory=list, max_length=MAX_RUNGS)
    """Environment settings tried in order after the plain run hangs or fails, e.g.
    `{NCCL_P2P_DISABLE: "1"}`: rung 0 is the plain run, rung i is `ladder[i-1]`."""

    @field_validator("command")
    @classmethod
    def _words(cls, words: list[str]) -> list[str]:
        if any(not w or "\0" in w for w in words):
            raise ValueError("probe command words must be non-empty and hold no NUL")
        return words

    @field_validator("ladder")
    @classmethod
    def _rungs(cls, ladder: list[dict[str, str]]) -> list[dict[str, str]]:
        for rung in ladder:
            if not rung:
                raise ValueError("a rung sets at least one variable")
            for name, value in rung.items():
                if not _RUNG_NAME_RE.match(name) or reserved_env_name(name):
                    raise ValueError(f"{name!r}: not a variable a rung may set")
                if "\0" in value:
                    raise ValueError(f"{name}: values cannot contain NUL")
        return ladder

    @property
    def rungs(self) -> int:
        return 1 + len(self.ladder)

    def rung_env(self, rung: int) -> list[tuple[str, str]]:
        """The variables of rung `rung` (none for rung 0)."""
        return sorted(self.ladder[rung - 1].items()) if rung > 0 else []


class RuntimeArtifact(_Entry):
    id: str = Field(min_length=1)
    format: ArtifactFormat
    path: str = Field(min_length=1, description="Relative to the storage root.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    probe: CollectiveProbe | None = None

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
    min_bus_bandwidth: float | None = Field(default=None, gt=0)
    """GB/s: a collective probe that reports a lower bus bandwidth did not pass."""


class RuntimeRegistry(_Entry):
    runtimes: list[RuntimeArtifact] = Field(default_factory=list)

    def get(self, runtime_id: str) -> RuntimeArtifact | None:
        return next((r for r in self.runtimes if r.id == runtime_id), None)


class GpuSeriesCatalog(_Entry):
    series: list[GpuSeries] = Field(default_factory=list)

    def get(self, name: str) -> GpuSeries | None:
        return next((s for s in self.series if s.name == name), None)


def parse_catalog(path: Path, raw: bytes, model: type[_M]) -> _M:
    """The bytes of the catalog file at `path` validated as `model` (CatalogError naming the
    file and the entry). The one validation of a catalog, at start and on every re-read
    (`site.catalogwatch`)."""
    try:
        data = yaml.safe_load(raw.decode("utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{path}: not UTF-8 text: {exc.reason}") from exc
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"{path}: {where}: {first['msg']}") from exc


def read_catalog(path: Path) -> bytes:
    """The file's bytes (CatalogError when it cannot be read)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror}") from exc


def _load(path: Path | None, model: type[_M]) -> _M:
    if path is None:
        return model.model_validate({})
    return parse_catalog(path, read_catalog(path), model)


def load_runtime_registry(path: Path | None) -> RuntimeRegistry:
    return _load(path, RuntimeRegistry)


def load_gpu_series(path: Path | None) -> GpuSeriesCatalog:
    return _load(path, GpuSeriesCatalog)
