"""A minimal HTTP/1.1 client for slurmrestd: one request per connection, one response read.

Why not a general-purpose client: slurmrestd writes responses that a strict HTTP parser (such
as aiohttp 3.14's) refuses, and the valid answer is lost with them:

- Slurm 26.05 (seen on 26.05.5) answers every error (4xx/5xx, e.g. a 422 for an invalid
  partition, a 404 for an unknown job id or an unserved `/slurmdb/` path) with two complete
  responses back to back on the same connection: the real one with the JSON `errors[]`, then
  a second one with the same status and a `text/plain` body carrying the error text.
- Slurm 22.05 (seen on 22.05.8), and 26.05 too, answer a request carrying `Connection: close`
  with a valid response followed by a stray `Connection: Close` line after the body.

So this transport sends no `Connection` header (HTTP/1.1 keep-alive is the default, and
harmless because we close the socket ourselves), reads exactly one response (framed by
`Transfer-Encoding: chunked`, `Content-Length`, or the end of the connection), ignores anything
the server writes after it and closes the connection. Connections are never reused, which is
what slurmrestd needs anyway: releases before 25.11 do not honour keep-alive reliably. The bytes
are written and parsed by h11, as strict as any parser but sans-I/O: it parses only what it is
asked for, and it is never asked past the first response's end.

Failures say how far the request got, because a submit that may have been processed must not
be repeated blindly:

- `ConnectError`: the request was not sent (bad URL, DNS failure, refused, connect timeout,
  TLS handshake failure, no free connection slot in time).
- `ExchangeError`: the request was (partly) written and then the connection broke or the answer
  was malformed, truncated or too large. The server may have processed the request.
- `TimeoutError`: the deadline passed after the request started being written; same meaning.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import quote, urlencode, urlsplit

import h11

from slurmjob_operator import __version__

MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024 * 1024
USER_AGENT = f"slurmjob-operator/{__version__}"

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Headers the transport writes itself; a caller's value for these is dropped.
_MANAGED = frozenset({"host", "content-length", "transfer-encoding", "connection"})
# Characters left alone in a request path: RFC 3986 pchar, "/" and "%" (existing escapes).
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_READ_SIZE = 64 * 1024
# How long a graceful close may wait: TLS sends close_notify and waits for the peer's answer
# or EOF; a peer that gives neither must not hold up an answer already read.
_CLOSE_TIMEOUT = 0.5


class HttpError(Exception):
    """Base of the transport's failures."""


class ConnectError(HttpError):
    """Nothing was sent: the request cannot have been processed."""


class ExchangeError(HttpError):
    """The request started being written, then no complete, well-formed answer came back."""


@dataclass(frozen=True)
class HttpResponse:
    """One response. `headers` has lower-case names; repeated headers are joined with ", "."""

    status: int
    reason: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str, default: str | None = None) -> str | None:
        """A header's value by case-insensitive name."""
        return self.headers.get(name.lower(), default)


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str  # as passed to connect: no brackets, IDNA-encoded
    port: int
    host_header: str
    request_target: str


