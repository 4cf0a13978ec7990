"""Every port the operator listens on (the log endpoint, the health probe, /metrics) is held
to the same limits here, whoever connects: no credential is needed to open a connection, so a
connection may cost only what these limits allow.

* **Connections** (`admission`): at most `max_connections` at once per listener, and at most
  `max_per_source` unproven ones from one address. A connection is proven once it has shown
  a proof (the log API: a handshake with a client certificate that passes the front proxy's
  checks, told by the listener's `prove`); on the plain-HTTP listeners none is. One more
  from an address at its own cap is accepted and closed at once (a 503 written first), so
  none waits in the kernel's backlog. One more over the listener's cap closes the oldest
  unproven connection of the address holding the most unproven ones in its place (a 503
  written to it first on plain HTTP); only when every held connection is proven is the new
  one refused like the first. Connections still in their TLS handshake are unproven.
* **Request head**: the head of each request (its line and headers) must be complete within
  `header_timeout` seconds of its first byte (of the accept, for the first) and within
  `max_head_bytes`; a field is at most `max_field_size` bytes and a head has at most
  `max_headers` fields (aiohttp's parser). Over the deadline the connection is cut; over
  the bytes it gets a 431 and is cut.
* **Body**: no endpoint takes one. A request announcing one gets a 413 and the connection is
  closed (nothing is read or lingered over).
* **Keep-alive**: an idle connection is closed `keepalive` seconds after its last answer.
* **Answers left unread**: a connection whose answer the peer has not taken (writing paused)
  for `write_timeout` seconds is cut.
* **TLS** (a listener given a `tls` source: the log API): each accepted connection is
  handshaken with the context the source gives at that moment (a new certificate or CA takes
  effect for the next connection), inside the same deadline as the head (the handshake
  counts from the accept, its own timeout is `header_timeout` too); a connection refused is
  closed before any handshake, and a closing one waits for the peer's close_notify at most
  `write_timeout` seconds.

No thread serves any connection: /metrics is an asyncio handler over the operator's
registry like the others (`metrics_handler`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from slurmjob_operator.config import Settings
from slurmjob_operator.listeners.admission import Admission
from slurmjob_operator.listeners.connection import Guard

__all__ = [
    "HEAD_BYTES",
    "Limits",
    "Listener",
    "Prover",
    "metrics_handler",
    "serve_app",
    "serve_handler",
    "serve_metrics",
]

log = logging.getLogger(__name__)

#: Bytes of one request head: far above what a probe, a scraper (a bearer token included) or
#: the apiserver's proxy sends, and small enough that a full cap of slow heads is a few MiB.
HEAD_BYTES: Final = 16 * 1024
#: aiohttp's own default for one field and for the request line.
FIELD_BYTES: Final = 8190
MAX_HEADERS: Final = 64
#: The largest chunk aiohttp buffers of a body before it stops reading the socket.
READ_BUFFER: Final = 16 * 1024

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
#: The TLS context for the next connection; None when there is none (the connection is cut).
TlsSource = Callable[[], "ssl.SSLContext | None"]
#: Whether a handshaken connection proved itself (the log API: the front proxy's certificate).
Prover = Callable[[asyncio.BaseTransport], bool]


@dataclass(frozen=True)
class Limits:
    """What one connection may cost a listener (see the module's docstring)."""

    header_timeout: float
    keepalive: float
    write_timeout: float
    max_connections: int
    #: Unproven connections from one address (`admission`); the setting's default.
    max_per_source: int = 8
    max_head_bytes: int = HEAD_BYTES
    max_field_size: int = FIELD_BYTES
    max_headers: int = MAX_HEADERS

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            header_timeout=settings.listener_header_timeout,
            keepalive=settings.listener_keepalive,
            write_timeout=settings.listener_write_timeout,
            max_connections=settings.listener_max_connections,
            max_per_source=settings.listener_max_per_source,
        )

    def with_fields(self, field_size: int, head_bytes: int) -> Limits:
        """The same limits for a listener whose requests carry a larger field."""
        return replace(self, max_field_size=field_size, max_head_bytes=head_bytes)

    def handler_args(self) -> dict[str, Any]:
        """aiohttp's own knobs (`RequestHandler`) for these limits."""
        return {
            "keepalive_timeout": self.keepalive,
            "max_line_size": self.max_field_size,
            "max_field_size": self.max_field_size,
            "max_headers": self.max_headers,
            # A body left unread closes the connection at once instead of being drained.
            "lingering_time": 0,
            "read_bufsize": READ_BUFFER,
        }


