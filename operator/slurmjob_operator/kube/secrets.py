"""Secrets: the one key a SlurmJob's environment names (read in the resource's own namespace
only), and the log API's serving certificate (certkeeper.py, servingcert.py)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.kube.base import Edge
from slurmjob_operator.kube.ports import SecretError


class Secrets(Edge):
    """Reads and writes of Secrets."""

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        try:
            secret = await self._core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise SecretError(f"Secret {namespace}/{name} does not exist") from exc
            if exc.status == 403:
                raise SecretError(f"not allowed to read Secret {namespace}/{name}") from exc
            raise
        data = secret.data or {}
        if key not in data:
            raise SecretError(f"Secret {namespace}/{name} has no key {key!r}")
        try:
            return base64.b64decode(data[key]).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise SecretError(f"Secret {namespace}/{name} key {key!r} is not UTF-8 text") from exc

    async def get_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        """A Secret's data, decoded, and its resourceVersion; None when there is none."""
        try:
            secret = await self._core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = {str(k): base64.b64decode(v or "") for k, v in (secret.data or {}).items()}
        return data, str(secret.metadata.resource_version or "")

    async def write_secret(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes],
        *,
        type_: str,
        labels: Mapping[str, str],
        resource_version: str | None,
    ) -> bool:
        """Create the Secret (`resource_version` None) or replace the data of the version read;
        False when another writer came first (or it is gone).

        A replace keeps the Secret's own labels, annotations and type: the chart makes it
        (Opaque, with Helm's and Argo CD's metadata and no data), and the operator's RBAC has
        no `create` on Secrets, only `get`/`update` on this name. Older installs hold one the
        operator made (kubernetes.io/tls); its type is immutable, so it stays too."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": type_,
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
        }
        try:
            if resource_version is None:
                await self._core.create_namespaced_secret(namespace, body)
                return True
            current = await self._core.read_namespaced_secret(name, namespace)
            meta = current.metadata
            if str(meta.resource_version or "") != resource_version:
                return False
            metadata["labels"] = {**dict(labels), **(meta.labels or {})}
            metadata["annotations"] = dict(meta.annotations or {})
            metadata["resourceVersion"] = resource_version
            body["type"] = current.type or type_
            await self._core.replace_namespaced_secret(name, namespace, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            if exc.status == 403 and resource_version is None:
                raise SecretError(
                    f"Secret {namespace}/{name} does not exist and the operator may not create "
                    "it: the chart makes it (helm upgrade brings it back)"
                ) from exc
            raise
        return True
