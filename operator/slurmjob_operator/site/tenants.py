"""The tenants file (`SLURMJOB_TENANTS_FILE`): which namespaces form a tenant, and what the jobs
of a tenant may ask of Slurm and of the shared storage.

The file is trusted (the platform admin writes it), but a mistake in it would open one
tenant's data to another, so the loader refuses anything doubtful with a message naming the
file and the entry: unknown keys, a namespace of two tenants, an empty list, a bad duration, a
mount source inside a namespace's staging tree or the runtimes folder. Unset: no tenants at
all, and every namespace's jobs are taken as before (single-tenant).

With several Slurm clusters behind the operator, a tenant may name the cluster its jobs go to
when they name none (`defaultCluster`) and, per cluster, limits and a Slurm user of their own
(`clusters: {name: ClusterLimits}`): each key given there replaces the tenant's own for its jobs
on that cluster, each key left out is the tenant's own. A tenant with `clusters` may use only
the clusters listed; one without, every cluster with its own limits. `Tenants.for_cluster`
gives the tenants as the part of the operator for one cluster sees them, so its callers read
`scope(namespace).limits`, `slurm_user` and `uid` as on a single-cluster site.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.spec import DNS_LABEL_RE, parse_time_limit
from slurmjob_operator.site.catalogs import CatalogError, RuntimeRegistry

#: A path under the storage root as its components (`datasets/team-a` -> ("datasets", "team-a")).
Parts = tuple[str, ...]

#: The name of a cluster (the clusters file's names, `spec.cluster`, `defaultCluster`).
CLUSTER_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
_CLUSTER_NAME = re.compile(CLUSTER_NAME_RE)

# Slurm account, partition and QOS names: one name each (a ',' would make a list in Slurm).
SlurmName = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._-]+$")]
Namespace = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_RE)]
ClusterName = Annotated[str, Field(pattern=CLUSTER_NAME_RE)]
_UNIX_USER_RE = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
_ROOT_USERS = frozenset({"root"})

# The keys of a cluster section, as fields of `TenantLimits` / `Tenant` (and so of the view).
_SECTION_KEYS = (
    "accounts",
    "partitions",
    "qos",
    "mount_sources",
    "max_time_limit",
    "slurm_user",
    "uid",
)


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


def _checked_sources(value: list[str] | None) -> list[str] | None:
    """Mount sources normalised (`./d//x/` -> `d/x`), or a ValueError for one that could leave
    the storage root or stand for all of it."""
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
            raise ValueError(f"{source!r}: the storage root itself holds every job's staging files")
        out.append(shown(parts))
    return out


def _checked_duration(value: int | str | None) -> int | str | None:
    if value is not None:
        try:
            parse_time_limit(value)
        except ValueError as exc:
            raise ValueError(str(exc).replace("timeLimit", "maxTimeLimit")) from None
    return value


class _At(ValueError):
    """A refusal of a whole entry that is about one of its keys: the loader shows `where`
    after the entry's own location (`tenants[0] (team-a).clusters.west.uid: ...`)."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


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
        return _checked_sources(value)

    @field_validator("max_time_limit")
    @classmethod
    def _duration(cls, value: int | str | None) -> int | str | None:
        return _checked_duration(value)

    @property
    def max_time_minutes(self) -> int | None:
        return None if self.max_time_limit is None else parse_time_limit(self.max_time_limit)

    @property
    def source_parts(self) -> list[Parts]:
        return [path_parts(s) for s in self.mount_sources or []]


class ClusterLimits(_Entry):
    """A tenant's limits and Slurm user on one cluster (`clusters.<name>`). Each key given
    replaces the tenant's own for its jobs on that cluster; null unsets an optional one there
    (`mountSources: null`: no mounts on that cluster); a key left out is the tenant's own."""

    accounts: list[SlurmName] | None = Field(default=None, min_length=1)
    partitions: list[SlurmName] | None = Field(default=None, min_length=1)
    qos: list[SlurmName] | None = Field(default=None, min_length=1)
    mount_sources: list[str] | None = Field(default=None, min_length=1)
    max_time_limit: int | str | None = None
    slurm_user: str | None = Field(default=None, pattern=_UNIX_USER_RE)
    uid: int | None = Field(default=None, ge=1)

    @field_validator("accounts", "partitions", mode="before")
    @classmethod
    def _needed(cls, value: Any) -> Any:
        # Runs only for a key that is given: a left-out key inherits, a null one would leave
        # the cluster's jobs with no account or partition to default to.
        if value is None:
            raise ValueError("cannot be unset; leave the key out to use the tenant's own")
        return value

    @field_validator("mount_sources")
    @classmethod
    def _sources(cls, value: list[str] | None) -> list[str] | None:
        return _checked_sources(value)

    @field_validator("max_time_limit")
    @classmethod
    def _duration(cls, value: int | str | None) -> int | str | None:
        return _checked_duration(value)

    @field_validator("slurm_user")
    @classmethod
    def _not_root(cls, value: str | None) -> str | None:
        if value in _ROOT_USERS:
            raise ValueError("a tenant's jobs never run as root")
        return value

    @property
    def given(self) -> dict[str, Any]:
        """The keys this section sets (field names), with their values."""
        return {key: getattr(self, key) for key in _SECTION_KEYS if key in self.model_fields_set}


