"""The slurmrestd HTTP transport against a raw TCP server replaying byte-exact answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from slurmjob_operator.slurm import http
from slurmjob_operator.slurm.http import (
    ConnectError,
    ExchangeError,
    HttpResponse,
    HttpTransport,
)

from .raw_http import GET_404_2605, PING_CLOSE_2205, SUBMIT_422_2605, raw_server

SUBMIT = json.dumps({"job": {"partition": "nope"}}).encode()


async def fetch(
    url: str, method: str = "GET", *, body: bytes | None = None, seconds: float = 2.0
) -> HttpResponse:
    async with HttpTransport() as transport:
        return await transport.request(method, url, headers={}, body=body, timeout=seconds)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- slurmrestd's own answers ---------------------------------------------------------------


async def test_2605_double_error_response_returns_the_first() -> None:
    async with raw_server(SUBMIT_422_2605) as srv:
        resp = await fetch(srv.url + "/slurm/v0.0.45/job/submit", "POST", body=SUBMIT)
    assert resp.status == 422
    assert resp.reason == "UNPROCESSABLE CONTENT"
    assert resp.header("Content-Type") == "application/json"
    assert len(resp.body) == 715
    payload = json.loads(resp.body)
    assert payload["errors"][0]["error"] == "Invalid partition name specified"


async def test_2605_double_404_returns_the_json_one() -> None:
    async with raw_server(GET_404_2605) as srv:
        resp = await fetch(srv.url + "/slurm/v0.0.45/job/999999")
    assert resp.status == 404
    assert json.loads(resp.body)["errors"][0]["error_number"] == 2017


async def test_2205_stray_connection_close_after_body_is_ignored() -> None:
    async with raw_server(PING_CLOSE_2205) as srv:
        resp = await fetch(srv.url + "/slurm/v0.0.38/ping")
    assert resp.status == 200
    assert json.loads(resp.body)["pings"][0]["ping"] == "UP"


async def test_content_length_answer_does_not_wait_for_the_server_to_close() -> None:
    # slurmrestd keeps a connection open after a 200 when the request had no Connection header.
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    async with raw_server(reply, mode="keep") as srv:
        started = time.monotonic()
        resp = await fetch(srv.url + "/x", seconds=5)
    assert resp.body == b"{}"
    assert time.monotonic() - started < 2


# -- framing ----------------------------------------------------------------------------------


async def test_chunked_body_is_decoded_and_trailers_skipped() -> None:
    reply = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 999\r\n\r\n"
        b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
        b"HTTP/1.1 500 garbage after the answer\r\n\r\n"
    )
    async with raw_server(reply, mode="keep") as srv:
        resp = await fetch(srv.url + "/x")
    assert (resp.status, resp.body) == (200, b"hello world")


async def test_malformed_chunk_size_is_an_exchange_error() -> None:
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
    async with raw_server(reply) as srv:
        with pytest.raises(ExchangeError, match="chunk size"):
            await fetch(srv.url + "/x")


async def test_no_length_reads_to_eof() -> None:
    reply = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it\nuntil the end"
    async with raw_server(reply) as srv:
        resp = await fetch(srv.url + "/x")
    assert resp.body == b"all of it\nuntil the end"


@pytest.mark.parametrize(
    ("method", "reply"),
    [
        ("GET", b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"),
        ("DELETE", b"HTTP/1.1 204 No Content\r\n\r\n"),
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n"),
    ],
)
async def test_answers_without_body_return_at_once(method: str, reply: bytes) -> None:
    async with raw_server(reply, mode="keep") as srv:
        started = time.monotonic()
        resp = await fetch(srv.url + "/x", method, seconds=5)
    assert resp.body == b""
    assert time.monotonic() - started < 2


async def test_interim_100_continue_is_skipped() -> None:
    reply = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(reply) as srv:
        resp = await fetch(srv.url + "/x", "POST", body=b"{}")
    assert (resp.status, resp.body) == (201, b"ok")


async def test_headers_are_case_insensitive_and_repeats_joined() -> None:
    reply = b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n"
    async with raw_server(reply) as srv:
        resp = await fetch(srv.url + "/x")
    assert resp.header("X-A") == "1, 2"
    assert resp.headers["x-a"] == "1, 2"


async def test_answer_trickling_in_byte_by_byte_is_assembled() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for i in range(len(SUBMIT_422_2605)):
            writer.write(SUBMIT_422_2605[i : i + 1])
            await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        resp = await fetch(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/x", seconds=10)
    assert (resp.status, len(resp.body)) == (422, 715)


# -- broken answers ---------------------------------------------------------------------------


async def test_close_before_answering_is_an_exchange_error() -> None:
    async with raw_server(mode="drop") as srv:
        with pytest.raises(ExchangeError):
            await fetch(srv.url + "/x", "POST", body=SUBMIT)
        assert srv.requests  # the request was read before the drop


async def test_truncated_body_is_an_exchange_error() -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a little"
    async with raw_server(reply) as srv:
        with pytest.raises(ExchangeError, match="13 of 100"):
            await fetch(srv.url + "/x")


async def test_truncated_chunked_body_is_an_exchange_error() -> None:
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"
    async with raw_server(reply) as srv:
        with pytest.raises(ExchangeError, match="connection closed"):
            await fetch(srv.url + "/x")


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nx",
    ],
)
async def test_malformed_answers_are_exchange_errors(reply: bytes) -> None:
    async with raw_server(reply) as srv:
        with pytest.raises(ExchangeError):
            await fetch(srv.url + "/x")


async def test_never_answering_is_a_timeout() -> None:
    async with raw_server(mode="hang") as srv:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await fetch(srv.url + "/x", "POST", body=SUBMIT, seconds=0.3)
    assert time.monotonic() - started < 2


async def test_refused_port_is_a_connect_error() -> None:
    with pytest.raises(ConnectError):
        await fetch(f"http://127.0.0.1:{free_port()}/x")


async def test_unresolvable_host_is_a_connect_error() -> None:
    with pytest.raises(ConnectError):
        await fetch("http://no-such-host.invalid/x")


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "http:///x", "http://h:99999/x"])
async def test_bad_urls_are_connect_errors(url: str) -> None:
    with pytest.raises(ConnectError):
        await fetch(url)


async def test_waiting_for_a_slot_past_the_deadline_is_a_connect_error() -> None:
    async with raw_server(mode="hang") as srv, HttpTransport(max_connections=1) as t:
        busy = asyncio.create_task(t.request("GET", srv.url + "/a", headers={}, timeout=2))
        await asyncio.sleep(0.1)
        with pytest.raises(ConnectError, match="timed out"):
            await t.request("GET", srv.url + "/b", headers={}, timeout=0.2)
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy


async def test_max_connections_bounds_concurrency() -> None:
    async def slow(_: bytes) -> bytes:
        await asyncio.sleep(0.05)
        return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

    async with raw_server(slow) as srv, HttpTransport(max_connections=2) as t:
        await asyncio.gather(
            *(t.request("GET", f"{srv.url}/{i}", headers={}, timeout=5) for i in range(6))
        )
    assert len(srv.requests) == 6
    assert srv.peak == 2


async def test_closed_transport_refuses_requests() -> None:
    t = HttpTransport()
    await t.close()
    with pytest.raises(ConnectError, match="closed"):
        await t.request("GET", "http://127.0.0.1:1/", headers={}, timeout=1)


# -- limits -----------------------------------------------------------------------------------


async def test_too_many_headers() -> None:
    reply = b"HTTP/1.1 200 OK\r\n" + b"X-H: v\r\n" * 101 + b"Content-Length: 0\r\n\r\n"
    async with raw_server(reply) as srv:
        with pytest.raises(ExchangeError, match="more than 100"):
            await fetch(srv.url + "/x")


async def test_100_headers_are_fine() -> None:
    reply = b"HTTP/1.1 200 OK\r\n" + b"X-H: v\r\n" * 99 + b"Content-Length: 0\r\n\r\n"
    async with raw_server(reply) as srv:
        assert (await fetch(srv.url + "/x")).status == 200


@pytest.mark.parametrize(
    "headers",
    [
        b"X-Big: " + b"a" * (70 * 1024) + b"\r\n",  # one line over the limit
        b"".join(b"X-%d: " % i + b"a" * 1000 + b"\r\n" for i in range(70)),  # many lines
    ],
)
async def test_header_bytes_are_bounded(headers: bytes) -> None:
    reply = b"HTTP/1.1 200 OK\r\n" + headers + b"Content-Length: 0\r\n\r\n"
    async with raw_server(reply) as srv:
        with pytest.raises(ExchangeError, match=r"too long|exceed"):
            await fetch(srv.url + "/x")


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"200\r\n"
        + b"x" * 512
        + b"\r\n"
        + b"400\r\n"
        + b"x" * 1024
        + b"\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 2000,
    ],
    ids=["content-length", "chunked", "to-eof"],
)
async def test_body_size_is_bounded(reply: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "MAX_BODY_BYTES", 1000)
    async with raw_server(reply) as srv:
        with pytest.raises(ExchangeError, match="exceed"):
            await fetch(srv.url + "/x")


async def test_large_body_is_read_whole() -> None:
    body = bytes(range(256)) * 40_000  # 10 MB, beyond any stream buffer limit
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    async with raw_server(reply, mode="keep") as srv:
        resp = await fetch(srv.url + "/x", seconds=10)
    assert resp.body == body


# -- what is sent -----------------------------------------------------------------------------


async def test_request_bytes() -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    async with raw_server(reply) as srv, HttpTransport() as t:
        await t.request(
            "POST",
            srv.url + "/slurm/v0.0.45/job/a%2Fb?x=1",
            params=[("update_time", "17"), ("name", "a b&c")],
            headers={"X-SLURM-USER-NAME": "alice", "Content-Type": "application/json"},
            body=SUBMIT,
            timeout=2,
        )
        await t.request("GET", srv.url + "/slurm/v0.0.45/ping", headers={}, timeout=2)
    head, _, body = srv.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == ("POST /slurm/v0.0.45/job/a%2Fb?x=1&update_time=17&name=a%20b%26c HTTP/1.1")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields["Host"] == f"127.0.0.1:{srv.port}"
    assert fields["Content-Length"] == str(len(SUBMIT))
    assert fields["X-SLURM-USER-NAME"] == "alice"
    assert fields["Content-Type"] == "application/json"
    assert fields["Accept-Encoding"] == "identity"
    assert fields["User-Agent"].startswith("slurmjob-operator/")
    assert not any(name.lower() == "connection" for name in fields)
    assert body == SUBMIT
    get_head = srv.requests[1].decode()
    assert get_head.startswith("GET /slurm/v0.0.45/ping HTTP/1.1\r\n")
    assert "content-length" not in get_head.lower()
    assert "connection" not in get_head.lower()


async def test_caller_cannot_override_managed_headers() -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    async with raw_server(reply) as srv, HttpTransport() as t:
        await t.request(
            "GET",
            srv.url + "/",
            headers={"Connection": "close", "Host": "evil", "User-Agent": "mine"},
            timeout=2,
        )
    head = srv.requests[0].decode()
    assert "connection" not in head.lower()
    assert f"Host: 127.0.0.1:{srv.port}\r\n" in head
    assert "User-Agent: mine\r\n" in head


async def test_header_injection_is_refused_before_sending() -> None:
    async with raw_server() as srv:
        with pytest.raises(ConnectError, match="header"):
            async with HttpTransport() as t:
                await t.request("GET", srv.url, headers={"X-A": "1\r\nX-B: 2"}, timeout=2)
        assert not srv.requests


async def test_refused_header_value_is_not_quoted() -> None:
    # A token read from a file often ends in a newline; the token must not reach the logs.
    async with raw_server() as srv, HttpTransport() as t:
        with pytest.raises(ConnectError, match="X-SLURM-USER-TOKEN") as info:
            await t.request("GET", srv.url, headers={"X-SLURM-USER-TOKEN": "s3cr3t\n"}, timeout=2)
        assert not srv.requests
    assert info.value.__cause__ is None
    assert "s3cr3t" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "host", "target"),
    [
        ("http://example.org/p", "example.org", "/p"),
        ("http://example.org:80", "example.org", "/"),
        ("https://example.org:443/p?q=1", "example.org", "/p?q=1"),
        ("https://example.org:6820/p", "example.org:6820", "/p"),
        ("http://[::1]:6820/slurm", "[::1]:6820", "/slurm"),
        ("https://[fe80::1]/", "[fe80::1]", "/"),
        ("http://h/a b", "h", "/a%20b"),
    ],
)
def test_host_header_and_target(url: str, host: str, target: str) -> None:
    t = http._target(url, None)
    assert (t.host_header, t.request_target) == (host, target)


async def test_ipv6_literal() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    seen: list[bytes] = []
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nv6")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        done.set()

    try:
        server = await asyncio.start_server(handle, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = server.sockets[0].getsockname()[1]
    async with server:
        resp = await fetch(f"http://[::1]:{port}/x")
        await done.wait()
    assert resp.body == b"v6"
    assert f"Host: [::1]:{port}\r\n".encode() in seen[0]


# -- TLS --------------------------------------------------------------------------------------


async def test_tls_handshake_failure_is_a_connect_error() -> None:
    # A plain-HTTP server behind an https URL: the handshake fails, nothing was sent.
    reply = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    async with raw_server(reply, mode="greet") as srv, HttpTransport() as t:
        with pytest.raises(ConnectError) as info:
            await t.request("GET", f"https://127.0.0.1:{srv.port}/", headers={}, timeout=5)
    assert isinstance(info.value.__cause__, ssl.SSLError)


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_exchange(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)

    handlers: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(SUBMIT_422_2605)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client refusing the certificate
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/slurm/v0.0.45/job/submit"
    async with server:
        trusting = ssl.create_default_context(cafile=str(cert))
        async with HttpTransport(trusting) as t:
            resp = await t.request("POST", url, headers={}, body=SUBMIT, timeout=5)
        assert resp.status == 422
        async with HttpTransport() as t:  # default context: the self-signed cert is refused
            with pytest.raises(ConnectError):
                await t.request("POST", url, headers={}, body=SUBMIT, timeout=5)
        await asyncio.wait(handlers, timeout=5)
