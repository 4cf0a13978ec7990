"""The listener limits (issue 21, section 2) on real sockets on 127.0.0.1: the log API
(`serve_logs`, over TLS with the front proxy's client certificate), the standby's health probe
(`serve_health`) and /metrics (`serve_metrics`), each under a short configured deadline.

A slow partial request is cut at the header deadline, a connection that sends nothing too, an
idle one after the keep-alive, one that leaves its answer unread after the write deadline;
over the cap the oldest unproven connection (of the address holding the most) gives way to a
new one, a proven one (the log API's front proxy) never does, one address holds at most its
own cap of unproven ones; a 64 KiB head or a body is refused;
/metrics still serves the registry's exposition text, and no thread serves any connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from slurmjob_operator.api.logs import API_LOG_PATH
from slurmjob_operator.config import Settings
from slurmjob_operator.core.requestheader import RemoteUser
from slurmjob_operator.election import serve_health
from slurmjob_operator.listeners import Limits, Listener, admission, serve_handler, serve_metrics
from slurmjob_operator.logserver import serve_logs
from slurmjob_operator.metrics import Metrics

from .tlscerts import CA, FakeServingCert, client_context

DEADLINE = 0.4  # the configured header deadline, keep-alive and write deadline of these tests
CAP = 4
# Scheduling slack on a loaded machine: a connection is closed within DEADLINE + SLACK.
SLACK = 1.0

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def settings(tmp_path: Path, **more: Any) -> Settings:
    given: dict[str, Any] = {
        "storage_root": tmp_path,
        "metrics_address": "127.0.0.1",
        "logs_address": "127.0.0.1",
        "listener_header_timeout": DEADLINE,
        "listener_keepalive": DEADLINE,
        "listener_write_timeout": DEADLINE,
        "listener_max_connections": CAP,
    }
    return Settings(**(given | more))


PROXY_CA, SERVING_CA = CA("front-proxy-ca"), CA("serving-ca")
#: The front proxy's client context: the log API's connections are made with it.
PROXY_CLIENT = client_context(SERVING_CA, PROXY_CA.issue("front-proxy-client"))


class FakeKube:
    """What the log API asks the apiserver: the front proxy's CA; nobody may read a log."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        return {
            "requestheader-client-ca-file": PROXY_CA.pem,
            "requestheader-username-headers": '["X-Remote-User"]',
        }

    async def may_read_log(self, user: RemoteUser, namespace: str, name: str) -> tuple[bool, str]:
        return False, "no"


Opener = Callable[[Settings], Awaitable[Listener | None]]


def _metrics(s: Settings) -> Awaitable[Listener | None]:
    return serve_metrics(s, Metrics().registry, Limits.from_settings(s))


def _logs(s: Settings) -> Awaitable[Listener | None]:
    cert = FakeServingCert(SERVING_CA.issue("logs", server=True))
    return serve_logs(s, FakeKube(), cert=cert)  # type: ignore[arg-type]


async def _health(s: Settings) -> Listener | None:
    url = f"http://127.0.0.1:{s.metrics_port}/healthz"
    return await serve_health(url, lambda: True, Limits.from_settings(s))


# Each listener with one request it answers 200 (health), 401 (logs: no user named) or 200,
# and the TLS client its connections are made with (None: plain HTTP).
LISTENERS: dict[str, tuple[Opener, str, ssl.SSLContext | None]] = {
    "metrics": (_metrics, "/metrics", None),
    "health": (_health, "/healthz", None),
    "logs": (_logs, API_LOG_PATH.format(namespace="ns", name="job"), PROXY_CLIENT),
}


@dataclass
class Served:
    """One of the operator's listeners, a path it answers and how a client connects."""

    listener: Listener
    path: str
    tls: ssl.SSLContext | None

    @property
    def port(self) -> int:
        return self.listener.port

    async def connect(self) -> Streams:
        """A connection ready for a request: TLS handshaken on the log API's port."""
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls)


@pytest.fixture(params=sorted(LISTENERS))
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    opener, path, tls = LISTENERS[request.param]
    port = free_port()
    listener = await opener(settings(tmp_path, metrics_port=port, logs_port=port))
    assert listener is not None
    yield Served(listener, path, tls)
    await listener.close()


async def connect(port: int) -> Streams:
    return await asyncio.open_connection("127.0.0.1", port)


async def closed_after(reader: asyncio.StreamReader, within: float) -> tuple[float, bytes]:
    """Read until the server closes the connection: the seconds it took and what was sent."""
    started = time.monotonic()
    got = b""
    try:
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                got += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        pytest.fail(f"still open after {within} s (got {got[:80]!r})")
    return time.monotonic() - started, got


