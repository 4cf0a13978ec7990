"""The Kubernetes edge: read SlurmJobs and Secrets, patch status, post Events; and for the log
API, whom the apiserver's front proxy is trusted to name (the ConfigMap
`kube-system/extension-apiserver-authentication`) and whether a user it names may read a log
(SubjectAccessReview).

One `kubernetes_asyncio` ApiClient per process, opened at startup and closed at cleanup. kopf
drives the handlers; these calls are the operator's own writes, made *when* the decision core
says (a status write must land before the submit POST, not after the handler returns).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator import GROUP, KIND, PLURAL, VERSION
from slurmjob_operator.api.logs import API_GROUP, API_RESOURCE, API_SUBRESOURCE, API_VERSION
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.core.requestheader import RemoteUser
from slurmjob_operator.times import rfc3339

COMPONENT = "slurmjob-operator"
_MERGE_PATCH = "application/merge-patch+json"
_counter = itertools.count()


class SecretError(LookupError):
    """A referenced Secret or key is missing: the user must create it; nothing is submitted."""


#: SubjectAccessReviews in flight at once (the log API's).
REVIEWS_AT_ONCE = 8


KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"


def _api_message(exc: ApiException) -> str:
    """The apiserver's own words of a refusal (its Status message), bounded."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return str(message)[:2048] if message else ""


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


class AccessReviewer(Protocol):
    """Whether a user the apiserver named may read a SlurmJob's log."""

    async def may_read_log(
        self, user: RemoteUser, namespace: str, name: str
    ) -> tuple[bool, str]: ...


class ResourceStore(Protocol):
    """Where the controller reads SlurmJobs and Secrets and writes status and Events: the
    Kubernetes API (`KubeApi`) or, for `slurmjob-operator submit`, local files (`LocalStore`)."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch_status(
        self, ref: ObjectRef, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None: ...

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str: ...

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...

    async def close(self) -> None: ...


class KubeApi:
    """The few Kubernetes calls the operator makes, on one ApiClient."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api
        self._custom = k8s.CustomObjectsApi(api)
        self._core = k8s.CoreV1Api(api)
        self._authz = k8s.AuthorizationV1Api(api)
        # Reviews are asked for users the apiserver names, but a flood of them costs at most
        # this many at once, never unbounded apiserver load.
        self._reviews = asyncio.Semaphore(REVIEWS_AT_ONCE)

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None) -> KubeApi:
        """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            await k8s_config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                client_configuration=configuration,
            )
        return cls(k8s.ApiClient(configuration))

    @property
    def api(self) -> k8s.ApiClient:
        """The client the other adapters (the Lease) share."""
        return self._api

    async def close(self) -> None:
        await self._api.close()

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

    async def patch_status(self, ref: ObjectRef, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        """JSON-merge-patch `/status`; None when the object is gone. The uid precondition keeps
        a write for a deleted object from landing on a new one of the same name."""
        body = {"metadata": {"uid": ref.uid}, "status": dict(patch)}
        try:
            obj = await self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, body, _content_type=_MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            raise
        result: dict[str, Any] = obj
        return result

    # -- Kueue Workloads (only when a SlurmJob names a LocalQueue) ------------------------

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
                f"{exc.reason}: {_api_message(exc)}"
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
        flavor): where a Slurm job admitted on it runs (`core.kueue.placement`)."""
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
                _content_type=_MERGE_PATCH,
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
                _content_type=_MERGE_PATCH,
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

    # -- the log API's own serving certificate (certkeeper.py, servingcert.py) ---------------

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
        """Create the Secret (`resource_version` None) or replace the version read; False when
        another writer came first (or it is gone)."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": type_,
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()},
        }
        try:
            if resource_version is None:
                await self._core.create_namespaced_secret(namespace, body)
            else:
                await self._core.replace_namespaced_secret(name, namespace, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

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
                _content_type=_MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the SlurmJob (`kubectl describe` shows it)."""
        now = datetime.now(tz=UTC)
        body = {
            "metadata": {
                "name": f"{ref.name}.{int(now.timestamp() * 1e6):x}{next(_counter):x}",
                "namespace": ref.namespace,
            },
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
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
        await self._core.create_namespaced_event(ref.namespace, body)

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
