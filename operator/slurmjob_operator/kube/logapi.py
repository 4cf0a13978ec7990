"""What the log API asks the apiserver: its APIService's caBundle (kept by certkeeper.py), whom
the front proxy is trusted to name (the ConfigMap `kube-system/extension-apiserver-
authentication`), and whether a user it names may read a log (SubjectAccessReview)."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.api.logs import API_GROUP, API_RESOURCE, API_SUBRESOURCE, API_VERSION
from slurmjob_operator.core.requestheader import RemoteUser
from slurmjob_operator.kube.base import MERGE_PATCH, Edge
from slurmjob_operator.kube.ports import ConfigMapUnavailable, ReviewUnavailable


class LogApiAccess(Edge):
    """The APIService, the front proxy's ConfigMap and SubjectAccessReviews (`AccessReviewer`)."""

    async def apiservice_ca_bundle(self, name: str) -> bytes | None:
        """APIService `name`'s spec.caBundle (b"" when unset); None when there is no such
        APIService."""
        try:
            obj = await self._custom.get_cluster_custom_object(
                "apiregistration.k8s.io", "v1", "apiservices", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        spec = obj.get("spec") if isinstance(obj, dict) else None
        bundle = spec.get("caBundle") if isinstance(spec, dict) else None
        return base64.b64decode(bundle) if isinstance(bundle, str) else b""

    async def set_apiservice_ca_bundle(self, name: str, bundle: bytes) -> bool:
        """Merge-patch APIService `name`'s spec.caBundle; False when there is none."""
        body = {"spec": {"caBundle": base64.b64encode(bundle).decode("ascii")}}
        try:
            await self._custom.patch_cluster_custom_object(
                "apiregistration.k8s.io",
                "v1",
                "apiservices",
                name,
                body,
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data; None when there is no such ConfigMap (ConfigMapUnavailable when
        it cannot be read)."""
        try:
            obj = await self._core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ConfigMapUnavailable(
                f"ConfigMap {namespace}/{name}: HTTP {exc.status} {exc.reason}"
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ConfigMapUnavailable(
                f"ConfigMap {namespace}/{name}: {type(exc).__name__}"
            ) from None
        return {str(k): str(v) for k, v in (obj.data or {}).items()}

    async def may_read_log(self, user: RemoteUser, namespace: str, name: str) -> tuple[bool, str]:
        """Whether `user` may `get` `slurmjobs/log` of `namespace/name` in the log API's group
        (a SubjectAccessReview, as the apiserver decides a request to an API it serves itself),
        and the authoriser's reason."""
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": list(user.groups),
            "extra": user.extra_map(),
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "get",
                "group": API_GROUP,
                "version": API_VERSION,
                "resource": API_RESOURCE,
                "subresource": API_SUBRESOURCE,
                "name": name,
            },
        }
        if user.uid:
            spec["uid"] = user.uid
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        try:
            async with self._reviews:
                review = await self._authz.create_subject_access_review(body)
        except ApiException as exc:
            raise ReviewUnavailable(
                f"SubjectAccessReview: HTTP {exc.status} {exc.reason}"
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ReviewUnavailable(f"SubjectAccessReview: {type(exc).__name__}") from None
        except ValueError:
            raise ReviewUnavailable(
                "SubjectAccessReview: an answer that is no SubjectAccessReview"
            ) from None
        status = review.status
        allowed = bool(status is not None and status.allowed and not status.denied)
        return allowed, str((status.reason if status is not None else None) or "")
