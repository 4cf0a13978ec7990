"""The tenants file (`SLURMJOB_TENANTS_FILE`): which namespaces form a tenant, and what the jobs
of a tenant may ask of Slurm and of the shared storage.

The file is trusted (the platform admin writes it), but a mistake in it would open one
tenant's data to another, so the loader refuses anything doubtful with a message naming the
file and the entry: unknown keys, a namespace of two tenants, an empty list, a bad duration, a
mount source inside a namespace's staging tree or the runtimes folder. Unset: no tenants at
all, and every namespace's jobs are taken as before (single-tenant).

The limits (`TenantLimits`) are a model of their own so that per-cluster limits can later
reuse it (`clusters: {name: limits}`); today a tenant has one set, its own (`Tenant.limits`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.spec import DNS_LABEL_RE, parse_time_limit
from slurmjob_operator.site.catalogs import CatalogError, RuntimeRegistry

#: A path under the storage root as its components (`datasets/team-a` -> ("datasets", "team-a")).
Parts = tuple[str, ...]

# Slurm account, partition and QOS names: one name each (a ',' would make a list in Slurm).
SlurmName = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._-]+$")]
Namespace = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_RE)]
_UNIX_USER_RE = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
_ROOT_USERS = frozenset({"root"})


def path_parts(path: str) -> Parts:
    """The components of a relative path, without empty and `.` components."""
    return tuple(part for part in path.split("/") if part not in ("", "."))


def under(path: Parts, prefix: Parts) -> bool:
    """Whether `path` is `prefix` or below it, on whole components (`a/bc` is not under `a/b`)."""
    return path[: len(prefix)] == prefix


def overlap(a: Parts, b: Parts) -> bool:
    """Whether one of the two paths is the other or below it."""
    return under(a, b) or under(b, a)


def shown(parts: Parts) -> str:
    return "/".join(parts)


class _Entry(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class TenantLimits(_Entry):
    """What a tenant's jobs may ask for. A list that is left out sets no limit (qos) or allows
    nothing (mountSources); a list that is given must name something."""

    accounts: list[SlurmName] = Field(
        min_length=1, description="spec.account must be one of these; the first is the default."
    )
    partitions: list[SlurmName] = Field(
        min_length=1,
        description="spec.partition must be one of these; the first is the default.",
    )
    qos: list[SlurmName] | None = Field(
        default=None,
        min_length=1,
        description="spec.qos must be one of these; the first is the default. Unset: any QOS.",
    )
    mount_sources: list[str] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Folders under the storage root that spec.mounts may use (prefixes on whole path "
            "components). Unset: no mounts."
        ),
    )
    max_time_limit: int | str | None = Field(
        default=None,
        description="The longest spec.timeLimit (minutes or a duration); also its default.",
    )

    @field_validator("mount_sources")
    @classmethod
    def _sources(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        out: list[str] = []
        for source in value:
            if source.startswith("/"):
                raise ValueError(f"{source!r}: mount sources are relative to the storage root")
            if ".." in source.split("/"):
                raise ValueError(f"{source!r}: '..' would leave the storage root")
            if any(c in source for c in ("\0", "\n", ",", ":")):
                raise ValueError(f"{source!r}: cannot contain NUL, newline, ',' or ':'")
            parts = path_parts(source)
            if not parts:
                raise ValueError(
                    f"{source!r}: the storage root itself holds every job's staging files"
                )
            out.append(shown(parts))
        return out

    @field_validator("max_time_limit")
    @classmethod
    def _duration(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            try:
                parse_time_limit(value)
            except ValueError as exc:
                raise ValueError(str(exc).replace("timeLimit", "maxTimeLimit")) from None
        return value

    @property
    def max_time_minutes(self) -> int | None:
        return None if self.max_time_limit is None else parse_time_limit(self.max_time_limit)

    @property
    def source_parts(self) -> list[Parts]:
        return [path_parts(s) for s in self.mount_sources or []]


class Tenant(TenantLimits):
    """A set of namespaces whose jobs share one set of limits (and, optionally, a Slurm user)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_RE)
    namespaces: list[Namespace] = Field(min_length=1)
    slurm_user: str | None = Field(
        default=None,
        pattern=_UNIX_USER_RE,
        description="Slurm user the tenant's jobs run as (needs the JWT key mode).",
    )
    uid: int | None = Field(
        default=None, ge=1, description="Unix uid of slurmUser (for file ACLs)."
    )

    @model_validator(mode="after")
    def _user(self) -> Tenant:
        if self.slurm_user in _ROOT_USERS:
            raise ValueError("slurmUser: a tenant's jobs never run as root")
        if self.uid is not None and self.slurm_user is None:
            raise ValueError("uid: is the uid of slurmUser, which is not set")
        return self

    def limits(self) -> TenantLimits:
        """The limits of the tenant's jobs (one set today; per cluster later)."""
        return self


