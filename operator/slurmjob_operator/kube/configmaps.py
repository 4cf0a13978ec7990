"""The operator's own ConfigMap (the collective probe's cache and avoid lists): a merge patch
of the keys that changed, the ConfigMap created on the first write."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.kube.base import COMPONENT, MERGE_PATCH, Edge
from slurmjob_operator.kube.ports import ConfigMapUnavailable


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
