"""SlurmJobs on the apiserver: read one, merge-patch its status, post an Event on it, delete
one whose TTL after it finished has passed."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator import GROUP, KIND, PLURAL, VERSION
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.kube.base import COMPONENT, MERGE_PATCH, Edge
from slurmjob_operator.kube.ports import StatusConflict
from slurmjob_operator.times import rfc3339

_counter = itertools.count()


class SlurmJobs(Edge):
    """The SlurmJob resource itself (`ResourceStore` with `Secrets.read_secret_value`)."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The SlurmJob as the API server has it now, or None when it is gone."""
        try:
            obj = await self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: dict[str, Any] = obj
        return result

    async def list_all(self, page: int = 500) -> list[dict[str, Any]]:
        """Every SlurmJob of every namespace, read `page` at a time (the image cache's sweep:
        which SlurmJobs still use an entry)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": page}
            if token:
                kwargs["_continue"] = token
            got = await self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kwargs)
            items.extend(got.get("items") or [])
            token = (got.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def patch_status(
        self, ref: ObjectRef, patch: Mapping[str, Any], resource_version: str | None = None
    ) -> dict[str, Any] | None:
        """JSON-merge-patch `/status`; None when the object is gone. The uid precondition keeps
        a write for a deleted object from landing on a new one of the same name; with a
        `resource_version`, a resource changed since that version is not written either and
        `StatusConflict` says so (read it again and decide again: it is not gone)."""
        metadata: dict[str, str] = {"uid": ref.uid}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        body = {"metadata": metadata, "status": dict(patch)}
        try:
            obj = await self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, body, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status == 409 and resource_version is not None:
                text = f"{ref.namespace}/{ref.name} changed since it was read"
                raise StatusConflict(text) from exc
            if exc.status in (404, 409):
                return None
            raise
        result: dict[str, Any] = obj
        return result

    async def delete_slurmjob(self, ref: ObjectRef, resource_version: str) -> bool:
        """Delete the SlurmJob as it was at `resource_version` (its finalizer then runs);
        False when it is gone or changed since (uid and resourceVersion preconditions: a
        SlurmJob made again under the name, or edited, is not deleted)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": ref.uid, "resourceVersion": resource_version},
            "propagationPolicy": "Background",
        }
        try:
            await self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, body=body
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the SlurmJob (`kubectl describe` shows it)."""
        involved = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
        }
        await self._post_event(ref.namespace, ref.name, involved, type_, reason, message)

    async def post_pod_event(
        self, namespace: str, pod: str, type_: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event on a Pod (the operator's own: what concerns no SlurmJob)."""
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace}
        await self._post_event(namespace, pod, involved, type_, reason, message)

    async def _post_event(
        self,
        namespace: str,
        name: str,
        involved: Mapping[str, str],
        type_: str,
        reason: str,
        message: str,
    ) -> None:
        now = datetime.now(tz=UTC)
        body = {
            "metadata": {
                "name": f"{name}.{int(now.timestamp() * 1e6):x}{next(_counter):x}",
                "namespace": namespace,
            },
            "involvedObject": dict(involved),
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": rfc3339(now),
            "lastTimestamp": rfc3339(now),
            "count": 1,
        }
        # The answer read but not made into a V1Event (its timestamps parsed): nothing uses it.
        answer = await self._core.create_namespaced_event(namespace, body, _preload_content=False)
        data = await answer.read()  # read whole: the connection goes back to the pool
        if not 200 <= answer.status <= 299:
            refused = ApiException(status=answer.status, reason=answer.reason)
            refused.body, refused.headers = data, answer.headers
            raise refused
