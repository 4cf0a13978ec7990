"""The plugin's `Session` on real kubeconfig files against an in-process stand-in apiserver
that serves the aggregated log API (issue 21, section 3): the request the log read makes (its
path below `/apis/logs.slurmjob.io/v1alpha1`, the query, the kubeconfig's own credentials and
no token in a header of the plugin's own) for a `token:` user, a client-certificate user over
TLS and an exec credential plugin (run again once when the apiserver refuses its token); the
context's namespace; and the kubeconfig never written back."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import os
import re
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from slurmjob_operator.api.logs import LogQuery, LogStream
from slurmjob_operator.plugin.kubeclient import (
    LogsApiAbsent,
    PluginError,
    Session,
    Unauthorized,
    kubeconfig_files,
)

LOG_ROUTE = "/apis/logs.slurmjob.io/v1alpha1/namespaces/{ns}/slurmjobs/{name}/log"


class Apiserver:
    """Answers the log path only (any other path is the 404 of an apiserver without the
    APIService); records each request with the client certificate's CN, if any."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any, dict[str, str], str | None]] = []
        self.status = 200
        self.body: dict[str, Any] = {}
        self.tokens: set[str] | None = None  # accepted bearer tokens (None: any)
        self.absent = False  # answer as an apiserver without the APIService

    def app(self) -> web.Application:
        async def log(request: web.Request) -> web.Response:
            cn = None
            transport = request.transport
            peer = transport.get_extra_info("peercert") if transport else None
            if peer:
                cn = dict(part[0] for part in peer["subject"]).get("commonName")
            self.requests.append((request.path, request.headers.copy(), dict(request.query), cn))
            if self.absent:
                return web.Response(status=404, text="404 page not found\n")
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if self.tokens is not None and bearer not in self.tokens:
                return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
            return web.json_response(self.body, status=self.status)

        app = web.Application()
        app.router.add_get(LOG_ROUTE, log)
        return app


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[Apiserver, str]]:
    fake = Apiserver()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


def kubeconfig(
    path: Path,
    server: str,
    user: dict[str, Any],
    namespace: str | None,
    cluster: dict[str, Any] | None = None,
) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
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


def _no_token_elsewhere(headers: Any, token: str) -> None:
    """The token travels as the apiserver's Authorization and in no other header."""
    for name, value in headers.items():
        if name.lower() != "authorization":
            assert token not in value, name


async def test_a_token_user_asks_the_apiserver_for_the_aggregated_log(
    apiserver: tuple[Apiserver, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = apiserver
    path = kubeconfig(tmp_path / "config", url, {"token": "sa-token-123"}, "team-a")
    before = path.read_text()
    monkeypatch.setenv("KUBECONFIG", str(path))
    session = await Session.open()
    try:
        assert session.namespace == "team-a"
        fake.body = ANSWER
        query = LogQuery(stream=LogStream.STDERR, index=3, offset=10)
        got = await session.read_log("team-a", "train", query)
        assert got.text == "hello\n"
        path_seen, headers, params, _ = fake.requests[0]
        assert path_seen == "/apis/logs.slurmjob.io/v1alpha1/namespaces/team-a/slurmjobs/train/log"
        assert headers["Authorization"] == "Bearer sa-token-123"
        assert "X-Slurmjob-Token" not in headers
        _no_token_elsewhere(headers, "sa-token-123")
        assert params == {"stream": "stderr", "index": "3", "offset": "10"}
        fake.status, fake.body = 401, {"kind": "Status", "message": "Unauthorized"}
        with pytest.raises(Unauthorized):
            await session.read_log("team-a", "train", LogQuery())
        assert not await session.refresh_credentials()  # a plain token: nothing to fetch
        # An apiserver without the APIService.
        fake.absent = True
        with pytest.raises(LogsApiAbsent, match="404 page not found"):
            await session.read_log("team-a", "train", LogQuery())
    finally:
        await session.close()
    assert path.read_text() == before


# -- a client-certificate user, over TLS ----------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_client_certificate_user_reads_the_log_with_no_token_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _cert("apiserver", server_key, ("test-ca", ca_key), server=True)
    user_key = ec.generate_private_key(ec.SECP256R1())
    user_cert = _cert("alice", user_key, ("test-ca", ca_key))
    (tmp_path / "ca.crt").write_bytes(_pem(ca))
    (tmp_path / "server.crt").write_bytes(_pem(server_cert))
    (tmp_path / "server.key").write_bytes(_key_pem(server_key))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tmp_path / "ca.crt")
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED  # as an apiserver with --client-ca-file
    fake = Apiserver()
    fake.body = ANSWER
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server(ssl=context)
    try:
        url = f"https://127.0.0.1:{server.port}"
        user = {
            "client-certificate-data": _b64(_pem(user_cert)),
            "client-key-data": _b64(_key_pem(user_key)),
        }
        cluster = {"certificate-authority-data": _b64(_pem(ca))}
        path = kubeconfig(tmp_path / "config", url, user, "team-a", cluster)
        monkeypatch.setenv("KUBECONFIG", str(path))
        session = await Session.open()
        try:
            got = await session.read_log("team-a", "train", LogQuery())
        finally:
            await session.close()
    finally:
        await server.close()
    assert got.text == "hello\n"
    (path_seen, headers, _, cn) = fake.requests[0]
    assert path_seen.endswith("/namespaces/team-a/slurmjobs/train/log")
    assert cn == "alice"  # the apiserver knows the user by the certificate
    assert "Authorization" not in headers
    assert not any(h.lower().startswith("x-slurmjob") for h in headers)


# -- an exec credential plugin --------------------------------------------------------------


def _exec_user(counter: Path) -> dict[str, Any]:
    """An exec plugin that gives `exec-token-<n>`, n counting its runs (in `counter`)."""
    script = (
        "import json, pathlib, sys; p = pathlib.Path(sys.argv[1]); "
        "n = int(p.read_text() or 0) + 1 if p.exists() else 1; p.write_text(str(n)); "
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        "'kind': 'ExecCredential', 'status': {'token': f'exec-token-{n}', "
        "'expirationTimestamp': '2999-01-01T00:00:00Z'}}))"
    )
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": ["-c", script, str(counter)],
            "interactiveMode": "Never",
        }
    }


