"""The operator's own ConfigMap (the collective probe's cache and avoid lists): a merge patch
of the keys that changed, the ConfigMap created on the first write."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.kube.base import COMPONENT, MERGE_PATCH, Edge
from slurmjob_operator.kube.ports import ConfigMapUnavailable

#: ConfigMaps read per list request.
LIST_PAGE = 200


class ConfigMaps(Edge):
    async def merge_configmap(
        self, namespace: str, name: str, data: Mapping[str, str | None]
    ) -> None:
        """Set (a value) or remove (None) keys of ConfigMap `namespace/name`; created when
        absent. ConfigMapUnavailable when the apiserver refuses or cannot be reached."""
        where = f"ConfigMap {namespace}/{name}"
        try:
            try:
                await self._core.patch_namespaced_config_map(
                    name, namespace, {"data": dict(data)}, _content_type=MERGE_PATCH
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                body = k8s.V1ConfigMap(
                    metadata=k8s.V1ObjectMeta(
                        name=name,
                        namespace=namespace,
                        labels={"app.kubernetes.io/managed-by": COMPONENT},
                    ),
                    data={k: v for k, v in data.items() if v is not None},
                )
                await self._core.create_namespaced_config_map(namespace, body)
        except ApiException as exc:
            raise ConfigMapUnavailable(f"{where}: HTTP {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ConfigMapUnavailable(f"{where}: {type(exc).__name__}") from None

    async def list_configmaps(self, namespace: str, prefix: str) -> dict[str, dict[str, str]]:
        """The data of the operator's ConfigMaps in `namespace` whose name starts with
        `prefix` (those it created: its managed-by label), read a page at a time."""
        found: dict[str, dict[str, str]] = {}
        token: str | None = None
        try:
            while True:
                page = await self._core.list_namespaced_config_map(
                    namespace,
                    label_selector=f"app.kubernetes.io/managed-by={COMPONENT}",
                    limit=LIST_PAGE,
                    _continue=token,
                )
                for item in page.items or []:
                    name = item.metadata.name
                    if name.startswith(prefix):
                        found[name] = dict(item.data or {})
                token = page.metadata._continue if page.metadata is not None else None
                if not token:
                    return found
        except ApiException as exc:
            where = f"ConfigMaps {namespace}/{prefix}*"
            raise ConfigMapUnavailable(f"{where}: HTTP {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ConfigMapUnavailable(f"ConfigMaps {namespace}: {type(exc).__name__}") from None

    async def delete_configmap(self, namespace: str, name: str) -> None:
        """Delete ConfigMap `namespace/name` (already gone: nothing to do)."""
        try:
            await self._core.delete_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise ConfigMapUnavailable(
                f"ConfigMap {namespace}/{name}: HTTP {exc.status} {exc.reason}"
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ConfigMapUnavailable(
                f"ConfigMap {namespace}/{name}: {type(exc).__name__}"
            ) from None