class Listener:
    """One listening socket under `Limits`, serving an aiohttp `web.Server` (an application's
    or a bare handler's). Made by `serve_app` and `serve_handler`; `close` ends it. `prove`
    (TLS only) tells whether a handshaken connection proved itself."""

    def __init__(
        self,
        name: str,
        limits: Limits,
        server: web.Server,
        tls: TlsSource | None = None,
        prove: Prover | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.tls = tls
        self.prove = prove
        self.handshakes: set[asyncio.Task[None]] = set()
        self._server = server
        self._guards: dict[object, Guard] = {}  # by aiohttp's protocol of the connection
        self._open: Admission[Guard] = Admission(
            limits.max_connections, limits.max_per_source, guarded=tls is not None
        )
        self._socket_server: asyncio.Server | None = None
        self._port = 0
        self._cleanup: Callable[[], Awaitable[None]] | None = None
        self.refused = 0
        self.refusals: dict[str, int] = {}  # by why: "cap" or "source"
        self.cuts: dict[str, int] = {}
        self._last_warning = 0.0
        handler = server.request_handler
        # Read by each connection's protocol when it is made: set before the first accept.
        server.request_handler = self._wrap(handler)

    @property
    def connections(self) -> int:
        return len(self._open)

    @property
    def unproven(self) -> int:
        return self._open.unproven

    def is_proven(self, guard: Guard) -> bool:
        return self._open.is_proven(guard)

    @property
    def port(self) -> int:
        """The port it listens on (the one the system chose for port 0)."""
        return self._port

    def _wrap(self, handler: Handler) -> Handler:
        async def guarded(request: web.BaseRequest) -> web.StreamResponse:
            guard = self._guards.get(request.protocol)
            if guard is not None:
                guard.request_started()
            try:
                if request.content_length or "Transfer-Encoding" in request.headers:
                    self.count_cut("body")
                    refusal = web.Response(status=413, text="no request body is taken\n")
                    refusal.force_close()
                    return refusal
                return await handler(request)
            finally:
                if guard is not None:
                    guard.request_ended()

        return guarded

    def _protocol(self) -> asyncio.Protocol:
        return Guard(self)

    def admit(self, guard: Guard, source: str) -> bool:
        """Whether `guard`'s connection from `source` is held (`admission`); a connection it
        takes the place of is closed."""
        decision = self._open.admit(guard, source)
        if not decision.admitted:
            self.refused += 1
            self.refusals[decision.reason] = self.refusals.get(decision.reason, 0) + 1
            if decision.reason == "source":
                self._warn(
                    "refused a connection over the cap of %d from one address",
                    self.limits.max_per_source,
                )
            else:
                self._warn(
                    "refused a connection over the cap of %d (every one proven)",
                    self.limits.max_connections,
                )
            return False
        if decision.victim is not None:
            decision.victim.evict()
        return True

    def connect(self, guard: Guard) -> asyncio.Protocol:
        """aiohttp's protocol for an admitted connection."""
        inner = self._server()
        self._guards[inner] = guard
        return inner

    def handshaken(self, guard: Guard, transport: asyncio.BaseTransport) -> None:
        """Its TLS handshake ended: proven if `prove` says so."""
        if self.prove is not None and self.prove(transport):
            self._open.prove(guard)

    def release(self, guard: Guard) -> None:
        self._open.discard(guard)
        if guard.inner is not None:
            self._guards.pop(guard.inner, None)

    def count_cut(self, why: str) -> None:
        self.cuts[why] = self.cuts.get(why, 0) + 1
        self._warn("cut a connection (%s)", why)

    def _warn(self, message: str, *args: object) -> None:
        # One line a minute at most: the log must not grow with an attack.
        now = time.monotonic()
        if now - self._last_warning >= 60:
            self._last_warning = now
            log.warning(
                "%s listener: " + message + " (refused %s so far, cut %s)",
                self.name,
                *args,
                self.refusals,
                self.cuts,
            )

    async def start(self, host: str, port: int, cleanup: Callable[[], Awaitable[None]]) -> None:
        self._cleanup = cleanup
        loop = asyncio.get_running_loop()
        self._socket_server = await loop.create_server(
            self._protocol, host, port, reuse_address=True, backlog=128
        )
        self._port = int(self._socket_server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, cut every open connection and clean the aiohttp side up."""
        if self._socket_server is not None:
            self._socket_server.close()
        for guard in list(self._open):
            guard.abort()
        for task in list(self.handshakes):
            task.cancel()
        if self._socket_server is not None:
            await self._socket_server.wait_closed()
        if self._cleanup is not None:
            await self._cleanup()
            self._cleanup = None


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    limits: Limits,
    *,
    name: str,
    tls: TlsSource | None = None,
    prove: Prover | None = None,
) -> Listener:
    """Serve an aiohttp application on host:port under `limits` (over TLS with the context
    `tls` gives for each connection, when given; `prove` tells a proven connection)."""
    runner = web.AppRunner(app, access_log=None, **limits.handler_args())
    await runner.setup()
    assert runner.server is not None
    listener = Listener(name, limits, runner.server, tls, prove)
    try:
        await listener.start(host, port, runner.cleanup)
    except BaseException:
        await runner.cleanup()
        raise
    return listener


async def serve_handler(
    handler: Handler, host: str, port: int, limits: Limits, *, name: str
) -> Listener:
    """Serve one request handler (no application: no router, no middleware) under `limits`."""
    server = web.Server(handler, access_log=None, **limits.handler_args())

    async def cleanup() -> None:
        await server.shutdown(1.0)

    listener = Listener(name, limits, server)
    await listener.start(host, port, cleanup)
    return listener


#: Seconds one rendering of the registry is served again: a flood of scrapes costs one
#: rendering a second, not one each.
EXPOSITION_TTL: Final = 1.0


def metrics_handler(
    registry: CollectorRegistry, *, clock: Callable[[], float] = time.monotonic
) -> Handler:
    """`GET /metrics`: the registry in the format the scraper's Accept asks for (Prometheus
    text or OpenMetrics, as prometheus_client's own server chooses)."""
    cache: dict[str, tuple[float, bytes]] = {}

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.path != "/metrics":
            return web.Response(status=404, text="only /metrics is served here\n")
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"})
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        now = clock()
        made, body = cache.get(content_type, (float("-inf"), b""))
        if now - made >= EXPOSITION_TTL:
            body = encode(registry)
            cache[content_type] = (now, body)
        return web.Response(body=body, headers={"Content-Type": content_type})

    return handle


async def serve_metrics(
    settings: Settings, registry: CollectorRegistry, limits: Limits
) -> Listener | None:
    """/metrics on `SLURMJOB_METRICS_ADDRESS:SLURMJOB_METRICS_PORT`; None when the port is 0."""
    if not settings.metrics_port:
        return None
    listener = await serve_handler(
        metrics_handler(registry),
        settings.metrics_address,
        settings.metrics_port,
        limits,
        name="metrics",
    )
    log.info("serving /metrics on %s:%s", settings.metrics_address, settings.metrics_port)
    return listener
