"""Kueue's objects: the Workload the operator keeps for a SlurmJob that names a LocalQueue, and
the cluster-scoped classes and flavors it reads (`WorkloadStore`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.kube.base import MERGE_PATCH, Edge, api_message
from slurmjob_operator.kube.ports import WorkloadError

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"


class Workloads(Edge):
    """Kueue Workloads, LocalQueues, WorkloadPriorityClasses and ResourceFlavors."""

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = await self._custom.get_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise WorkloadError(f"Workload {namespace}/{name}: HTTP {exc.status}") from None
        result: dict[str, Any] = obj
        return result

    async def create_workload(self, body: Mapping[str, Any]) -> dict[str, Any]:
        namespace = str(body["metadata"]["namespace"])
        try:
            obj = await self._custom.create_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", dict(body)
            )
        except ApiException as exc:
            if exc.status == 409:  # made by a previous leader: read it
                found = await self.get_workload(namespace, str(body["metadata"]["name"]))
                if found is not None:
                    return found
            raise WorkloadError(
                f"Workload {namespace}/{body['metadata']['name']}: HTTP {exc.status} "
                f"{exc.reason}: {api_message(exc)}"
            ) from None
        result: dict[str, Any] = obj
        return result

    async def _kueue_cluster_object(self, plural: str, name: str) -> Any:
        """A cluster-scoped Kueue object (None when there is none)."""
        try:
            return await self._custom.get_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise WorkloadError(f"{plural} {name}: HTTP {exc.status}") from None

    async def workload_priority(self, name: str) -> int | None:
        """The value of WorkloadPriorityClass `name` (None when there is none): Kueue's
        defaulting webhook sets a Workload's priority from it, which a Workload made by the
        operator must carry itself."""
        obj = await self._kueue_cluster_object("workloadpriorityclasses", name)
        value = obj.get("value") if isinstance(obj, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    async def flavor_labels(self, name: str) -> dict[str, str] | None:
        """ResourceFlavor `name`'s nodeLabels ({} when it has none; None when there is no such
        flavor): where a Slurm job admitted on it runs (`core.kueue.flavors.placement`)."""
        obj = await self._kueue_cluster_object("resourceflavors", name)
        if obj is None:
            return None
        spec = obj.get("spec") if isinstance(obj, dict) else None
        labels = spec.get("nodeLabels") if isinstance(spec, dict) else None
        if not isinstance(labels, dict):
            return {}
        return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}

    async def set_workload_status(
        self, workload: Mapping[str, Any], status: Mapping[str, Any]
    ) -> bool:
        """Merge-patch the Workload's status, on the version read (False: it changed or is
        gone meanwhile; read it again)."""
        meta = workload.get("metadata") or {}
        body = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": dict(status),
        }
        try:
            await self._custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                str(meta.get("namespace")),
                "workloads",
                str(meta.get("name")),
                body,
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise WorkloadError(f"Workload {meta.get('name')}: HTTP {exc.status}") from None
        return True

    async def patch_workload(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch the Workload (its spec.active and the operator's annotation); None when
        it is gone."""
        try:
            obj = await self._custom.patch_namespaced_custom_object(
                KUEUE_GROUP,
                KUEUE_VERSION,
                namespace,
                "workloads",
                name,
                dict(patch),
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise WorkloadError(f"Workload {namespace}/{name}: HTTP {exc.status}") from None
        result: dict[str, Any] = obj
        return result

    async def local_queue_exists(self, namespace: str, name: str) -> bool:
        try:
            await self._custom.get_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise WorkloadError(f"LocalQueue {namespace}/{name}: HTTP {exc.status}") from None
        return True

    async def delete_workload(self, namespace: str, name: str) -> None:
        try:
            await self._custom.delete_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise WorkloadError(f"Workload {namespace}/{name}: HTTP {exc.status}") from None
