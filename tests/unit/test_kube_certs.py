"""`KubeApi`'s Secret and APIService calls for the log API's serving certificate, against an
in-process stand-in for the apiserver (resourceVersion conflicts as it answers them), and the
leader's keeper going through them: the Secret created once, the caBundle of its own
APIService patched (a merge patch) and no other APIService touched."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client as k8s

from slurmjob_operator.certkeeper import CertKeeper
from slurmjob_operator.kube import KubeApi
from slurmjob_operator.kube.ports import SecretError
from slurmjob_operator.servingcert import CA_CRT, TLS_CRT, SecretServingCert

NS, SECRET = "ops", "logs-cert"
OWN, OTHER = "v1alpha1.logs.slurmjob.io", "v1beta1.metrics.k8s.io"
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


class Apiserver:
    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.apiservices: dict[str, dict[str, Any]] = {
            OWN: {"metadata": {"name": OWN}, "spec": {"group": "logs.slurmjob.io"}},
            OTHER: {"metadata": {"name": OTHER}, "spec": {"caBundle": "b3RoZXI="}},
        }
        self.requests: list[tuple[str, str, str]] = []
        self.version = 0
        self.may_create = True  # the chart's Role grants no `create` on Secrets

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        base = f"/api/v1/namespaces/{NS}/secrets"
        app.router.add_get(base + "/{name}", self.get_secret)
        app.router.add_post(base, self.create_secret)
        app.router.add_put(base + "/{name}", self.replace_secret)
        app.router.add_get(APISERVICES + "/{name}", self.get_apiservice)
        app.router.add_patch(APISERVICES + "/{name}", self.patch_apiservice)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.content_type))
        response: web.StreamResponse = await handler(request)
        return response

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    @staticmethod
    def _status(code: int) -> web.Response:
        return web.json_response({"kind": "Status", "code": code}, status=code)

    async def get_secret(self, request: web.Request) -> web.Response:
        found = self.secrets.get(request.match_info["name"])
        return web.json_response(found) if found else self._status(404)

    async def create_secret(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body["metadata"]["name"]
        if not self.may_create:
            return self._status(403)
        if name in self.secrets:
            return self._status(409)
        body["metadata"]["resourceVersion"] = self._bump()
        self.secrets[name] = body
        return web.json_response(body, status=201)

    async def replace_secret(self, request: web.Request) -> web.Response:
        body = await request.json()
        found = self.secrets.get(request.match_info["name"])
        if found is None:
            return self._status(404)
        if body["metadata"].get("resourceVersion") != found["metadata"]["resourceVersion"]:
            return self._status(409)
        body["metadata"]["resourceVersion"] = self._bump()
        self.secrets[request.match_info["name"]] = body
        return web.json_response(body)

    async def get_apiservice(self, request: web.Request) -> web.Response:
        found = self.apiservices.get(request.match_info["name"])
        return web.json_response(found) if found else self._status(404)

    async def patch_apiservice(self, request: web.Request) -> web.Response:
        found = self.apiservices.get(request.match_info["name"])
        if found is None:
            return self._status(404)
        patch = json.loads(await request.text())
        found["spec"].update(patch["spec"])
        return web.json_response(found)


@pytest.fixture
async def bed() -> AsyncIterator[tuple[Apiserver, KubeApi]]:
    apiserver = Apiserver()
    server = TestServer(apiserver.app())
    await server.start_server()
    configuration = k8s.Configuration(host=str(server.make_url("")).rstrip("/"))
    api = KubeApi(k8s.ApiClient(configuration))
    yield apiserver, api
    await api.close()
    await server.close()


async def test_secrets_are_created_read_and_replaced_on_the_version_read(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    assert await api.get_secret(NS, SECRET) is None
    data = {"tls.crt": b"\x00crt", "tls.key": b"key"}
    labels = {"app.kubernetes.io/managed-by": "slurmjob-operator"}
    kw: dict[str, Any] = {"type_": "kubernetes.io/tls", "labels": labels}
    assert await api.write_secret(NS, SECRET, data, resource_version=None, **kw)
    stored = apiserver.secrets[SECRET]
    assert stored["type"] == "kubernetes.io/tls"
    assert stored["metadata"]["labels"] == labels
    assert stored["data"]["tls.crt"] == base64.b64encode(b"\x00crt").decode()
    assert not await api.write_secret(NS, SECRET, data, resource_version=None, **kw)  # exists
    found = await api.get_secret(NS, SECRET)
    assert found == (data, "1")
    assert await api.write_secret(NS, SECRET, {"tls.crt": b"2"}, resource_version="1", **kw)
    # Someone else wrote version 2 meanwhile: a write on version 1 is refused.
    assert not await api.write_secret(NS, SECRET, {"tls.crt": b"3"}, resource_version="1", **kw)
    assert await api.get_secret(NS, SECRET) == ({"tls.crt": b"2"}, "2")


async def test_the_charts_secret_keeps_its_metadata_and_type_the_operator_writes_its_data(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    apiserver.may_create = False
    kw: dict[str, Any] = {"type_": "kubernetes.io/tls", "labels": {"app.kubernetes.io/x": "op"}}
    # Missing, and the operator may not create it: a refusal that says so.
    with pytest.raises(SecretError, match="the chart makes it"):
        await api.write_secret(NS, SECRET, {"tls.crt": b"1"}, resource_version=None, **kw)
    # As the chart renders it: Opaque, Helm's and Argo CD's metadata, no data.
    labels = {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "sj"}
    annotations = {"meta.helm.sh/release-name": "sj", "argocd.argoproj.io/tracking-id": "t"}
    apiserver.secrets[SECRET] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NS, "labels": labels,
                     "annotations": annotations, "resourceVersion": apiserver._bump()},
        "type": "Opaque",
    }  # fmt: skip
    assert await api.get_secret(NS, SECRET) == ({}, "1")
    assert await api.write_secret(NS, SECRET, {"tls.crt": b"2"}, resource_version="1", **kw)
    stored = apiserver.secrets[SECRET]
    assert stored["type"] == "Opaque"  # immutable: never changed to the operator's own type
    assert stored["metadata"]["annotations"] == annotations
    assert stored["metadata"]["labels"] == {**labels, "app.kubernetes.io/x": "op"}
    assert await api.get_secret(NS, SECRET) == ({"tls.crt": b"2"}, "2")
    # A write on a version read before another writer's is still refused.
    assert not await api.write_secret(NS, SECRET, {"tls.crt": b"3"}, resource_version="1", **kw)


async def test_an_apiservices_ca_bundle_is_read_and_merge_patched(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    assert await api.apiservice_ca_bundle(OWN) == b""
    assert await api.apiservice_ca_bundle(OTHER) == b"other"
    assert await api.apiservice_ca_bundle("v1.absent.example.com") is None
    assert await api.set_apiservice_ca_bundle(OWN, b"pem")
    assert apiserver.apiservices[OWN]["spec"] == {
        "group": "logs.slurmjob.io",
        "caBundle": base64.b64encode(b"pem").decode(),
    }
    assert ("PATCH", f"{APISERVICES}/{OWN}", "application/merge-patch+json") in apiserver.requests
    assert not await api.set_apiservice_ca_bundle("v1.absent.example.com", b"pem")


async def test_the_keeper_through_the_api_touches_its_secret_and_apiservice_only(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    keeper = CertKeeper(api, namespace=NS, secret=SECRET, service="logs", apiservice=OWN)
    assert await keeper.step()
    assert await keeper.step()
    stored = apiserver.secrets[SECRET]
    bundle = base64.b64decode(stored["data"][CA_CRT])
    assert apiserver.apiservices[OWN]["spec"]["caBundle"] == stored["data"][CA_CRT]
    assert apiserver.apiservices[OTHER]["spec"]["caBundle"] == "b3RoZXI="
    writes = [(m, p) for m, p, _ in apiserver.requests if m != "GET"]
    assert writes == [
        ("POST", f"/api/v1/namespaces/{NS}/secrets"),
        ("PATCH", f"{APISERVICES}/{OWN}"),
    ]
    assert {p for _, p, _ in apiserver.requests} == {
        f"/api/v1/namespaces/{NS}/secrets/{SECRET}",
        f"/api/v1/namespaces/{NS}/secrets",
        f"{APISERVICES}/{OWN}",
    }
    assert bundle.startswith(b"-----BEGIN CERTIFICATE-----")
    # A replica reads what the leader wrote.
    source = SecretServingCert(api, NS, SECRET)
    await source.refresh()
    pair = source.pem()
    assert pair is not None
    assert pair[0] == base64.b64decode(stored["data"][TLS_CRT])
    await source.close()
