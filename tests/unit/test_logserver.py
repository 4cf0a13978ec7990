"""The log API (issue 21, section 3) on real TLS sockets on 127.0.0.1: the server as the
operator runs it (`start_log_api`: the listener limits, TLS with a context per connection),
certificates made here (tlscerts.py), a fake apiserver (the extension-apiserver-authentication
ConfigMap, SubjectAccessReviews, the SlurmJob and its Secret) and real files below a storage
root.

Who asks: only a connection with a client certificate of the front proxy's CA and an allowed
name is listened to; the user is whom its X-Remote-* headers name; the review is asked for
that user, cached when allowed (keyed by all of the user), never when refused; a changed CA
or serving certificate takes effect for new connections. What is read: tails, offsets, array
tasks, redaction and hostile files, as before (the read itself is `controller/logaccess.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from slurmjob_operator.api.logs import API_LOG_PATH, API_PATH
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.frontproxy import FrontProxyTrust
from slurmjob_operator.controller.logaccess import ClusterFiles, LogAccess
from slurmjob_operator.core import naming
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.requestheader import RemoteUser
from slurmjob_operator.kube import ReviewUnavailable, SecretError
from slurmjob_operator.listeners import Limits, Listener
from slurmjob_operator.logserver import Authoriser, start_log_api

from .tlscerts import CA, FakeServingCert, Issued, client_context

NS, NAME, UID = "team-a", "train", "0b7d9f2a-1111-2222-3333-444455556666"
SECRET = "s3cr3t-api-key-value"
DEADLINE = 0.5
SLACK = 1.0
PROXY = "front-proxy-client"

ALICE_HEADERS = {
    "X-Remote-User": "alice",
    "X-Remote-Uid": "uid-a",
    "X-Remote-Group": "team-a-users",
    "X-Remote-Extra-Scopes": "read",
    "X-Remote-Extra-Authentication.kubernetes.io%2fpod-Name": "p-1",
}
ALICE = RemoteUser(
    "alice",
    "uid-a",
    ("team-a-users",),
    (("authentication.kubernetes.io/pod-name", ("p-1",)), ("scopes", ("read",))),
)


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def raw_request(path: str, *headers: str, close: bool = False) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def authentication_configmap(ca: CA, allowed: list[str] | None = None) -> dict[str, str]:
    """The ConfigMap's data as the kube-apiserver writes it."""
    return {
        "client-ca-file": "unrelated",
        "requestheader-client-ca-file": ca.pem,
        "requestheader-allowed-names": json.dumps([PROXY] if allowed is None else allowed),
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-uid-headers": '["X-Remote-Uid"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }


@dataclass
class FakeApiserver:
    """The SlurmJobs, a Secret, the authentication ConfigMap and who may read which log."""

    configmap: dict[str, str] | None = None
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    secrets: dict[tuple[str, str, str], str] = field(default_factory=dict)
    allowed: set[tuple[str, str, str]] = field(default_factory=set)
    reviews: list[tuple[RemoteUser, str, str]] = field(default_factory=list)
    configmap_reads: list[tuple[str, str]] = field(default_factory=list)
    gets: int = 0
    down: bool = False

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        self.configmap_reads.append((namespace, name))
        return None if self.configmap is None else dict(self.configmap)

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return self.objects.get((namespace, name))

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        try:
            return self.secrets[(namespace, name, key)]
        except KeyError:
            raise SecretError(f"Secret {namespace}/{name} does not exist") from None

    async def patch_status(
        self, ref: ObjectRef, patch: Any, resource_version: str | None = None
    ) -> None:
        raise AssertionError("the log API writes nothing")

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        raise AssertionError("the log API writes nothing")

    async def close(self) -> None:
        return None

    async def may_read_log(self, user: RemoteUser, namespace: str, name: str) -> tuple[bool, str]:
        self.reviews.append((user, namespace, name))
        if self.down:
            raise ReviewUnavailable("SubjectAccessReview: HTTP 503 Service Unavailable")
        allowed = (user.username, namespace, name) in self.allowed
        return allowed, "" if allowed else "no RBAC policy matched"


def body(
    *, attempts: int = 1, phase: str = "Running", staging: str | None = None, secret: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {"command": ["true"]}
    if secret:
        spec["env"] = [
            {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}
        ]
    status = {
        "phase": phase,
        "attempts": [
            {"number": n, "jobName": f"sj-{n}", "jobId": 100 + n, "stagingDir": staging}
            for n in range(1, attempts + 1)
        ],
    }
    for a in status["attempts"]:
        if a["stagingDir"] is None:
            del a["stagingDir"]
    return {"metadata": {"namespace": NS, "name": NAME, "uid": UID}, "spec": spec, "status": status}


@dataclass
class Bed:
    api: FakeApiserver
    root: Path
    clock: Clock
    listener: Listener
    trust: FrontProxyTrust
    serving_ca: CA
    serving: FakeServingCert
    proxy_ca: CA
    proxy: Issued
    access: LogAccess
    sessions: list[aiohttp.ClientSession] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.listener.port}"

    def attempt_dir(self, number: int = 1, name: str = NAME) -> Path:
        path = naming.staging_dir(self.root, NS, name, UID, number)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def session(self, client: Issued | str | None = "proxy") -> aiohttp.ClientSession:
        """A client presenting the front proxy's certificate (or `client`, or none)."""
        cert = self.proxy if client == "proxy" else client
        assert not isinstance(cert, str)
        connector = aiohttp.TCPConnector(ssl=client_context(self.serving_ca, cert))
        session = aiohttp.ClientSession(connector=connector)
        self.sessions.append(session)
        return session

    async def get(
        self,
        name: str = NAME,
        *,
        namespace: str = NS,
        headers: Mapping[str, str] | None = None,
        session: aiohttp.ClientSession | None = None,
        path: str | None = None,
        **query: str,
    ) -> tuple[int, dict[str, Any]]:
        http = session or self.session()
        url = self.url + (path or API_LOG_PATH.format(namespace=namespace, name=name))
        sent = dict(ALICE_HEADERS if headers is None else headers)
        async with http.get(url, params=query, headers=sent) as resp:
            data: dict[str, Any] = await resp.json(content_type=None)
            return resp.status, data


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    proxy_ca, serving_ca = CA("front-proxy-ca"), CA("slurmjob-operator-ca")
    api = FakeApiserver(configmap=authentication_configmap(proxy_ca))
    api.allowed.add(("alice", NS, NAME))
    api.objects[(NS, NAME)] = body()
    settings = Settings(storage_root=tmp_path)
    clock = Clock()
    access = LogAccess(
        api,
        {"default": ClusterFiles(settings, lambda ns: None)},
        Clusters(("default",)),
        namespaces=(NS, "team-b"),
        clock=clock,
    )
    serving = FakeServingCert(serving_ca.issue("slurmjob-operator-logs", server=True))
    trust = FrontProxyTrust(api, interval=3600)
    limits = Limits(
        header_timeout=DEADLINE, keepalive=5.0, write_timeout=DEADLINE, max_connections=16
    )
    listener = await start_log_api(
        access, Authoriser(api, clock=clock), trust, serving, "127.0.0.1", 0, limits
    )
    bed = Bed(
        api,
        tmp_path,
        clock,
        listener,
        trust,
        serving_ca,
        serving,
        proxy_ca,
        proxy_ca.issue(PROXY),
        access,
    )
    yield bed
    for session in bed.sessions:
        await session.close()
    await listener.close()
    assert serving.closed


# -- authorised -------------------------------------------------------------------------------


async def test_an_authorised_user_reads_the_tail_reviewed_as_the_headers_name_them(
    bed: Bed,
) -> None:
    (bed.attempt_dir() / "stdout.log").write_text("".join(f"line {i}\n" for i in range(3000)))
    status, data = await bed.get()
    assert status == 200
    lines = data["text"].splitlines()
    assert (len(lines), lines[-1], data["truncated"]) == (2000, "line 2999", True)
    assert data["nextOffset"] == data["size"] == (bed.attempt_dir() / "stdout.log").stat().st_size
    assert (data["attempt"], data["latestAttempt"], data["ended"]) == (1, 1, False)
    assert bed.api.reviews == [(ALICE, NS, NAME)]
    assert bed.api.configmap_reads == [("kube-system", "extension-apiserver-authentication")]


async def test_a_follower_reads_on_from_an_offset(bed: Bed) -> None:
    log = bed.attempt_dir() / "stdout.log"
    log.write_text("first\nsec")
    status, data = await bed.get(offset="0")
    assert (status, data["text"], data["nextOffset"], data["offset"]) == (200, "first\n", 6, 0)
    with log.open("a") as f:
        f.write("ond\n")
    status, data = await bed.get(offset="6")
    assert (data["text"], data["nextOffset"]) == ("second\n", 13)


async def test_stderr_an_older_attempt_and_an_array_task(bed: Bed) -> None:
    bed.api.objects[(NS, NAME)] = body(attempts=2)
    (bed.attempt_dir(1) / "stderr.log").write_text("attempt one failed\n")
    (bed.attempt_dir(2) / "stdout-7.log").write_text("task seven\n")
    _, data = await bed.get(stream="stderr", attempt="1")
    assert (data["text"], data["attempt"], data["latestAttempt"], data["ended"]) == (
        "attempt one failed\n",
        1,
        2,
        True,
    )
    _, data = await bed.get(index="7")
    assert (data["text"], data["index"]) == ("task seven\n", 7)


async def test_a_log_not_written_yet(bed: Bed) -> None:
    bed.attempt_dir()
    status, data = await bed.get()
    assert (status, data["found"], data["text"], data["nextOffset"]) == (200, False, "", 0)


async def test_a_read_of_the_slurmjob_is_shared_for_a_second(bed: Bed) -> None:
    bed.attempt_dir()
    await bed.get()
    await bed.get()
    assert bed.api.gets == 1
    bed.clock.now += 1.0
    await bed.get()
    assert bed.api.gets == 2


async def test_secret_values_are_hidden_and_unknown_ones_show_nothing(bed: Bed) -> None:
    bed.api.objects[(NS, NAME)] = body(secret=True, phase="Succeeded")
    bed.api.secrets[(NS, "creds", "k")] = SECRET
    text = f"using key {SECRET} now\n"
    (bed.attempt_dir() / "stdout.log").write_text(text)
    _, data = await bed.get()
    assert data["text"] == "using key *** now\n"
    _, data = await bed.get(offset=str(text.index(SECRET) + 6))
    assert data["text"] == "*** now\n"
    del bed.api.secrets[(NS, "creds", "k")]
    bed.clock.now += 60
    status, data = await bed.get()
    assert (status, data["reason"]) == (503, "SecretsUnknown")
    assert SECRET not in str(data)


# -- who asks: the client certificate ---------------------------------------------------------


async def test_no_client_certificate_is_401_whatever_the_headers_say(bed: Bed) -> None:
    (bed.attempt_dir() / "stdout.log").write_text("private\n")
    http = bed.session(client=None)
    status, data = await bed.get(session=http)
    assert (status, data["kind"], data["reason"]) == (401, "SlurmJobLogError", "Unauthorized")
    status, _ = await bed.get(session=http, path=API_PATH)  # discovery neither
    assert status == 401
    bed.api.configmap = authentication_configmap(bed.proxy_ca, allowed=[])  # any name...
    await bed.trust.refresh()
    status, _ = await bed.get(session=bed.session(client=None))  # ...but a certificate
    assert status == 401
    assert bed.api.reviews == []
    assert bed.api.gets == 0


async def test_a_certificate_of_another_ca_is_refused_at_the_handshake(bed: Bed) -> None:
    forged = CA("front-proxy-ca").issue(PROXY)  # same names, another key
    http = bed.session(client=forged)
    with pytest.raises(aiohttp.ClientError):
        await bed.get(session=http)
    assert bed.listener.cuts.get("handshake", 0) >= 1
    assert bed.api.reviews == []


async def test_a_server_certificate_is_no_client_certificate(bed: Bed) -> None:
    # Signed by the front proxy's CA, but for servers only (extended key usage).
    http = bed.session(client=bed.proxy_ca.issue(PROXY, server=True))
    with pytest.raises(aiohttp.ClientError):
        await bed.get(session=http)
    assert bed.api.reviews == []


async def test_a_name_not_allowed_is_401_and_an_empty_list_allows_any(bed: Bed) -> None:
    other = bed.session(client=bed.proxy_ca.issue("someone-else"))
    status, data = await bed.get(session=other)
    assert (status, data["reason"]) == (401, "Unauthorized")
    assert "name is not allowed" in data["message"]
    assert bed.api.reviews == []
    bed.api.configmap = authentication_configmap(bed.proxy_ca, allowed=[])
    await bed.trust.refresh()
    status, _ = await bed.get(session=bed.session(client=bed.proxy_ca.issue("someone-else")))
    assert status == 200


async def test_only_the_configured_headers_name_the_user(bed: Bed) -> None:
    cm = authentication_configmap(bed.proxy_ca)
    cm["requestheader-username-headers"] = '["X-Proxy-User", "X-Remote-User"]'
    cm["requestheader-group-headers"] = '["X-Proxy-Group"]'
    cm["requestheader-extra-headers-prefix"] = '["X-Proxy-Extra-"]'
    del cm["requestheader-uid-headers"]
    bed.api.configmap = cm
    await bed.trust.refresh()
    headers = {
        "X-Proxy-User": "alice",
        "X-Remote-User": "mallory",
        "X-Proxy-Group": "g1",
        "X-Remote-Group": "system:masters",
        "X-Proxy-Extra-Scopes": "a",
        "X-Remote-Extra-Scopes": "b",
        "X-Remote-Uid": "uid-m",
    }
    await bed.get(headers=headers)
    assert bed.api.reviews == [(RemoteUser("alice", "", ("g1",), (("scopes", ("a",)),)), NS, NAME)]


async def test_no_user_named_is_401(bed: Bed) -> None:
    status, data = await bed.get(headers={"X-Remote-Group": "system:masters"})
    assert (status, data["reason"]) == (401, "Unauthorized")
    assert bed.api.reviews == []


# -- the review and its cache -----------------------------------------------------------------


async def test_a_refusal_is_403_and_never_cached(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    bed.attempt_dir()
    caplog.set_level(logging.INFO)
    bed.api.allowed.clear()
    status, data = await bed.get()
    assert status == 403
    assert data["message"] == (
        'slurmjobs.logs.slurmjob.io "train" is forbidden: User "alice" cannot get resource '
        '"slurmjobs/log" in API group "logs.slurmjob.io" in the namespace "team-a"'
    )
    assert bed.api.gets == 0
    bed.api.allowed.add(("alice", NS, NAME))
    status, _ = await bed.get()  # granted: works at once
    assert status == 200
    assert len(bed.api.reviews) == 2


async def test_an_allowed_decision_is_kept_briefly_keyed_by_the_whole_user(bed: Bed) -> None:
    bed.attempt_dir()
    for _ in range(3):
        assert (await bed.get())[0] == 200
    assert len(bed.api.reviews) == 1  # one review for repeated asks
    more_groups = {**ALICE_HEADERS, "X-Remote-Group": "system:masters"}
    await bed.get(headers=more_groups)
    other_extra = {**ALICE_HEADERS, "X-Remote-Extra-Scopes": "write"}
    await bed.get(headers=other_extra)
    other_uid = {**ALICE_HEADERS, "X-Remote-Uid": "uid-b"}
    await bed.get(headers=other_uid)
    await bed.get("other")
    assert len(bed.api.reviews) == 5
    assert bed.api.reviews[1][0].groups == ("system:masters",)
    bed.clock.now += 10.0
    await bed.get()
    assert len(bed.api.reviews) == 6


async def test_the_apiserver_away_is_503(bed: Bed) -> None:
    bed.api.down = True
    status, data = await bed.get()
    assert (status, data["reason"]) == (503, "ReviewUnavailable")


async def test_bad_names_and_queries_never_reach_a_review(bed: Bed) -> None:
    for name in ("UPPER", "a..b", "-x", "x" * 254, "a%2Fb"):
        status, data = await bed.get(name)
        assert (status, data["reason"]) in ((400, "BadName"), (404, "NotFound")), name
    status, data = await bed.get(namespace="Team-A")
    assert (status, data["reason"]) == (400, "BadName")
    status, data = await bed.get(index="../../../etc/passwd")
    assert (status, data["reason"]) == (400, "BadQuery")
    assert bed.api.reviews == []


async def test_a_namespace_not_watched_is_404_before_any_review(bed: Bed) -> None:
    status, data = await bed.get(namespace="team-c")
    assert (status, data["reason"]) == (404, "NotWatched")
    assert bed.api.reviews == []
    bed.api.allowed.add(("alice", NS, "gone"))
    status, data = await bed.get("gone")
    assert (status, data["reason"]) == (404, "NotFound")


async def test_an_encoded_line_break_forges_no_log_line(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    forged = "x%0AERROR%20slurmjob_operator%20forged"
    async with bed.session().get(
        bed.url + API_LOG_PATH.format(namespace=NS, name=forged), headers=ALICE_HEADERS
    ) as resp:
        assert resp.status == 400
    assert bed.api.reviews == []
    # A user name with a line separator (the HTTP parser refuses control characters, but this
    # is UTF-8 text to it), refused and logged.
    bed.api.allowed.clear()
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", bed.listener.port, ssl=client_context(bed.serving_ca, bed.proxy)
    )
    path = API_LOG_PATH.format(namespace=NS, name=NAME)
    writer.write(raw_request(path, "X-Remote-User: mallory\u2028ERROR forged", close=True))
    assert (await reader.read()).startswith(b"HTTP/1.1 403 ")
    writer.close()
    assert bed.api.reviews[0][0].username == "mallory\u2028ERROR forged"
    for record in caplog.records:
        assert record.getMessage().isprintable(), record.getMessage()
    assert "refused mallory\\u2028ERROR forged the logs of team-a/train" in caplog.text


# -- discovery and the rest ------------------------------------------------------------------


async def test_discovery_answers_the_aggregator_and_openapi_is_404(bed: Bed) -> None:
    aggregator = {"X-Remote-User": "system:kube-aggregator", "X-Remote-Group": "system:masters"}
    status, data = await bed.get(path=API_PATH, headers=aggregator)
    assert status == 200
    assert data == {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "logs.slurmjob.io/v1alpha1",
        "resources": [
            {
                "name": "slurmjobs/log",
                "singularName": "",
                "namespaced": True,
                "kind": "SlurmJobLog",
                "verbs": ["get"],
            }
        ],
    }
    status, _ = await bed.get(path=API_PATH, headers={})  # no user named: discovery still
    assert status == 200
    for path in ("/openapi/v2", "/openapi/v3", "/apis", "/v1/namespaces/team-a/slurmjobs/x/log"):
        status, data = await bed.get(path=path, headers=aggregator)
        assert (status, data["kind"]) == (404, "SlurmJobLogError"), path
    async with bed.session().post(
        bed.url + API_LOG_PATH.format(namespace=NS, name=NAME), headers=ALICE_HEADERS
    ) as resp:
        assert resp.status == 405
    assert bed.api.reviews == []


# -- trust and certificates change -------------------------------------------------------------


async def test_a_new_front_proxy_ca_takes_effect(bed: Bed) -> None:
    bed.attempt_dir()
    kept = bed.session()
    assert (await bed.get(session=kept))[0] == 200  # a kept-alive connection of the old CA
    new_ca = CA("front-proxy-ca-2")
    bed.api.configmap = authentication_configmap(new_ca)
    await bed.trust.refresh()
    status, data = await bed.get(session=kept)
    assert (status, data["reason"]) == (401, "Unauthorized")
    with pytest.raises(aiohttp.ClientError):  # a new connection with the old CA's certificate
        await bed.get()
    status, _ = await bed.get(session=bed.session(client=new_ca.issue(PROXY)))
    assert status == 200


async def test_a_bundle_of_two_cas_trusts_both(bed: Bed) -> None:
    bed.attempt_dir()
    new_ca = CA("front-proxy-ca-2")
    bed.api.configmap = authentication_configmap(bed.proxy_ca)
    bed.api.configmap["requestheader-client-ca-file"] = bed.proxy_ca.pem + new_ca.pem
    await bed.trust.refresh()
    assert (await bed.get(session=bed.session(client=new_ca.issue(PROXY))))[0] == 200
    assert (await bed.get())[0] == 200


async def test_a_configmap_gone_trusts_nobody_and_a_broken_one_keeps_the_last(bed: Bed) -> None:
    bed.attempt_dir()
    bed.api.configmap = {"requestheader-client-ca-file": "not a certificate"}
    await bed.trust.refresh()
    assert (await bed.get())[0] == 200
    bed.api.configmap = {
        **authentication_configmap(bed.proxy_ca),
        "requestheader-group-headers": "x",
    }
    await bed.trust.refresh()
    assert (await bed.get())[0] == 200
    bed.api.configmap = None
    await bed.trust.refresh()
    with pytest.raises(aiohttp.ClientError):  # no CA: no client certificate passes
        await bed.get()
    status, _ = await bed.get(session=bed.session(client=None))
    assert status == 401


async def test_the_trust_is_read_again_on_its_own(tmp_path: Path) -> None:
    api = FakeApiserver(configmap=None)
    trust = FrontProxyTrust(api, interval=0.05)
    task = asyncio.create_task(trust.run())
    try:
        await asyncio.sleep(0.02)
        assert trust.current is None
        api.configmap = authentication_configmap(CA("ca"))
        for _ in range(500):  # read again within its interval (0.05 s), load or not
            if trust.current is not None:
                break
            await asyncio.sleep(0.02)
        assert trust.current is not None
        assert trust.current.allowed_names == frozenset({PROXY})
    finally:
        task.cancel()


async def test_a_new_serving_certificate_is_served_to_new_connections(bed: Bed) -> None:
    async def connect() -> Streams:
        return await asyncio.open_connection(
            "127.0.0.1", bed.listener.port, ssl=client_context(bed.serving_ca, bed.proxy)
        )

    def served(writer: asyncio.StreamWriter) -> bytes:
        der: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return der

    old = bed.serving.issued
    assert old is not None
    kept = await connect()
    assert served(kept[1]) == old.der
    bed.serving.replace(bed.serving_ca.issue("slurmjob-operator-logs", server=True))
    fresh = await connect()
    assert served(fresh[1]) == bed.serving.issued.der  # type: ignore[union-attr]
    for reader, writer in (kept, fresh):  # both serve: the open one keeps its own
        writer.write(raw_request(API_PATH, close=True))
        assert (await reader.read()).startswith(b"HTTP/1.1 200 ")
        writer.close()


async def test_no_serving_certificate_yet_closes_connections(bed: Bed) -> None:
    bed.serving.issued = None
    bed.serving.generation += 1
    # The one served so far stays: a certificate is never taken away for want of a new one.
    assert (await bed.get(path=API_PATH))[0] == 200


# -- the handshake under the listener limits -------------------------------------------------


async def test_a_stalled_handshake_is_closed_within_the_deadline(bed: Bed) -> None:
    loop = asyncio.get_running_loop()
    streams = []
    for partial in (b"", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):  # half a ClientHello
        reader, writer = await asyncio.open_connection("127.0.0.1", bed.listener.port)
        writer.write(partial)
        streams.append((reader, writer, loop.time()))
    for reader, writer, started in streams:
        async with asyncio.timeout(DEADLINE + SLACK):
            assert await reader.read() == b""
        assert loop.time() - started <= DEADLINE + SLACK
        writer.close()
    await asyncio.sleep(0.05)
    assert bed.listener.connections == 0


async def _hold_silently(port: int, source: str, stop: asyncio.Event) -> None:
    """One attacker's slot: connect from `source`, send nothing (no certificate, not even a
    ClientHello), and connect again the moment the connection is closed."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
        except OSError:
            await asyncio.sleep(0.001)
            continue
        try:
            with contextlib.suppress(Exception):
                await reader.read()
        finally:
            writer.close()


async def test_silent_connections_never_lock_the_front_proxy_out(bed: Bed) -> None:
    """Pods of four addresses hold every slot of the cap (16) with silent TCP connections,
    renewed the moment they are closed, for six head deadlines; the front proxy's new
    connections (a valid client certificate, from an address of its own) are all served.
    Before, one over the cap was closed before its handshake whoever it was: the aggregator's
    availability check failed, the APIService went Available=False and discovery of the
    group (and every namespace deletion in the cluster) failed with it."""
    port = bed.listener.port
    assert (await bed.get(path=API_PATH))[0] == 200
    stop = asyncio.Event()
    attackers = [f"127.0.0.{n}" for n in (2, 3, 4, 5)]
    holders = [
        asyncio.create_task(_hold_silently(port, source, stop))
        for source in attackers
        for _ in range(10)  # 40 wanted, 16 slots, 8 at most from each address
    ]
    try:
        # Every slot taken (on a loaded machine the 40 connects take longer than a moment).
        for _ in range(200):
            if bed.listener.connections >= 16:
                break
            await asyncio.sleep(0.05)
        assert bed.listener.connections == 16
        served = failed = 0
        for _ in range(30):  # 3 s
            session = bed.session()  # a new connection each time, as the proxy makes when cut
            try:
                async with asyncio.timeout(2):
                    status, _ = await bed.get(path=API_PATH, session=session)
                served += status == 200
            except (aiohttp.ClientError, OSError, TimeoutError):
                failed += 1
            await session.close()
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    assert (served, failed) == (30, 0)
    assert bed.listener.cuts.get("evicted", 0) >= 30  # each took the place of a silent one
    assert bed.listener.refusals.get("source", 0) > 0  # and no address held more than 8


async def test_a_head_the_parser_refuses_is_not_logged_with_its_bytes(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", bed.listener.port, ssl=client_context(bed.serving_ca)
    )
    writer.write(raw_request(API_PATH, "X-Forged: a\x01\nERROR forged", close=True))
    assert (await reader.read()).startswith(b"HTTP/1.0 400 ")
    writer.close()
    assert "refused by the HTTP parser (BadHttpMessage)" in caplog.text
    assert "forged" not in caplog.text


async def test_plain_http_on_the_tls_port_is_refused_at_once(bed: Bed) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", bed.listener.port)
    writer.write(b"GET " + API_PATH.encode() + b" HTTP/1.1\r\nX-Remote-User: alice\r\n\r\n")
    async with asyncio.timeout(DEADLINE / 2):
        got = await reader.read()
    writer.close()
    assert b"HTTP/1.1" not in got
    assert bed.api.reviews == []


async def test_a_server_without_any_certificate_refuses_connections(tmp_path: Path) -> None:
    proxy_ca = CA("front-proxy-ca")
    api = FakeApiserver(configmap=authentication_configmap(proxy_ca))
    access = LogAccess(api, {}, Clusters(("default",)))
    serving = FakeServingCert(None)
    limits = Limits(header_timeout=DEADLINE, keepalive=1, write_timeout=1, max_connections=4)
    listener = await start_log_api(
        access, Authoriser(api), FrontProxyTrust(api), serving, "127.0.0.1", 0, limits
    )
    serving_ca = CA("serving")
    context = client_context(serving_ca, proxy_ca.issue(PROXY))
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.open_connection("127.0.0.1", listener.port, ssl=context)
        assert listener.cuts.get("tls") == 1
        serving.replace(serving_ca.issue("logs", server=True))
        _, writer = await asyncio.open_connection("127.0.0.1", listener.port, ssl=context)
        writer.close()
    finally:
        await listener.close()


# -- hostile files (the read, reached through the API) -----------------------------------------


async def test_a_symlinked_log_is_refused_and_its_target_never_shown(bed: Bed) -> None:
    target = bed.root / "operator-token"
    target.write_text("the operator's own token\n")
    (bed.attempt_dir() / "stdout.log").symlink_to(target)
    status, data = await bed.get()
    assert (status, data["reason"]) == (422, "UnsafeFile")
    assert "operator's own token" not in str(data)
    assert str(bed.root) not in data["message"]


async def test_a_symlinked_attempt_directory_is_refused_without_the_roots_path(
    bed: Bed,
) -> None:
    elsewhere = bed.root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stdout.log").write_text("not this job's\n")
    attempt = naming.staging_dir(bed.root, NS, NAME, UID, 1)
    attempt.parent.mkdir(parents=True)
    attempt.symlink_to(elsewhere)
    status, data = await bed.get()
    assert (status, data["reason"]) == (422, "UnsafeFile")
    assert "not this job's" not in str(data)
    assert str(bed.root) not in data["message"]
    assert "attempt-1" in data["message"]


async def test_a_log_owned_by_someone_else_is_refused(bed: Bed) -> None:
    (bed.attempt_dir() / "stdout.log").write_text("x\n")
    bed.access.clusters["default"] = ClusterFiles(
        Settings(storage_root=bed.root), lambda ns: os.geteuid() + 1
    )
    status, data = await bed.get()
    assert (status, data["reason"]) == (422, "UnsafeFile")
    assert "not by the job user" in data["message"]


async def test_a_fifo_does_not_hang_the_endpoint(bed: Bed) -> None:
    os.mkfifo(bed.attempt_dir() / "stdout.log")
    status, data = await bed.get(offset="0")
    assert (status, data["reason"]) == (422, "UnsafeFile")


async def test_a_huge_file_is_capped(bed: Bed) -> None:
    log = bed.attempt_dir() / "stdout.log"
    with log.open("wb") as f:
        f.truncate(1024 * 1024 * 1024)  # 1 GiB, sparse
        f.seek(0, 2)
        f.write(b"the end\n")
    _, tail = await bed.get()
    assert tail["text"].endswith("the end\n")
    assert len(tail["text"].encode()) <= 64 * 1024
    _, piece = await bed.get(offset="0")
    assert piece["nextOffset"] == 64 * 1024


async def test_a_status_naming_another_directory_is_not_followed(bed: Bed) -> None:
    other = naming.staging_dir(bed.root, "team-b", "theirs", "ffffffff-0000", 1)
    other.mkdir(parents=True)
    (other / "stdout.log").write_text("team b's results\n")
    bed.api.objects[(NS, NAME)] = body(staging=str(other))
    (bed.attempt_dir() / "stdout.log").write_text("mine\n")
    _, data = await bed.get()
    assert data["text"] == "mine\n"


async def test_an_attempt_on_a_cluster_not_configured(bed: Bed) -> None:
    obj = body()
    obj["status"]["attempts"][0]["cluster"] = "west"
    bed.api.objects[(NS, NAME)] = obj
    status, data = await bed.get()
    assert (status, data["reason"]) == (409, "ClusterUnknown")
