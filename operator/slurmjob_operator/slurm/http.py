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
what slurmrestd needs anyway: releases before 25.11 do not honour keep-alive reliably.

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
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import quote, urlencode, urlsplit

from slurmjob_operator import __version__

MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024 * 1024
USER_AGENT = f"slurmjob-operator/{__version__}"

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Headers the transport writes itself; a caller's value for these is dropped.
_MANAGED = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")
# Characters left alone in a request path: RFC 3986 pchar, "/" and "%" (existing escapes).
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_CHUNK_LINE_LIMIT = 4096
_MAX_TRAILERS = MAX_HEADERS
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


def _valid_token(text: str) -> bool:
    return bool(text) and all(c in _TOKEN_CHARS for c in text)


def _request_bytes(
    method: str, target: _Target, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    if not _valid_token(method):
        raise ConnectError(f"invalid HTTP method {method!r}")
    lines = [f"{method} {target.request_target} HTTP/1.1", f"Host: {target.host_header}"]
    own = {"user-agent": USER_AGENT, "accept-encoding": "identity"}
    given = {name.lower() for name in headers}
    lines += [f"{name.title()}: {value}" for name, value in own.items() if name not in given]
    for name, value in headers.items():
        if name.lower() in _MANAGED:
            continue
        if not _valid_token(name) or any(c in value for c in "\r\n\0"):
            raise ConnectError(f"invalid HTTP header {name!r}")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    elif method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Length: 0")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ConnectError(f"request header not encodable: {exc}") from exc
    return head + body if body else head


# -- response parsing ---------------------------------------------------------------------


async def _read_line(reader: asyncio.StreamReader, limit: int, what: str) -> bytes:
    """One line without its line ending (CRLF or bare LF), at most `limit` bytes long."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise ExchangeError(f"connection closed while reading the {what}") from exc
        raise ExchangeError(f"connection closed in the middle of the {what}") from exc
    except asyncio.LimitOverrunError as exc:
        raise ExchangeError(f"{what} too long") from exc
    if len(line) > limit:
        raise ExchangeError(f"{what} too long")
    return line.rstrip(b"\r\n")


async def _read_head(
    reader: asyncio.StreamReader,
) -> tuple[int, str, dict[str, str]]:
    """Status line and headers, bounded by MAX_HEADERS and MAX_HEADER_BYTES."""
    used = 0
    status_line = await _read_line(reader, MAX_HEADER_BYTES, "status line")
    used += len(status_line)
    version, _, rest = status_line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if (
        version not in (b"HTTP/1.1", b"HTTP/1.0")
        or len(code) != 3
        or not code.isdigit()
        or code.startswith(b"0")
    ):
        raise ExchangeError(f"malformed status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    count = 0
    last: str | None = None
    while True:
        line = await _read_line(reader, MAX_HEADER_BYTES, "response header")
        used += len(line) + 2
        if used > MAX_HEADER_BYTES:
            raise ExchangeError(f"response headers exceed {MAX_HEADER_BYTES} bytes")
        if not line:
            break
        text = line.decode("latin-1")
        if text[0] in " \t":  # obsolete line folding: continues the previous header
            if last is None:
                raise ExchangeError("malformed response header: continuation first")
            headers[last] = f"{headers[last]} {text.strip()}"
            continue
        count += 1
        if count > MAX_HEADERS:
            raise ExchangeError(f"more than {MAX_HEADERS} response headers")
        name, sep, value = text.partition(":")
        if not sep or not _valid_token(name):
            raise ExchangeError(f"malformed response header {text[:80]!r}")
        last = name.lower()
        value = value.strip(" \t")
        headers[last] = f"{headers[last]}, {value}" if last in headers else value
    return int(code), reason.decode("latin-1").strip(), headers


def _content_length(headers: Mapping[str, str]) -> int | None:
    raw = headers.get("content-length")
    if raw is None:
        return None
    values = {v.strip() for v in raw.split(",")}
    if len(values) != 1:
        raise ExchangeError(f"conflicting Content-Length {raw!r}")
    value = values.pop()
    if not value.isdigit() or not value.isascii():
        raise ExchangeError(f"malformed Content-Length {raw!r}")
    length = int(value)
    if length > MAX_BODY_BYTES:
        raise ExchangeError(f"response body of {length} bytes exceeds {MAX_BODY_BYTES}")
    return length


def _is_chunked(headers: Mapping[str, str]) -> bool | None:
    """True: chunked; False: another transfer coding (read to EOF); None: no such header."""
    raw = headers.get("transfer-encoding")
    if raw is None:
        return None
    codings = [c.strip().lower() for c in raw.split(",") if c.strip()]
    return bool(codings) and codings[-1] == "chunked"


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        line = await _read_line(reader, _CHUNK_LINE_LIMIT, "chunk size")
        size_text = line.split(b";", 1)[0].strip().decode("latin-1")
        if not size_text or any(c not in string.hexdigits for c in size_text):
            raise ExchangeError(f"malformed chunk size {line[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(body) + size > MAX_BODY_BYTES:
            raise ExchangeError(f"chunked response body exceeds {MAX_BODY_BYTES} bytes")
        body += await _read_exactly(reader, size, "chunk")
        if await _read_line(reader, _CHUNK_LINE_LIMIT, "chunk end"):
            raise ExchangeError("chunk not followed by a line ending")
    for _ in range(_MAX_TRAILERS + 1):
        if not await _read_line(reader, MAX_HEADER_BYTES, "trailer"):
            return bytes(body)
    raise ExchangeError(f"more than {_MAX_TRAILERS} trailer lines")


async def _read_exactly(reader: asyncio.StreamReader, size: int, what: str) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise ExchangeError(
            f"connection closed in the {what}: got {len(exc.partial)} of {size} bytes"
        ) from exc


async def _read_to_eof(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while chunk := await reader.read(256 * 1024):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ExchangeError(f"response body exceeds {MAX_BODY_BYTES} bytes")
    return bytes(body)


async def _read_response(reader: asyncio.StreamReader, method: str) -> HttpResponse:
    while True:
        status, reason, headers = await _read_head(reader)
        # Interim answers (100 Continue, 103 Early Hints) precede the real one.
        if not (100 <= status < 200 and status != 101):
            break
    if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
        body = b""
    else:
        chunked = _is_chunked(headers)
        if chunked:
            body = await _read_chunked(reader)
        elif chunked is False:
            body = await _read_to_eof(reader)
        else:
            length = _content_length(headers)
            if length is None:
                body = await _read_to_eof(reader)
            else:
                body = await _read_exactly(reader, length, "response body")
    return HttpResponse(status=status, reason=reason, headers=headers, body=body)


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
        data = _request_bytes(method.upper(), target, headers or {}, body)
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
                            target.host,
                            target.port,
                            ssl=tls,
                            limit=MAX_HEADER_BYTES + 1024,
                        )
                    except OSError as exc:  # refused, unreachable, DNS (gaierror), TLS
                        raise ConnectError(f"cannot connect to {where}: {exc}") from exc
                    phase = "exchange"
                    try:
                        writer.write(data)
                        await writer.drain()
                        response = await _read_response(reader, method.upper())
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
