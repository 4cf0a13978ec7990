"""One entry of the tenants file: a tenant, what its jobs may ask of Slurm and of the shared
storage, and what replaces that on each cluster.

With several Slurm clusters behind the operator, a tenant may name the cluster its jobs go to
when they name none (`defaultCluster`) and, per cluster, limits and a Slurm user of their own
(`clusters: {name: ClusterLimits}`): each key given there replaces the tenant's own for its jobs
on that cluster, each key left out is the tenant's own. A tenant with `clusters` may use only
the clusters listed; one without, every cluster with its own limits.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from slurmjob_operator.api.spec import DNS_LABEL_RE, parse_time_limit
from slurmjob_operator.config.images import REGISTRY_ENTRY_RE
from slurmjob_operator.site.storagepaths import Parts, path_parts, shown

#: The name of a cluster (the clusters file's names, `spec.cluster`, `defaultCluster`).
CLUSTER_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
_CLUSTER_NAME = re.compile(CLUSTER_NAME_RE)

# Slurm account, partition and QOS names: one name each (a ',' would make a list in Slurm).
SlurmName = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._-]+$")]
Namespace = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_RE)]
RegistryEntry = Annotated[str, Field(max_length=255, pattern=REGISTRY_ENTRY_RE)]
SecretName = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
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
    "max_total_time",
    "slurm_user",
    "uid",
)


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


class KeyRefused(ValueError):
    """A refusal of a whole entry that is about one of its keys: the loader shows `where`
    after the entry's own location (`tenants[0] (team-a).clusters.west.uid: ...`)."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


class FileModel(BaseModel):
    """A mapping of the tenants file: keys as written (camelCase), and an unknown key refused,
    since a misspelt limit would otherwise be dropped and leave the tenant unbounded."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class TenantLimits(FileModel):
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
    max_total_time: int | str | None = Field(
        default=None,
        description="The longest spec.walltime.totalTime (minutes or a duration).",
    )

    @field_validator("mount_sources")
    @classmethod
    def _sources(cls, value: list[str] | None) -> list[str] | None:
        return _checked_sources(value)

    @field_validator("max_time_limit", "max_total_time")
    @classmethod
    def _duration(cls, value: int | str | None) -> int | str | None:
        return _checked_duration(value)

    @property
    def max_time_minutes(self) -> int | None:
        return None if self.max_time_limit is None else parse_time_limit(self.max_time_limit)

    @property
    def max_total_minutes(self) -> int | None:
        return None if self.max_total_time is None else parse_time_limit(self.max_total_time)

    @property
    def source_parts(self) -> list[Parts]:
        return [path_parts(s) for s in self.mount_sources or []]


class ClusterLimits(FileModel):
    """A tenant's limits and Slurm user on one cluster (`clusters.<name>`). Each key given
    replaces the tenant's own for its jobs on that cluster; null unsets an optional one there
    (`mountSources: null`: no mounts on that cluster); a key left out is the tenant's own."""

    accounts: list[SlurmName] | None = Field(default=None, min_length=1)
    partitions: list[SlurmName] | None = Field(default=None, min_length=1)
    qos: list[SlurmName] | None = Field(default=None, min_length=1)
    mount_sources: list[str] | None = Field(default=None, min_length=1)
    max_time_limit: int | str | None = None
    max_total_time: int | str | None = None
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

    @field_validator("max_time_limit", "max_total_time")
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
    image_registries: list[RegistryEntry] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Registries (host[:port], optionally /path prefix) spec.framework.image may name, "
            "where the site enables images (docs/images.md). Unset: no images."
        ),
    )
    image_credentials_secret: SecretName | None = Field(
        default=None,
        description=(
            "Secret in the operator's namespace (type kubernetes.io/dockerconfigjson) whose "
            "credentials the tenant's imports use; its images are the tenant's own cache "
            "entries, readable by its uid only (needs uid)."
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
        if self.image_credentials_secret is not None and self.uid is None:
            raise KeyRefused(
                "imageCredentialsSecret",
                "a tenant's private images are readable by its uid only: set slurmUser and uid",
            )
        if self.clusters is None:
            return self
        if self.default_cluster is not None and self.default_cluster not in self.clusters:
            raise KeyRefused(
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
                raise KeyRefused(
                    f"clusters.{name}.uid",
                    "is the uid of slurmUser, which is not set on this cluster",
                )
            # The tenant's uid would be inherited by jobs that run as the operator's user.
            raise KeyRefused(
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
