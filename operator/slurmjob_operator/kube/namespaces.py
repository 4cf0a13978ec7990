"""Namespaces, read only for their uid (the log archive's owner check)."""

from __future__ import annotations

from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.kube.base import Edge


class Namespaces(Edge):
    async def namespace_uid(self, name: str) -> str | None:
        """The uid of namespace `name` now; None when there is no such namespace."""
        try:
            namespace = await self._core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        uid = namespace.metadata.uid if namespace.metadata is not None else None
        return str(uid) if uid else None