class Tenant(TenantLimits):
    """A set of namespaces whose jobs share one set of limits (and, optionally, a Slurm user),
    possibly another one per cluster."""

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
    default_cluster: ClusterName | None = Field(
        default=None, description="The cluster of the tenant's SlurmJobs that name none."
    )
    require_queue: bool = Field(
        default=False,
        description=(
            "Every SlurmJob of the tenant must name a Kueue LocalQueue (label "
            "kueue.x-k8s.io/queue-name): none bypasses the team's quota."
        ),
    )
    clusters: dict[str, ClusterLimits] | None = Field(
        default=None,
        min_length=1,
        description=(
            "The only clusters the tenant's jobs may use, each with what replaces the tenant's "
            "own limits and user there. Unset: every cluster, with the tenant's own."
        ),
    )

    @field_validator("clusters")
    @classmethod
    def _cluster_names(
        cls, value: dict[str, ClusterLimits] | None
    ) -> dict[str, ClusterLimits] | None:
        for name in value or {}:
            if not _CLUSTER_NAME.match(name):
                raise ValueError(
                    f"{name!r} is not a cluster name (lowercase letters, digits and '-', at "
                    "most 40, starting and ending with a letter or digit)"
                )
        return value

    @model_validator(mode="after")
    def _user(self) -> Tenant:
        if self.slurm_user in _ROOT_USERS:
            raise ValueError("slurmUser: a tenant's jobs never run as root")
        if self.uid is not None and self.slurm_user is None:
            raise ValueError("uid: is the uid of slurmUser, which is not set")
        if self.clusters is None:
            return self
        if self.default_cluster is not None and self.default_cluster not in self.clusters:
            raise _At(
                "defaultCluster",
                f"{self.default_cluster!r} is not among the tenant's clusters "
                f"({', '.join(self.clusters)})",
            )
        for name, section in self.clusters.items():
            given = section.given
            user = given.get("slurm_user", self.slurm_user)
            uid = given.get("uid", self.uid)
            if uid is None or user is not None:
                continue
            if "uid" in given:
                raise _At(
                    f"clusters.{name}.uid",
                    "is the uid of slurmUser, which is not set on this cluster",
                )
            # The tenant's uid would be inherited by jobs that run as the operator's user.
            raise _At(
                f"clusters.{name}.slurmUser",
                f"unset on this cluster, but the tenant's uid {uid} would still apply: set "
                "uid: null here too",
            )
        return self

    def limits(self) -> TenantLimits:
        """The limits of the tenant's jobs: its own, or, in a `Tenants.for_cluster` view,
        those of that cluster."""
        return self

    def allows(self, cluster: str) -> bool:
        """Whether the tenant's jobs may run on `cluster`."""
        return self.clusters is None or cluster in self.clusters

    def for_cluster(self, cluster: str) -> Tenant:
        """The tenant as its jobs on `cluster` see it: the cluster's section over its own keys.
        On a cluster it may not use, it has no Slurm user nor uid: a user name of one cluster
        may be somebody else's on another, so the operator never acts as it there."""
        if self.clusters is None:
            return self
        section = self.clusters.get(cluster)
        if section is None:
            return self.model_copy(update={"slurm_user": None, "uid": None})
        given = section.given
        return self.model_copy(update=given) if given else self

    @property
    def every_source_parts(self) -> list[Parts]:
        """The tenant's mount sources on any cluster: its own and every section's."""
        out: list[Parts] = []
        for _, sources in self.labelled_sources():
            out.extend(s for s in sources if s not in out)
        return out

    def labelled_sources(self) -> list[tuple[str, list[Parts]]]:
        """Each list of mount sources the tenant gives, with the key that gives it
        (`mountSources`, `clusters.west.mountSources`)."""
        out: list[tuple[str, list[Parts]]] = [("mountSources", self.source_parts)]
        for name, section in (self.clusters or {}).items():
            if section.mount_sources is not None:
                out.append(
                    (
                        f"clusters.{name}.mountSources",
                        [path_parts(s) for s in section.mount_sources],
                    )
                )
        return out


