"""The tenants file (`SLURMJOB_TENANTS_FILE`): which namespaces form a tenant, and what the jobs
of a tenant may ask of Slurm and of the shared storage.

The file is trusted (the platform admin writes it), but a mistake in it would open one
tenant's data to another, so the loader refuses anything doubtful with a message naming the
file and the entry: unknown keys, a namespace of two tenants, an empty list, a bad duration, a
mount source inside a namespace's staging tree or the runtimes folder. Unset: no tenants at
all, and every namespace's jobs are taken as before (single-tenant).

One tenant's entry, with its per-cluster sections, is `site.tenantentry`. `Tenants.for_cluster`
gives the tenants as the part of the operator for one cluster sees them, so its callers read
`scope(namespace).limits`, `slurm_user` and `uid` as on a single-cluster site.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.site.catalogs import CatalogError, RuntimeRegistry
from slurmjob_operator.site.storagepaths import Parts, overlap, runtime_dirs, shown
from slurmjob_operator.site.tenantentry import FileModel, KeyRefused, Tenant, TenantLimits


class Tenants(FileModel):
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
        if isinstance(cause, KeyRefused):
            where = f"{where}.{cause.where}" if where else cause.where
            message = cause.message
        raise CatalogError(
            f"{path}: {where}: {message}" if where else f"{path}: {message}"
        ) from exc
    if clusters is not None:
        _check_cluster_names(tenants, clusters, path)
    return tenants