def _target(url: str, params: Sequence[tuple[str, str]] | None) -> _Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConnectError(f"invalid URL {url!r}: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ConnectError(f"invalid URL {url!r}: only http and https are supported")
    host = parts.hostname
    if not host:
        raise ConnectError(f"invalid URL {url!r}: no host")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ConnectError(f"invalid URL {url!r}: bad host name") from exc
    if port is None:
        port = _DEFAULT_PORTS[scheme]
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == _DEFAULT_PORTS[scheme] else f"{shown}:{port}"
    target = quote(parts.path or "/", safe=_PATH_SAFE)
    query = parts.query
    if params:
        extra = urlencode(list(params), quote_via=quote)
        query = f"{query}&{extra}" if query else extra
    if query:
        target += "?" + query
    return _Target(scheme, host, port, host_header, target)


def _header_fields(
    method: str, target: _Target, headers: Mapping[str, str], body: bytes | None
) -> list[tuple[str, str]]:
    fields = [("Host", target.host_header)]
    given = {name.lower() for name in headers}
    own = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    fields += [(name, value) for name, value in own.items() if name.lower() not in given]
    # h11 refuses surrounding whitespace, which is not part of a value anyway.
    fields += [
        (name, value.strip(" \t"))
        for name, value in headers.items()
        if name.lower() not in _MANAGED
    ]
    if body is not None:
        fields.append(("Content-Length", str(len(body))))
    elif method in ("POST", "PUT", "PATCH"):
        fields.append(("Content-Length", "0"))
    return fields


def _refused(method: str, target: str, fields: list[tuple[bytes, bytes]]) -> ConnectError:
    # h11's message quotes the offending value, and a header value may be the JWT: name the
    # header instead. A Response checks header fields as a Request does, minus the Host rule.
    for name, value in fields:
        try:
            h11.Response(status_code=200, headers=[(name, value)])
        except h11.LocalProtocolError:
            return ConnectError(f"invalid HTTP header {name.decode('latin-1')!r}")
    return ConnectError(f"invalid HTTP method or target: {method!r} {target!r}")


def _start(
    method: str, target: _Target, headers: Mapping[str, str], body: bytes | None
) -> tuple[h11.Connection, bytes]:
    """The exchange's protocol state and the request's bytes."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
    try:
        fields = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in _header_fields(method, target, headers, body)
        ]
        request = h11.Request(method=method, target=target.request_target, headers=fields)
    except UnicodeEncodeError as exc:
        raise ConnectError(f"request not encodable: {exc}") from exc
    except h11.LocalProtocolError:
        raise _refused(method, target.request_target, fields) from None
    data = conn.send(request)
    if body:
        data += conn.send(h11.Data(data=body))
    return conn, data + conn.send(h11.EndOfMessage())


# -- response reading ---------------------------------------------------------------------


def _check_head(event: h11.InformationalResponse | h11.Response) -> None:
    # h11 has no header count limit, and bounds its buffer only while a head is incomplete:
    # a head that arrives in one read may be larger.
    if len(event.headers) > MAX_HEADERS:
        raise ExchangeError(f"more than {MAX_HEADERS} response headers")
    if sum(len(name) + len(value) + 4 for name, value in event.headers) > MAX_HEADER_BYTES:
        raise ExchangeError(f"response headers exceed {MAX_HEADER_BYTES} bytes")


def _broken(
    exc: h11.RemoteProtocolError, head: h11.Response | None, received: int, closed: bool
) -> ExchangeError:
    """Where the answer broke off (h11's messages do not say)."""
    if head is None:
        if closed:
            return ExchangeError("connection closed before a complete response head")
        return ExchangeError(f"invalid response head: {exc}")
    if not closed:  # only a chunked body has a syntax to get wrong
        return ExchangeError(f"malformed chunked body (chunk size, chunk end or trailer): {exc}")
    fields = dict(head.headers)
    length = fields.get(b"content-length")
    if length is None or b"transfer-encoding" in fields:
        return ExchangeError("connection closed in the middle of the response body")
    return ExchangeError(
        f"connection closed in the response body: got {received} of {int(length)} bytes"
    )


async def _read_response(reader: asyncio.StreamReader, conn: h11.Connection) -> HttpResponse:
    """The first response only: what follows it is never parsed (see the module docstring)."""
    head: h11.Response | None = None
    body = bytearray()
    closed = False
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise _broken(exc, head, len(body), closed) from exc
        if event is h11.NEED_DATA:
            data = await reader.read(_READ_SIZE)
            closed = not data
            conn.receive_data(data)  # b"" tells h11 the connection closed
        elif isinstance(event, h11.InformationalResponse):  # 100 Continue, 103 Early Hints
            _check_head(event)
        elif isinstance(event, h11.Response):
            _check_head(event)
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                raise ExchangeError(f"response body exceeds {MAX_BODY_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None  # h11 yields the Response first
            headers: dict[str, str] = {}
            for raw_name, raw_value in head.headers:
                name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            reason = head.reason.decode("latin-1")
            return HttpResponse(head.status_code, reason, headers, bytes(body))
        else:  # PAUSED or ConnectionClosed: h11 gives neither before the response's end
            raise ExchangeError(f"unexpected HTTP event {event!r}")


async def _close(writer: asyncio.StreamWriter, *, graceful: bool) -> None:
    """Close the connection and wait for it; errors while closing do not matter any more."""
    if graceful:
        writer.close()
    else:
        writer.transport.abort()
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        writer.transport.abort()


class HttpTransport:
    """Sends requests, each on a fresh connection, at most `max_connections` at a time.

    `ssl` is the TLS context for https URLs (None: the default verifying context); it is not
    used for http URLs. `close()` refuses new requests; those in flight run to their end.
    """

    def __init__(
        self, ssl: ssl_module.SSLContext | None = None, *, max_connections: int = 32
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._ssl = ssl
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> HttpTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _tls(self, scheme: str) -> ssl_module.SSLContext | None:
        if scheme != "https":
            return None
        return self._ssl if self._ssl is not None else ssl_module.create_default_context()

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Sequence[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: float,  # noqa: ASYNC109 - the deadline's phase decides the error raised
    ) -> HttpResponse:
        """One exchange within `timeout` seconds overall (waiting for a slot, connecting,
        sending, reading). See the module docstring for what each failure means."""
        if self._closed:
            raise ConnectError("HTTP transport is closed")
        target = _target(url, params)
        conn, data = _start(method.upper(), target, headers or {}, body)
        tls = self._tls(target.scheme)
        where = target.host_header
        phase = "connect"
        writer: asyncio.StreamWriter | None = None
        graceful = False
        try:
            async with asyncio.timeout(timeout):
                async with self._slots:
                    try:
                        reader, writer = await asyncio.open_connection(
                            target.host, target.port, ssl=tls
                        )
                    except OSError as exc:  # refused, unreachable, DNS (gaierror), TLS
                        raise ConnectError(f"cannot connect to {where}: {exc}") from exc
                    phase = "exchange"
                    try:
                        writer.write(data)
                        await writer.drain()
                        response = await _read_response(reader, conn)
                    except OSError as exc:  # reset, broken pipe, TLS failure mid-stream
                        raise ExchangeError(f"connection to {where} failed: {exc!r}") from exc
                    graceful = True
                    return response
        except TimeoutError as exc:
            if phase == "connect":
                raise ConnectError(f"cannot connect to {where}: timed out") from exc
            raise TimeoutError(f"no complete answer from {where} within {timeout}s") from exc
        finally:
            if writer is not None:
                await _close(writer, graceful=graceful)