class Tenants(_Entry):
    """The whole file; every namespace belongs to at most one tenant."""

    tenants: list[Tenant] = Field(min_length=1)
    _cluster: str | None = PrivateAttr(default=None)
    _base: Tenants | None = PrivateAttr(default=None)

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
            for key, sources in tenant.labelled_sources():
                # The tenant's own keep the message they always had; a section's is named.
                at = f"tenants[{index}] ({tenant.name})"
                at = f"{at}: {key}" if key == "mountSources" else f"{at}.{key}"
                for source in sources:
                    if source[0] in owner:
                        raise ValueError(
                            f"{at}: {shown(source)!r} is in the staging tree of namespace "
                            f"{source[0]} (<storage root>/<namespace> holds the job files of "
                            "that namespace)"
                        )
        return self

    def get(self, namespace: str) -> Tenant | None:
        return next((t for t in self.tenants if namespace in t.namespaces), None)

    @property
    def namespaces(self) -> frozenset[str]:
        return frozenset(ns for t in self.tenants for ns in t.namespaces)

    @property
    def cluster(self) -> str | None:
        """The cluster of a `for_cluster` view; None for the file as written."""
        return self._cluster

    def for_cluster(self, name: str) -> Tenants:
        """The same tenants as the operator's part for cluster `name` sees them: each one's
        limits, `slurm_user` and `uid` are that cluster's. A tenant that may not use `name`
        keeps its namespaces (they are still its own, not `TenantUnknown`), has no
        `slurm_user` nor `uid`, and `scope` refuses its jobs with `TenantClusterDenied`."""
        base = self._base or self
        view = base.model_copy(update={"tenants": [t.for_cluster(name) for t in base.tenants]})
        view._cluster = name
        view._base = base
        return view

    def default_cluster(self, namespace: str) -> str | None:
        """The cluster of the namespace's SlurmJobs that name none: its tenant's
        `defaultCluster`, or None (no tenant, or the tenant names none)."""
        tenant = self.get(namespace)
        return tenant.default_cluster if tenant is not None else None

    def scope(self, namespace: str) -> TenantScope:
        """The tenant of a namespace and what its jobs must stay clear of; `TenantUnknown`
        when the namespace belongs to no tenant, `TenantClusterDenied` when, in a
        `for_cluster` view, its tenant may not use that cluster."""
        tenant = self.get(namespace)
        if tenant is None:
            raise TenantUnknown(namespace)
        if self._cluster is not None and not tenant.allows(self._cluster):
            raise TenantClusterDenied(tenant, self._cluster)
        # Another tenant's sources on any cluster count, not only on this one: the storage
        # root is the same for every cluster, so its data elsewhere is still its own.
        base = self._base or self
        others: list[Parts] = []
        for other in base.tenants:
            if other.name != tenant.name:
                others.extend(s for s in other.every_source_parts if s not in others)
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
    """The mount sources of every other tenant (shared ones included), on any cluster."""

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


class TenantClusterDenied(SpecError):
    """The SlurmJob's cluster is not one of its tenant's `clusters`: nothing is submitted."""

    def __init__(self, tenant: Tenant, cluster: str) -> None:
        self.tenant = tenant.name
        self.cluster = cluster
        self.allowed = sorted(tenant.clusters or {})
        super().__init__(
            [
                f"spec.cluster: tenant {tenant.name} may use clusters "
                f"{', '.join(self.allowed)}; not {cluster}"
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
    """Refuse a tenant mount source, its own or a cluster's, that overlaps the runtimes
    folder: a tenant could read or replace the artifacts every job runs in."""
    folders = runtime_dirs(registry)
    for index, tenant in enumerate(tenants.tenants):
        for key, sources in tenant.labelled_sources():
            for source in sources:
                hit = next((f for f in folders if overlap(source, f)), None)
                if hit is not None:
                    raise CatalogError(
                        f"{path}: tenants[{index}] ({tenant.name}).{key}: {shown(source)!r} "
                        f"overlaps the runtimes folder {shown(hit)!r} of the runtime registry"
                    )


def _check_cluster_names(tenants: Tenants, known: Collection[str], path: Path) -> None:
    """Refuse a cluster the clusters file does not name: a typo would otherwise leave the
    tenant with a cluster nobody serves, or none."""
    listed = ", ".join(sorted(known)) or "none"
    for index, tenant in enumerate(tenants.tenants):
        at = f"{path}: tenants[{index}] ({tenant.name})"
        used = [("defaultCluster", tenant.default_cluster)] if tenant.default_cluster else []
        used += [(f"clusters.{name}", name) for name in tenant.clusters or {}]
        for key, name in used:
            if name not in known:
                raise CatalogError(
                    f"{at}.{key}: unknown cluster {name!r} (the clusters file names {listed})"
                )


def _where(loc: Iterable[int | str], data: Any) -> str:
    """`tenants[1] (team-b).maxTimeLimit` from a pydantic location in the raw file."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int) and not isinstance(node, dict):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        elif part == "[key]":  # the key itself is wrong (a cluster named 1)
            out += " (the name)"
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out


def load_tenants(path: Path | None, clusters: Collection[str] | None = None) -> Tenants | None:
    """The tenants file, or None when there is none (single-tenant); `CatalogError` naming the
    file and the entry when it cannot be used. With `clusters` (the names the clusters file
    knows), every cluster a tenant names must be one of them."""
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
        tenants = Tenants.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        where = _where(first["loc"], data)
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, _At):
            where = f"{where}.{cause.where}" if where else cause.where
            message = cause.message
        raise CatalogError(
            f"{path}: {where}: {message}" if where else f"{path}: {message}"
        ) from exc
    if clusters is not None:
        _check_cluster_names(tenants, clusters, path)
    return tenants
