"""One accepted connection of a `Listener` (the limits are in the package's docstring):
`Guard` asks the listener to admit it (`admission`), then holds aiohttp's protocol inside the
limits, TLS included; one refused is answered 503 (plain HTTP) and closed at once.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Final, Protocol


class _Limits(Protocol):
    """The limits a connection is held to (the package's `Limits`)."""

    @property
    def header_timeout(self) -> float: ...

    @property
    def keepalive(self) -> float: ...

    @property
    def write_timeout(self) -> float: ...

    @property
    def max_head_bytes(self) -> int: ...


class Host(Protocol):
    """What a connection asks of its listener (the package's `Listener`), named here so that
    this module needs nothing from the package that imports it."""

    @property
    def limits(self) -> _Limits: ...

    @property
    def tls(self) -> Callable[[], ssl.SSLContext | None] | None: ...

    @property
    def handshakes(self) -> set[asyncio.Task[None]]: ...

    def admit(self, guard: Guard, source: str) -> bool: ...

    def connect(self, guard: Guard) -> asyncio.Protocol: ...

    def handshaken(self, guard: Guard, transport: asyncio.BaseTransport) -> None: ...

    def release(self, guard: Guard) -> None: ...

    def count_cut(self, why: str) -> None: ...


_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Connection: close\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n"
)
_HEAD_TOO_LARGE: Final = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Connection: close\r\nContent-Length: 0\r\n\r\n"
)


def source_of(transport: asyncio.BaseTransport) -> str:
    """The peer's address (an IPv4-mapped IPv6 one as IPv4); "" when there is none."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        host = str(peer[0])
        return host.removeprefix("::ffff:") if "." in host else host
    return ""


def refuse(transport: asyncio.Transport, answer: bool) -> None:
    """A 503 (plain HTTP only: no handshake is spent on a refused connection), then closed
    before anything more of it is read."""
    if answer:
        transport.write(_REFUSED)  # sent at once: the socket's buffer is empty
    # abort, not close: a peer that never reads must not keep the socket alive.
    transport.abort()


class Guard(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol inside, the limits around it. It sees every
    byte before aiohttp does and is told by the listener when a request starts and ends.
    aiohttp's protocol is made only once the listener has admitted the connection."""

    def __init__(self, listener: Host) -> None:
        self._listener = listener
        self.inner: asyncio.Protocol | None = None
        self._inner_connected = False
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        # TLS: what arrives between the handshake's end and aiohttp's protocol being told of
        # the connection (asyncio hands data on before `start_tls` returns).
        self._early: list[bytes] | None = None
        self._early_bytes = 0
        self._waiting = True  # for a request head (not handling a request)
        self._head_bytes = 0
        self._released = False
        self._closing = False  # aborted: whatever still arrives is dropped
        self._head_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    # -- timers ---------------------------------------------------------------------------

    def _arm_head(self) -> None:
        self._head_timer = self._loop.call_later(
            self._listener.limits.header_timeout, self.cut, "header"
        )

    def _cancel(self, *timers: asyncio.TimerHandle | None) -> None:
        for timer in timers:
            if timer is not None:
                timer.cancel()

    def cut(self, why: str) -> None:
        self._listener.count_cut(why)
        self.abort()

    def abort(self) -> None:
        self._closing = True
        if self._transport is None:
            # Never connected (the transport failed while being made): free the slot only.
            self._release()
            return
        self._transport.abort()

    def evict(self) -> None:
        """Closed for a new connection (the listener no longer holds it): a 503 first on
        plain HTTP when no answer is under way, so a client knows to come back."""
        self._listener.count_cut("evicted")
        transport = self._transport
        if self._listener.tls is None and self._waiting and transport is not None:
            transport.write(_REFUSED)  # sent at once: no answer is waiting in the buffer
        self.abort()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._cancel(self._head_timer, self._idle_timer, self._write_timer)
            self._listener.release(self)

    # -- what the listener tells it ---------------------------------------------------------

    def request_started(self) -> None:
        self._waiting = False
        self._head_bytes = 0
        self._cancel(self._head_timer, self._idle_timer)
        self._head_timer = self._idle_timer = None

    def request_ended(self) -> None:
        self._waiting = True
        if self._transport is not None and not self._released:
            self._idle_timer = self._loop.call_later(
                self._listener.limits.keepalive, self._idle_expired
            )

    def _idle_expired(self) -> None:
        # The answer may still be going out; the write deadline watches that.
        if self._waiting and self._head_timer is None and self._write_timer is None:
            self.cut("keepalive")

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if not self._listener.admit(self, source_of(transport)):
            self._released = self._closing = True  # never held
            refuse(transport, answer=self._listener.tls is None)
            return
        self._transport = transport
        self.inner = self._listener.connect(self)
        # From the accept: a connection that never sends a byte is cut at the same deadline.
        self._arm_head()
        tls = self._listener.tls
        if tls is None:
            self._connect_inner(transport)
            return
        context = tls()
        if context is None:
            self.cut("tls")
            return
        self._early = []
        task = self._loop.create_task(self._handshake(transport, context))
        self._listener.handshakes.add(task)
        task.add_done_callback(self._listener.handshakes.discard)

    async def _handshake(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        limits = self._listener.limits
        try:
            secured = await self._loop.start_tls(
                transport,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=limits.header_timeout,
                ssl_shutdown_timeout=limits.write_timeout,
            )
        except Exception:  # an SSLError or OSError, mostly
            # Refused (no certificate of the CA, not TLS at all) or cut: asyncio closed it.
            if not self._closing:
                self._listener.count_cut("handshake")
            self._release()
            return
        if secured is None or self._released or self._closing:
            if secured is not None:
                secured.abort()
            self._release()
            return
        assert isinstance(secured, asyncio.Transport)
        self._transport = secured
        self._listener.handshaken(self, secured)
        early, self._early = self._early or [], None
        self._connect_inner(secured)
        for data in early:  # under the same limits as any other bytes
            self.data_received(data)

    def _connect_inner(self, transport: asyncio.Transport) -> None:
        assert self.inner is not None
        self._inner_connected = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._released or self._closing:
            return
        if self._early is not None:
            # Handed on once aiohttp is connected; more than a head is never kept, since the
            # head's limit refuses the connection then anyway.
            if self._early_bytes <= self._listener.limits.max_head_bytes:
                self._early.append(data)
                self._early_bytes += len(data)
            return
        if self._count_head(data) and self.inner is not None:
            self.inner.data_received(data)

    def _count_head(self, data: bytes) -> bool:
        """False (and the connection cut with a 431) when `data` takes the head over its
        bytes. Counted while a request is handled too: no endpoint takes a body, so whatever
        comes then is the next (pipelined) head, which aiohttp's parser would otherwise hold."""
        if self._waiting and self._head_timer is None:  # the first byte of the next request
            self._cancel(self._idle_timer)
            self._idle_timer = None
            self._arm_head()
        self._head_bytes += len(data)
        if self._head_bytes > self._listener.limits.max_head_bytes:
            self._listener.count_cut("head-bytes")
            assert self._transport is not None
            self._transport.write(_HEAD_TOO_LARGE)
            self.abort()
            return False
        return True

    def eof_received(self) -> bool | None:
        if not self._inner_connected or self.inner is None:
            return None  # closed: the handshake did not end
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        if self._write_timer is None:
            self._write_timer = self._loop.call_later(
                self._listener.limits.write_timeout, self.cut, "write"
            )
        if self._inner_connected and self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self._cancel(self._write_timer)
        self._write_timer = None
        if self._inner_connected and self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self._inner_connected and self.inner is not None:
            self.inner.connection_lost(exc)
