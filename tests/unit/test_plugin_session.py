"""The plugin's `Session` on real kubeconfig files against an in-process stand-in apiserver:
the token of a `token:` user and of an exec credential plugin, the context's namespace, the
request the log read makes through the service proxy (its path, the user's token both as
the apiserver's Authorization and in X-Slurmjob-Token, the query), and the kubeconfig never
written back."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from slurmjob_operator.api.logs import LogQuery, LogStream
from slurmjob_operator.plugin.kubeclient import Operator, PluginError, Session, TokenRejected


class Apiserver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, Any, dict[str, str]]] = []
        self.status = 200
        self.body: dict[str, Any] = {}

    def app(self) -> web.Application:
        async def proxy(request: web.Request) -> web.Response:
            self.requests.append((request.path, request.headers.copy(), dict(request.query)))
            return web.json_response(self.body, status=self.status)

        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/services/{svc}/proxy/{path:.*}", proxy)
        return app


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[Apiserver, str]]:
    fake = Apiserver()
    server = TestServer(fake.app())
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


def kubeconfig(path: Path, server: str, user: dict[str, Any], namespace: str | None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": context}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(config))
    return path


ANSWER = {
    "namespace": "team-a",
    "name": "train",
    "attempt": 1,
    "latestAttempt": 1,
    "stream": "stderr",
    "found": True,
    "text": "hello\n",
    "nextOffset": 6,
    "size": 6,
    "ended": True,
}


async def test_a_token_user_reads_through_the_service_proxy(
    apiserver: tuple[Apiserver, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = apiserver
    path = kubeconfig(tmp_path / "config", url, {"token": "sa-token-123"}, "team-a")
    before = path.read_text()
    monkeypatch.setenv("KUBECONFIG", str(path))
    session = await Session.open()
    try:
        assert session.namespace == "team-a"
        token = await session.bearer_token()
        assert token == "sa-token-123"
        fake.body = ANSWER
        query = LogQuery(stream=LogStream.STDERR, index=3, offset=10)
        got = await session.read_log(
            Operator("slurmjob-system", "slurmjob-operator-logs"), "team-a", "train", query, token
        )
        assert got.text == "hello\n"
        path_seen, headers, params = fake.requests[0]
        assert path_seen == (
            "/api/v1/namespaces/slurmjob-system/services/slurmjob-operator-logs:logs/proxy"
            "/v1/namespaces/team-a/slurmjobs/train/log"
        )
        assert headers["authorization"] == "Bearer sa-token-123"
        assert headers["X-Slurmjob-Token"] == "sa-token-123"
        assert params == {"stream": "stderr", "index": "3", "offset": "10"}
        fake.status, fake.body = 401, {"kind": "Status", "message": "Unauthorized"}
        with pytest.raises(TokenRejected):
            await session.read_log(
                Operator("slurmjob-system", "x"), "team-a", "train", LogQuery(), token
            )
    finally:
        await session.close()
    assert path.read_text() == before


async def test_an_exec_plugin_that_gives_a_token_works(
    apiserver: tuple[Apiserver, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = apiserver
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "exec-token-456"},
    }
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
            "interactiveMode": "Never",
        }
    }
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", url, user, None)))
    session = await Session.open()
    try:
        assert session.namespace == "default"
        assert await session.bearer_token() == "exec-token-456"
        await session.refresh_token()
        assert await session.bearer_token() == "exec-token-456"
    finally:
        await session.close()


async def test_basic_auth_is_no_bearer_token(
    apiserver: tuple[Apiserver, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = apiserver
    user = {"username": "u", "password": "p"}
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", url, user, None)))
    session = await Session.open()
    try:
        assert await session.bearer_token() is None
    finally:
        await session.close()


async def test_no_kubeconfig_and_no_pod_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(PluginError, match="no usable kubeconfig"):
        await Session.open()
    with pytest.raises(PluginError, match="cannot use context 'elsewhere'"):
        await Session.open("elsewhere")


async def test_ctrl_c_ends_a_follower_quietly(
    apiserver: tuple[Apiserver, str], tmp_path: Path
) -> None:
    import asyncio
    import os
    import signal

    fake, url = apiserver
    fake.body = {**ANSWER, "stream": "stdout", "ended": False}  # never ends by itself
    path = kubeconfig(tmp_path / "config", url, {"token": "sa-token-123"}, "team-a")
    plugin = Path(sys.executable).parent / "kubectl-slurmjob"
    proc = await asyncio.create_subprocess_exec(
        str(plugin),
        "logs",
        "train",
        "-f",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(path)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert first == b"hello\n"
    # Following: it asks again from the offset it was given (and this stand-in answers the
    # same text every time).
    again = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert again == b"hello\n"
    assert fake.requests[-1][2]["offset"] == "6"
    proc.send_signal(signal.SIGINT)
    code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 130
    assert await proc.stderr.read() == b""