def request(path: str, *extra: str, close: bool = False) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *extra]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no Content-Length in {head!r}")


async def status_of(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 5)
    return int(line.split()[1])


def close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        writer.close()


# -- the deadlines ----------------------------------------------------------------------------


async def test_a_slow_partial_request_is_cut_at_the_header_deadline(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(b"GET " + served.path.encode() + b" HTTP/1.1\r\nHost: x\r\n")

    async def trickle() -> None:
        with contextlib.suppress(OSError):
            while True:  # a byte every 50 ms: always sending, never done
                await asyncio.sleep(0.05)
                writer.write(b"X")

    sender = asyncio.create_task(trickle())
    try:
        took, got = await closed_after(reader, DEADLINE + SLACK)
    finally:
        sender.cancel()
        close(writer)
    assert DEADLINE * 0.8 <= took <= DEADLINE + SLACK
    assert got == b""  # no answer: the request never ended
    assert served.listener.cuts.get("header") == 1


async def test_a_connection_that_sends_nothing_is_cut_at_the_deadline(served: Served) -> None:
    reader, writer = await connect(served.port)
    took, _ = await closed_after(reader, DEADLINE + SLACK)
    close(writer)
    assert took <= DEADLINE + SLACK


async def test_an_idle_keep_alive_connection_is_closed_after_the_short_keep_alive(
    served: Served,
) -> None:
    reader, writer = await served.connect()
    for _ in range(2):  # the connection is kept between requests...
        writer.write(request(served.path))
        assert await status_of(reader) in (200, 401)
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(content_length(head))
    took, rest = await closed_after(reader, DEADLINE + SLACK)  # ...but not while idle
    close(writer)
    assert rest == b""
    assert DEADLINE * 0.8 <= took <= DEADLINE + SLACK


async def test_an_answer_left_unread_is_cut_at_the_write_deadline(tmp_path: Path) -> None:
    from aiohttp import web

    big = b"x" * (64 * 1024 * 1024)

    async def handler(_: web.BaseRequest) -> web.StreamResponse:
        return web.Response(body=big)

    limits = Limits.from_settings(settings(tmp_path))
    listener = await serve_handler(handler, "127.0.0.1", 0, limits, name="big")
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", listener.port))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.transport.pause_reading()  # never read the answer
        writer.write(request("/"))
        await asyncio.sleep(DEADLINE + SLACK)
        assert listener.cuts.get("write") == 1
        writer.transport.resume_reading()
        with contextlib.suppress(ConnectionResetError):
            got = await asyncio.wait_for(reader.read(), 30)
            assert len(got) < len(big)  # cut: the answer never arrived whole
        close(writer)
    finally:
        await listener.close()


# -- the cap ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_churn_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The order of eviction is tested here with the log API's churn bound lifted; the bound
    itself is `test_an_address_not_proven_takes_places_at_a_bounded_rate`."""
    monkeypatch.setattr(admission, "CHURN_SHARE", 1000.0)


def test_an_address_not_proven_takes_places_at_a_bounded_rate() -> None:
    """On the log API a full cap gives way to an address not proven at most `churn` times a
    second (each place taken costs a TLS handshake); an address that proved itself (the
    apiserver's) always takes one; a plain listener has no such bound."""
    now = [0.0]
    guarded = admission.Admission[int](4, 8, guarded=True, churn=2.0, clock=lambda: now[0])
    for conn in range(4):
        assert guarded.admit(conn, "10.0.0.9").admitted
    assert [guarded.admit(c, "10.0.0.7").admitted for c in range(4, 8)] == [1, 1, 0, 0]
    now[0] += 1.0  # two more places
    assert guarded.admit(100, "10.0.0.1").admitted
    guarded.prove(100)
    # The proven address takes places whatever the rate; the other does not.
    assert all(guarded.admit(c, "10.0.0.1").admitted for c in range(101, 107))
    assert [guarded.admit(c, "10.0.0.7").admitted for c in range(200, 203)] == [1, 0, 0]
    plain = admission.Admission[int](4, 8)
    for conn in range(4):
        assert plain.admit(conn, "10.0.0.9").admitted
    assert all(plain.admit(conn, "10.0.0.7").admitted for conn in range(4, 40))


@pytest.fixture(params=sorted(LISTENERS))
async def patient(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    """A listener whose deadlines are long (10 s): a test of the cap closes its connections
    itself, and a closed one is closed by the cap, not by a deadline."""
    opener, path, tls = LISTENERS[request.param]
    port = free_port()
    long = {f"listener_{k}": 10.0 for k in ("header_timeout", "keepalive", "write_timeout")}
    listener = await opener(settings(tmp_path, metrics_port=port, logs_port=port, **long))
    assert listener is not None
    yield Served(listener, path, tls)
    await listener.close()


async def connect_from(port: int, source: str, tls: ssl.SSLContext | None = None) -> Streams:
    """A connection from `source` (an address of 127.0.0.0/8: all loopback on Linux)."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0), ssl=tls)


async def still_open(reader: asyncio.StreamReader) -> bool:
    """Whether the server keeps the connection open (whatever it sent before closing it)."""
    while True:
        try:
            got = await asyncio.wait_for(reader.read(65536), 0.1)
        except TimeoutError:
            return True
        except OSError:
            return False
        if not got:
            return False


async def until(condition: Callable[[], bool], within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


async def answers(served: Served, *, source: str = "127.0.0.1") -> int:
    """The status a new connection from `source` gets for the listener's path."""
    reader, writer = await connect_from(served.port, source, served.tls)
    writer.write(request(served.path, close=True))
    try:
        return await status_of(reader)
    finally:
        close(writer)


async def test_over_the_cap_the_oldest_unproven_connection_gives_way(patient: Served) -> None:
    """Silent connections (on the log API: handshakes not begun) hold the whole cap, yet a new
    connection is taken, in the place of the oldest of them; its slot then serves."""
    listener = patient.listener
    held = [await connect_from(patient.port, "127.0.0.2") for _ in range(CAP)]
    await until(lambda: listener.connections == CAP)
    assert listener.unproven == CAP
    newest = await connect_from(patient.port, "127.0.0.2")
    took, got = await closed_after(held[0][0], DEADLINE)  # the oldest, at once
    assert took < DEADLINE
    # Plain HTTP: told to come back (TLS: no handshake was spent on it).
    assert got.startswith(b"HTTP/1.1 503 ") if patient.tls is None else got == b""
    assert [await still_open(r) for r, _ in held[1:]] == [True] * (CAP - 1)
    assert await still_open(newest[0])
    assert listener.cuts == {"evicted": 1}
    assert listener.refused == 0
    assert await answers(patient) in (200, 401)  # and a client with a request is served
    assert listener.cuts == {"evicted": 2}
    assert await still_open(newest[0])  # the second oldest gave way for it, not the newest
    assert not await still_open(held[1][0])
    for _, writer in [*held, newest]:
        close(writer)


async def test_the_address_holding_the_most_gives_way_first(patient: Served) -> None:
    """The oldest unproven connection overall is not closed when another address holds more:
    the kubelet's or the scraper's one connection outlasts a pod's many."""
    listener = patient.listener
    lone = await connect_from(patient.port, "127.0.0.2")
    await until(lambda: listener.connections == 1)
    many = [await connect_from(patient.port, "127.0.0.3") for _ in range(CAP - 1)]
    await until(lambda: listener.connections == CAP)
    newcomer = await connect_from(patient.port, "127.0.0.4")
    await closed_after(many[0][0], DEADLINE)  # the oldest of the address holding three
    assert await still_open(lone[0])  # older, but its address holds only it
    assert [await still_open(r) for r, _ in many[1:]] == [True] * (CAP - 2)
    assert await still_open(newcomer[0])
    for _, writer in [lone, *many, newcomer]:
        close(writer)


async def test_one_address_holds_at_most_its_own_cap(tmp_path: Path) -> None:
    """SLURMJOB_LISTENER_MAX_PER_SOURCE: one more from an address at its cap is refused at
    once (503) and takes no other's place; another address is still taken."""
    s = settings(
        tmp_path, metrics_port=free_port(), listener_max_per_source=2, listener_header_timeout=10
    )
    listener = await serve_metrics(s, Metrics().registry, Limits.from_settings(s))
    assert listener is not None
    try:
        held = [await connect_from(listener.port, "127.0.0.2") for _ in range(2)]
        await until(lambda: listener.connections == 2)
        reader, writer = await connect_from(listener.port, "127.0.0.2")
        took, got = await closed_after(reader, DEADLINE)
        close(writer)
        assert got.startswith(b"HTTP/1.1 503 ")
        assert took < DEADLINE
        assert (listener.refusals, listener.cuts) == ({"source": 1}, {})
        assert [await still_open(r) for r, _ in held] == [True, True]
        other = await connect_from(listener.port, "127.0.0.3")
        await until(lambda: listener.connections == 3)
        assert await still_open(other[0])
        for _, w in [*held, other]:
            close(w)
    finally:
        await listener.close()


async def test_stalled_handshakes_count_against_their_address(tmp_path: Path) -> None:
    """The log API: connections in their TLS handshake are unproven and held to the address's
    cap; the front proxy's connections, once handshaken, are not counted."""
    port = free_port()
    s = settings(
        tmp_path,
        logs_port=port,
        listener_max_per_source=2,
        listener_max_connections=8,
        listener_header_timeout=10,
    )
    listener = await _logs(s)
    assert listener is not None
    try:
        proven = [await connect_from(port, "127.0.0.1", PROXY_CLIENT) for _ in range(3)]
        await until(lambda: listener.connections == 3 and listener.unproven == 0)
        stalled = [await connect_from(port, "127.0.0.1") for _ in range(2)]
        await until(lambda: listener.connections == 5)
        reader, writer = await connect_from(port, "127.0.0.1")
        _, got = await closed_after(reader, DEADLINE)  # closed before any handshake
        close(writer)
        assert got == b""
        assert listener.refusals == {"source": 1}
        assert [await still_open(r) for r, _ in stalled] == [True, True]
        for reader, writer in proven:  # each still serves
            writer.write(request(LISTENERS["logs"][1]))
            assert await status_of(reader) == 401  # no user named: the certificate passed
        for _, w in [*proven, *stalled]:
            close(w)
    finally:
        await listener.close()


async def test_a_proven_connection_is_never_closed_for_an_unproven_one(tmp_path: Path) -> None:
    """The log API's cap full of the front proxy's connections: a new one is closed at once,
    before any handshake; the proven ones serve on, and their slots come back when cut."""
    port = free_port()
    listener = await _logs(settings(tmp_path, logs_port=port))
    assert listener is not None
    try:
        held = [await connect_from(port, "127.0.0.1", PROXY_CLIENT) for _ in range(CAP)]
        await until(lambda: listener.connections == CAP and listener.unproven == 0)
        for _ in range(3):
            reader, writer = await connect_from(port, "127.0.0.2")
            took, got = await closed_after(reader, DEADLINE / 2)  # long before any deadline
            close(writer)
            assert (got, took < DEADLINE / 2) == (b"", True)
        assert listener.refusals == {"cap": 3}
        assert "evicted" not in listener.cuts
        for reader, writer in held:  # they are still cut at their own deadline...
            await closed_after(reader, DEADLINE + SLACK)
            close(writer)
        await until(lambda: listener.connections == 0)
        reader, writer = await connect_from(port, "127.0.0.2", PROXY_CLIENT)  # ...slots back
        writer.write(request(LISTENERS["logs"][1], close=True))
        assert await status_of(reader) == 401
        close(writer)
    finally:
        await listener.close()


async def test_a_proven_connection_outlasts_a_flood_of_unproven_ones(tmp_path: Path) -> None:
    """One front-proxy connection and a cap otherwise full of silent ones: the silent ones
    give way to each other, oldest first, and the proven one is never closed for them."""
    port = free_port()
    s = settings(tmp_path, logs_port=port, listener_header_timeout=10)
    listener = await _logs(s)
    assert listener is not None
    try:
        reader, writer = await connect_from(port, "127.0.0.1", PROXY_CLIENT)
        await until(lambda: listener.connections == 1 and listener.unproven == 0)
        silent = [await connect_from(port, "127.0.0.2") for _ in range(CAP * 3)]
        await until(lambda: listener.cuts.get("evicted") == 2 * CAP + 1)
        assert listener.connections == CAP
        states = [await still_open(r) for r, _ in silent]
        assert states == [False] * (2 * CAP + 1) + [True] * (CAP - 1)  # the newest stay
        writer.write(request(LISTENERS["logs"][1]))
        assert await status_of(reader) == 401  # no user named: it was never closed
        for _, w in [*silent, (reader, writer)]:
            close(w)
    finally:
        await listener.close()


# -- bytes per connection ----------------------------------------------------------------------


async def test_a_64_kib_header_is_refused(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(request(served.path, "X-Big: " + "a" * (64 * 1024)))
    took, got = await closed_after(reader, SLACK)
    close(writer)
    assert got.split(b" ")[1] in (b"400", b"431"), got[:60]
    assert took < SLACK


async def test_60_kib_of_small_headers_is_refused_before_the_parser_holds_them(
    served: Served,
) -> None:
    # Each field and their number within aiohttp's own bounds: only the head's total stops it.
    reader, writer = await served.connect()
    count = served.listener.limits.max_head_bytes // 1500 + 4
    assert count < served.listener.limits.max_headers
    headers = [f"X-H{i}: {'b' * 1500}" for i in range(count)]
    with contextlib.suppress(OSError):
        writer.write(request(served.path, *headers))
    _, got = await closed_after(reader, SLACK)
    close(writer)
    assert got.startswith(b"HTTP/1.1 431 "), got[:60]
    assert served.listener.cuts == {"head-bytes": 1}


async def test_a_request_body_is_refused_and_the_connection_closed(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(request(served.path, "Content-Length: 1000000")[:-2] + b"\r\n" + b"z" * 1000)
    assert await status_of(reader) == 413
    await closed_after(reader, SLACK)
    close(writer)
    assert served.listener.cuts.get("body") == 1


# -- /metrics ----------------------------------------------------------------------------------


@pytest.fixture
async def metrics_on(tmp_path: Path) -> AsyncIterator[tuple[Metrics, int]]:
    metrics = Metrics()
    port = free_port()
    s = settings(tmp_path, metrics_port=port)
    listener = await serve_metrics(s, metrics.registry, Limits.from_settings(s))
    assert listener is not None
    yield metrics, port
    await listener.close()


async def test_metrics_serve_the_registrys_exposition_text(
    metrics_on: tuple[Metrics, int],
) -> None:
    metrics, port = metrics_on
    metrics.count_submission("auth")
    metrics.leader.set(1)
    reader, writer = await connect(port)
    writer.write(request("/metrics", close=True))
    _, raw = await closed_after(reader, 5)
    close(writer)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"Content-Type: text/plain; version=" in head
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    submissions = families["slurmjob_operator_submissions"].samples
    assert {s.labels["result"]: s.value for s in submissions if s.name.endswith("_total")}[
        "auth"
    ] == 1.0
    assert families["slurmjob_operator_leader"].samples[0].value == 1.0
    assert "python_gc_objects_collected" not in families  # the operator's registry only


async def test_metrics_speak_openmetrics_when_asked_and_only_on_their_path(
    metrics_on: tuple[Metrics, int],
) -> None:
    _, port = metrics_on
    reader, writer = await connect(port)
    writer.write(request("/metrics", "Accept: application/openmetrics-text; version=1.0.0"))
    assert await status_of(reader) == 200
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"application/openmetrics-text" in head
    close(writer)
    reader, writer = await connect(port)
    writer.write(request("/", close=True))
    assert await status_of(reader) == 404
    close(writer)


async def test_a_scrape_flood_renders_the_registry_once_a_second(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    counted = Counter("renders", "renders", registry=registry)
    gauge = Gauge("g", "g", registry=registry)
    real_collect = registry.collect

    def collect() -> Any:
        counted.inc()
        return real_collect()

    registry.collect = collect  # type: ignore[method-assign]
    s = settings(tmp_path, metrics_port=free_port(), listener_max_connections=64)
    listener = await serve_metrics(s, registry, Limits.from_settings(s))
    assert listener is not None
    try:
        gauge.set(7)
        for _ in range(20):
            reader, writer = await connect(listener.port)
            writer.write(request("/metrics", close=True))
            _, raw = await closed_after(reader, 5)
            close(writer)
            assert b"g 7.0" in raw
        assert counted._value.get() <= 2  # type: ignore[attr-defined]
    finally:
        await listener.close()


async def test_no_thread_serves_a_connection(metrics_on: tuple[Metrics, int]) -> None:
    _, port = metrics_on
    before = threading.active_count()
    held = [await connect(port) for _ in range(CAP)]
    for _, writer in held:
        writer.write(b"GET /met")  # partial: each waits for the rest of its head
    await asyncio.sleep(0.1)
    assert threading.active_count() == before
    for _, writer in held:
        close(writer)


async def test_closing_a_listener_cuts_its_connections(tmp_path: Path) -> None:
    s = settings(tmp_path, metrics_port=free_port(), listener_header_timeout=60)
    listener = await serve_metrics(s, Metrics().registry, Limits.from_settings(s))
    assert listener is not None
    reader, writer = await connect(listener.port)
    await asyncio.sleep(0.05)
    await listener.close()
    took, _ = await closed_after(reader, SLACK)
    close(writer)
    assert took < SLACK
    with pytest.raises(ConnectionRefusedError):
        await connect(listener.port)
