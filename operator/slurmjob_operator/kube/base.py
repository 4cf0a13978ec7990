"""The one `kubernetes_asyncio` ApiClient of the process and what every part of `KubeApi` shares:
opened at startup (in-cluster credentials or a kubeconfig), closed at cleanup."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Self

from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from yarl import URL

COMPONENT = "slurmjob-operator"
MERGE_PATCH = "application/merge-patch+json"
#: SubjectAccessReviews in flight at once (the log API's).
REVIEWS_AT_ONCE = 8


def api_message(exc: ApiException) -> str:
    """The apiserver's own words of a refusal (its Status message), bounded."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return str(message)[:2048] if message else ""


def _proxy_from_env(configuration: k8s.Configuration) -> None:
    """A proxy the environment names for the apiserver (HTTPS_PROXY, NO_PROXY), read once: the
    configuration's own (a kubeconfig's proxy-url) wins."""
    if configuration.proxy:
        return
    try:
        proxy, auth = get_env_proxy_for_url(URL(configuration.host))
    except LookupError:
        return
    configuration.proxy = str(proxy)
    if auth is not None:
        configuration.proxy_headers = {"Proxy-Authorization": auth.encode()}


def _no_lookups_per_request(api: k8s.ApiClient) -> None:
    """kubernetes_asyncio's session trusts the environment, so aiohttp looked for a proxy and
    read ~/.netrc in a worker thread before every request: two thread hops per status write
    and Event at every submission. The proxy is read once (`_proxy_from_env`), and netrc can
    give nothing here (the client sends its own Authorization header, which aiohttp refuses to
    combine with netrc's)."""
    session = api.rest_client.pool_manager
    if session.trust_env:
        session._trust_env = False  # no public setter; tests/unit/test_kube_base.py checks it


class Edge:
    """The ApiClient and the typed APIs on it; each part of `KubeApi` adds its calls."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api
        self._custom = k8s.CustomObjectsApi(api)
        self._core = k8s.CoreV1Api(api)
        self._authz = k8s.AuthorizationV1Api(api)
        # Reviews are asked for users the apiserver names, but a flood of them costs at most
        # this many at once, never unbounded apiserver load.
        self._reviews = asyncio.Semaphore(REVIEWS_AT_ONCE)

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None) -> Self:
        """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            await k8s_config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                client_configuration=configuration,
            )
        _proxy_from_env(configuration)
        api = k8s.ApiClient(configuration)
        _no_lookups_per_request(api)
        return cls(api)

    @property
    def api(self) -> k8s.ApiClient:
        """The client the other adapters (the Lease) share."""
        return self._api

    async def close(self) -> None:
        await self._api.close()