async def test_an_exec_plugins_token_is_fetched_again_when_the_apiserver_refuses_it(
    apiserver: tuple[Apiserver, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = apiserver
    fake.body = ANSWER
    counter = tmp_path / "runs"
    path = kubeconfig(tmp_path / "config", url, _exec_user(counter), None)
    monkeypatch.setenv("KUBECONFIG", str(path))
    session = await Session.open()
    try:
        assert session.namespace == "default"
        await session.read_log("team-a", "train", LogQuery())
        assert fake.requests[-1][1]["Authorization"] == "Bearer exec-token-1"
        # The apiserver stops taking it before the expiry the plugin gave (revoked, or a
        # clock apart): one more run of the plugin, its new token.
        fake.tokens = {"exec-token-2"}
        with pytest.raises(Unauthorized):
            await session.read_log("team-a", "train", LogQuery())
        assert await session.refresh_credentials()
        await session.read_log("team-a", "train", LogQuery())
        assert fake.requests[-1][1]["Authorization"] == "Bearer exec-token-2"
        _no_token_elsewhere(fake.requests[-1][1], "exec-token-2")
    finally:
        await session.close()
    assert counter.read_text() == "2"


async def test_no_kubeconfig_and_no_pod_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(
        PluginError, match=r"no kubeconfig \(KUBECONFIG=.*\) and not inside a pod: set KUBECONFIG"
    ):
        await Session.open()
    with pytest.raises(PluginError, match="cannot use context 'elsewhere': no kubeconfig"):
        await Session.open("elsewhere")
    with pytest.raises(PluginError, match="--kubeconfig /nowhere: no such file"):
        await Session.open(kubeconfig="/nowhere")
    broken = tmp_path / "broken"
    broken.write_text("kind: Config\n")
    with pytest.raises(PluginError, match=re.escape(f"cannot use the kubeconfig {broken}:")):
        await Session.open(kubeconfig=str(broken))


async def test_kubeconfig_flag_then_the_list_in_kubeconfig_then_home(
    apiserver: tuple[Apiserver, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As kubectl: --kubeconfig first; else every existing file of $KUBECONFIG, the first
    naming the current context; else ~/.kube/config."""
    _, url = apiserver
    flag = kubeconfig(tmp_path / "flag", url, {"token": "t"}, "from-flag")
    listed = kubeconfig(tmp_path / "listed", url, {"token": "t"}, "from-list")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True, exist_ok=True)
    kubeconfig(home / ".kube/config", url, {"token": "t"}, "from-home")
    monkeypatch.setenv("HOME", str(home))
    absent = str(tmp_path / "absent")
    for environ, option, namespace in [
        ({"KUBECONFIG": str(listed)}, str(flag), "from-flag"),
        ({"KUBECONFIG": os.pathsep.join([absent, str(listed)])}, None, "from-list"),
        ({}, None, "from-home"),
        ({"KUBECONFIG": ""}, None, "from-home"),
    ]:
        session = await Session.open(kubeconfig=option, environ=environ)
        try:
            assert session.namespace == namespace, environ
        finally:
            await session.close()
    assert kubeconfig_files(None, {"KUBECONFIG": absent}) == ([], f"KUBECONFIG={absent}")
    assert kubeconfig_files("~/.kube/config", {}) == ([str(home / ".kube/config")], mock.ANY)


async def test_ctrl_c_ends_a_follower_quietly(
    apiserver: tuple[Apiserver, str], tmp_path: Path
) -> None:
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
