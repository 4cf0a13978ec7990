"""The process's apiserver client (`KubeApi.connect`) against an in-process stand-in: no
proxy or netrc lookup in a worker thread before each request (the environment's proxy is read
once, a kubeconfig's own wins), and an Event posted without making its answer a model, with
the connection kept for the next request and a refusal raised as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client.exceptions import ApiException

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.kube import KubeApi

EVENTS = "/api/v1/namespaces/{namespace}/events"


class Apiserver:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.peers: set[object] = set()
        self.refuse = 0

    def app(self) -> web.Application:
        async def event(request: web.Request) -> web.Response:
            self.peers.add(
                request.transport.get_extra_info("peername") if request.transport else None
            )
            if self.refuse:
                status = {"kind": "Status", "code": self.refuse, "message": "events are refused"}
                return web.json_response(status, status=self.refuse)
            body = await request.json()
            self.events.append(body)
            # An answer as the apiserver gives it, timestamps to parse included.
            answer = {**body, "metadata": {**body["metadata"], "uid": "e-1"}}
            answer["eventTime"] = None
            answer["metadata"]["creationTimestamp"] = "2026-12-05T23:00:00Z"
            return web.json_response(answer, status=201)

        app = web.Application()
        app.router.add_post(EVENTS, event)
        return app


def kubeconfig(path: Path, server: str, proxy: str | None = None) -> Path:
    cluster: dict[str, Any] = {"server": server}
    if proxy is not None:
        cluster["proxy-url"] = proxy
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t0k3n"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
async def bed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Apiserver, KubeApi]]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")  # never the in-cluster credentials
    apiserver = Apiserver()
    server = TestServer(apiserver.app())
    await server.start_server()
    config = kubeconfig(tmp_path / "kubeconfig", str(server.make_url("")).rstrip("/"))
    api = await KubeApi.connect(config)
    yield apiserver, api
    await api.close()
    await server.close()


REF = ObjectRef("team-a", "train", "u-1")


async def test_no_proxy_or_netrc_lookup_before_a_request(
    bed: tuple[Apiserver, KubeApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver, api = bed
    looked: list[str] = []

    def netrc(self: aiohttp.ClientSession, host: str) -> None:
        looked.append(host)

    monkeypatch.setattr(aiohttp.ClientSession, "_get_netrc_auth", netrc)
    monkeypatch.setattr("aiohttp.client.get_env_proxy_for_url", lambda url: looked.append(str(url)))
    await api.post_event(REF, "Normal", "Submitted", "attempt 1 submitted as Slurm job 7")
    assert looked == []
    assert len(apiserver.events) == 1


async def test_an_event_is_posted_and_its_connection_kept(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    for i in range(3):
        await api.post_event(REF, "Normal", "Submitted", f"attempt {i} submitted")
    assert [e["message"] for e in apiserver.events] == [f"attempt {i} submitted" for i in range(3)]
    event = apiserver.events[0]
    assert event["involvedObject"]["uid"] == "u-1"
    assert event["reason"] == "Submitted"
    assert len(apiserver.peers) == 1, "each answer read whole: one connection for all three"


async def test_a_refused_event_raises_with_the_apiservers_answer(
    bed: tuple[Apiserver, KubeApi],
) -> None:
    apiserver, api = bed
    apiserver.refuse = 403
    with pytest.raises(ApiException) as refused:
        await api.post_event(REF, "Warning", "Failed", "exit code 3")
    assert refused.value.status == 403
    assert "events are refused" in (refused.value.body or b"").decode()
    apiserver.refuse = 0
    await api.post_event(REF, "Normal", "Submitted", "again")
    assert len(apiserver.events) == 1


async def test_the_environments_proxy_is_read_once_and_a_kubeconfigs_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    api = await KubeApi.connect(kubeconfig(tmp_path / "a", "https://api.example:6443"))
    try:
        rest = api.api.rest_client
        assert rest.proxy == "http://proxy.example:3128"
        assert rest.proxy_headers == {"Proxy-Authorization": "Basic dXNlcjpwdw=="}
        assert rest.pool_manager.trust_env is False
    finally:
        await api.close()
    monkeypatch.setenv("NO_PROXY", "api.example")
    api = await KubeApi.connect(kubeconfig(tmp_path / "b", "https://api.example:6443"))
    try:
        assert not api.api.rest_client.proxy
    finally:
        await api.close()
    own = "http://own.example:8080"
    api = await KubeApi.connect(kubeconfig(tmp_path / "c", "https://api.example:6443", own))
    try:
        assert api.api.rest_client.proxy == own
    finally:
        await api.close()
