"""The Kubernetes edge: read SlurmJobs and Secrets, patch status, post Events.

One `kubernetes_asyncio` ApiClient per process, opened at startup and closed at cleanup. kopf
drives the handlers; these calls are the operator's own writes, made *when* the decision core
says (a status write must land before the submit POST, not after the handler returns).
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator import GROUP, KIND, PLURAL, VERSION
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.times import rfc3339

COMPONENT = "slurmjob-operator"
_MERGE_PATCH = "application/merge-patch+json"
_counter = itertools.count()


class SecretError(LookupError):
    """A referenced Secret or key is missing: the user must create it; nothing is submitted."""


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