class Tenants(_Entry):
    """The whole file; every namespace belongs to at most one tenant."""

    tenants: list[Tenant] = Field(min_length=1)

    @model_validator(mode="after")
    def _apart(self) -> Tenants:
        names: dict[str, int] = {}
        owner: dict[str, str] = {}
        for index, tenant in enumerate(self.tenants):
            at = f"tenants[{index}] ({tenant.name})"
            if tenant.name in names:
                raise ValueError(f"{at}: name is already tenants[{names[tenant.name]}]'s")
            names[tenant.name] = index
            for namespace in tenant.namespaces:
                if namespace in owner:
                    raise ValueError(
                        f"{at}: namespace {namespace} already belongs to tenant {owner[namespace]}"
                    )
                owner[namespace] = tenant.name
        for index, tenant in enumerate(self.tenants):
            for source in tenant.source_parts:
                if source[0] in owner:
                    raise ValueError(
                        f"tenants[{index}] ({tenant.name}): mountSources: {shown(source)!r} is "
                        f"in the staging tree of namespace {source[0]} (<storage root>/"
                        "<namespace> holds the job files of that namespace)"
                    )
        return self

    def get(self, namespace: str) -> Tenant | None:
        return next((t for t in self.tenants if namespace in t.namespaces), None)

    @property
    def namespaces(self) -> frozenset[str]:
        return frozenset(ns for t in self.tenants for ns in t.namespaces)

    def scope(self, namespace: str) -> TenantScope:
        """The tenant of a namespace and what its jobs must stay clear of; `TenantUnknown`
        when the namespace belongs to no tenant."""
        tenant = self.get(namespace)
        if tenant is None:
            raise TenantUnknown(namespace)
        others = [
            source
            for other in self.tenants
            if other.name != tenant.name
            for source in other.source_parts
        ]
        return TenantScope(
            tenant=tenant,
            namespace=namespace,
            staging_namespaces=self.namespaces | {namespace},
            other_sources=tuple(others),
        )


@dataclass(frozen=True)
class TenantScope:
    """What resolution needs to know of the tenants for one SlurmJob's namespace."""

    tenant: Tenant
    namespace: str
    staging_namespaces: frozenset[str]
    """Every namespace whose staging tree (`<root>/<namespace>`) no mount may reach."""
    other_sources: tuple[Parts, ...]
    """The mount sources of every other tenant (shared ones included)."""

    @property
    def limits(self) -> TenantLimits:
        return self.tenant.limits()


class TenantUnknown(SpecError):
    """Tenancy is on and the SlurmJob's namespace belongs to no tenant: nothing is submitted."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        super().__init__(
            [
                f"metadata.namespace: namespace {namespace!r} belongs to no tenant of this "
                "site's tenants file, so its SlurmJobs are not submitted; ask the platform "
                "admin to add it to a tenant"
            ]
        )


def runtime_dirs(registry: RuntimeRegistry) -> list[Parts]:
    """The folders that hold runtime artifacts (an artifact at the top of the storage root
    stands for itself: its folder is the root)."""
    out: list[Parts] = []
    for runtime in registry.runtimes:
        parts = path_parts(runtime.path)
        folder = parts[:-1] or parts
        if folder not in out:
            out.append(folder)
    return out


def check_against_registry(tenants: Tenants, registry: RuntimeRegistry, path: Path) -> None:
    """Refuse a tenant mount source that overlaps the runtimes folder: a tenant could read or
    replace the artifacts every job runs in."""
    folders = runtime_dirs(registry)
    for index, tenant in enumerate(tenants.tenants):
        for source in tenant.source_parts:
            hit = next((f for f in folders if overlap(source, f)), None)
            if hit is not None:
                raise CatalogError(
                    f"{path}: tenants[{index}] ({tenant.name}).mountSources: {shown(source)!r} "
                    f"overlaps the runtimes folder {shown(hit)!r} of the runtime registry"
                )


def _where(loc: Iterable[int | str], data: Any) -> str:
    """`tenants[1] (team-b).maxTimeLimit` from a pydantic location in the raw file."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        else:
            out += f".{part}" if out else part
            node = node.get(part) if isinstance(node, dict) else None
    return out


def load_tenants(path: Path | None) -> Tenants | None:
    """The tenants file, or None when there is none (single-tenant); `CatalogError` naming the
    file and the entry when it cannot be used."""
    if path is None:
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CatalogError(
            f"{path}: must be a mapping with a tenants list (unset SLURMJOB_TENANTS_FILE for "
            "a single tenant)"
        )
    try:
        return Tenants.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        where = _where(first["loc"], data)
        raise CatalogError(
            f"{path}: {where}: {message}" if where else f"{path}: {message}"
        ) from exc
