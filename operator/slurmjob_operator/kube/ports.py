"""What the controller and the log API need from Kubernetes, as protocols (the Kubernetes API
through `KubeApi`, or local files for `slurmjob-operator submit`), and the errors they raise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.core.requestheader import RemoteUser


class SecretError(LookupError):
    """A referenced Secret or key is missing: the user must create it; nothing is submitted."""


class StatusConflict(RuntimeError):
    """A status write conditioned on a resourceVersion found the resource changed since: read
    it again and decide again (it is not gone)."""


class WorkloadError(RuntimeError):
    """A Kueue Workload could not be read or written (Kueue not installed, refused)."""


@runtime_checkable
class WorkloadStore(Protocol):
    """Where Kueue's Workloads are read and written (`KubeApi`; not the local runner)."""

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_workload(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def set_workload_status(
        self, workload: Mapping[str, Any], status: Mapping[str, Any]
    ) -> bool: ...

    async def delete_workload(self, namespace: str, name: str) -> None: ...

    async def workload_priority(self, name: str) -> int | None: ...

    async def flavor_labels(self, name: str) -> dict[str, str] | None: ...

    async def patch_workload(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None: ...

    async def local_queue_exists(self, namespace: str, name: str) -> bool: ...


class ReviewUnavailable(RuntimeError):
    """The apiserver did not answer a review (or refused the operator the right to ask)."""


class ConfigMapUnavailable(RuntimeError):
    """A ConfigMap could not be read (other than its absence)."""


@runtime_checkable
class ConfigMapStore(Protocol):
    """The operator's own ConfigMap: read whole, written key by key."""

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None: ...

    async def merge_configmap(
        self, namespace: str, name: str, data: Mapping[str, str | None]
    ) -> None: ...


@runtime_checkable
class ConfigMapLister(Protocol):
    """The operator's ConfigMaps of one kind (a name prefix): listed and deleted."""

    async def list_configmaps(self, namespace: str, prefix: str) -> dict[str, dict[str, str]]: ...

    async def delete_configmap(self, namespace: str, name: str) -> None: ...


class AccessReviewer(Protocol):
    """Whether a user the apiserver named may read a SlurmJob's log."""

    async def may_read_log(
        self, user: RemoteUser, namespace: str, name: str
    ) -> tuple[bool, str]: ...


@runtime_checkable
class ResourceDeleter(Protocol):
    """Deletes a finished SlurmJob whose TTL passed (`KubeApi`; the local runner keeps all)."""

    async def delete_slurmjob(self, ref: ObjectRef, resource_version: str) -> bool: ...


@runtime_checkable
class KeepsDeleted(Protocol):
    """A store that keeps a SlurmJob after its last finalizer goes (`LocalStore`: the file stays
    and its final status is printed), so a deletion writes its last tails there; the Kubernetes
    API removes the resource at that moment, and they would be read by no one."""

    keeps_deleted: Literal[True]


@runtime_checkable
class NamespaceReader(Protocol):
    """The uid of a namespace (`KubeApi`): an archive is served only to the namespace it was
    taken from, not to a new one of the same name."""

    async def namespace_uid(self, name: str) -> str | None: ...


class ResourceStore(Protocol):
    """Where the controller reads SlurmJobs and Secrets and writes status and Events: the
    Kubernetes API (`KubeApi`) or, for `slurmjob-operator submit`, local files (`LocalStore`)."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch_status(
        self, ref: ObjectRef, patch: Mapping[str, Any], resource_version: str | None = None
    ) -> dict[str, Any] | None: ...

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str: ...

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...

    async def close(self) -> None: ...
