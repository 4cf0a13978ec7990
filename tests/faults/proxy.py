"""A fault-injecting HTTP proxy between the operator and slurmrestd.

`FaultProxy(upstream_url).start()` listens on a free port of 127.0.0.1 (`proxy.url`): point
the operator's `SLURMJOB_SLURM_REST_URL` at it. The proxy runs its own event loop in a
background thread, so a synchronous test (or the soak) controls it in-process.

Each client connection carries one request (the operator's transport sends one request per
connection and reads one response). The proxy reads that request, looks for a `Fault` that
claims it, and otherwise forwards it byte for byte: the request, slurmrestd's answer, and
whatever slurmrestd writes after it (26.05 writes a second response after every error), until
either side closes.

A `Fault` claims the `nth` request (1-based, `count` of them from there on; `count=0`: every
one) matching its `method`, `path` regex and optional `body` regex, and then does one of:

- `DROP_RESPONSE` (forward_drop_response): forward, read slurmrestd's full answer, then reset
  the client connection without answering. The job is created; the operator sees a reset.
- `DELAY` (forward_delay): forward, read the answer, write it `delay` seconds later (past the
  operator's timeout: the operator sees a read timeout; the late answer goes nowhere).
- `RESET` (reset_before_forward): reset the client connection without forwarding anything.
- `ANSWER_5XX` (answer_5xx): answer `status` (502, 503, 500 ...) with a plain-text body,
  without forwarding, or after forwarding and reading the real answer when `forward=True`.
- `HOLD_REQUEST`: keep the request until `fault.release(deliver)`: then forward it as usual
  (deliver=True) or reset the connection without forwarding (deliver=False).
- `HOLD_RESPONSE`: forward, read the answer, keep it until `fault.release(deliver)`: then
  write it (deliver=True) or reset the connection (deliver=False).

Every fault has threading events a test can wait on: `matched` (the request arrived and the
fault claimed it), `forwarded` (the whole request was written to slurmrestd), `answered`
(slurmrestd's whole answer was read) and `finished`. `proxy.exchanges()` lists every request
seen (method, path, the `sj-...` job name of a submit body, what was done, whether it reached
slurmrestd, slurmrestd's status), so a test can count the submits that reached Slurm.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import urlsplit

_T = TypeVar("_T")

_HEAD_LIMIT = 64 * 1024
_JOB_NAME = re.compile(rb'"name"\s*:\s*"(sj-[A-Za-z0-9._-]+)"')
# How long a held request or answer waits for release() before it is dropped.
HOLD_LIMIT = 120.0
# How long the byte-for-byte pipe after a forwarded answer may stay open.
_PIPE_LIMIT = 30.0
# Reading an answer framed by neither Content-Length nor chunking: done after this much quiet.
_EOF_QUIET = 1.0


class Action(StrEnum):
    FORWARD = "forward"
    DROP_RESPONSE = "forward_drop_response"
    DELAY = "forward_delay"
    RESET = "reset_before_forward"
    ANSWER_5XX = "answer_5xx"
    HOLD_REQUEST = "hold_before_forward"
    HOLD_RESPONSE = "hold_after_forward"


@dataclass
class Exchange:
    """One request the proxy received, and what became of it."""

    method: str
    path: str
    job_name: str | None
    action: Action
    at: float = field(default_factory=time.monotonic)
    forwarded: bool = False  # the whole request was written to slurmrestd
    status: int | None = None  # slurmrestd's status, when its answer was read
    raw: bytes = field(default=b"", repr=False)


@dataclass
class Fault:
    action: Action
    method: str = "POST"
    path: str = r"/job/submit$"
    body: str | None = None
    nth: int = 1
    count: int = 1
    status: int = 502
    forward: bool = False
    delay: float = 0.0
    name: str = ""
    matched: threading.Event = field(default_factory=threading.Event, repr=False)
    forwarded: threading.Event = field(default_factory=threading.Event, repr=False)
    answered: threading.Event = field(default_factory=threading.Event, repr=False)
    finished: threading.Event = field(default_factory=threading.Event, repr=False)
    hits: list[Exchange] = field(default_factory=list, repr=False)
    _seen: int = field(default=0, repr=False)
    _released: threading.Event = field(default_factory=threading.Event, repr=False)
    _deliver: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self._path = re.compile(self.path)
        self._body = re.compile(self.body.encode()) if self.body is not None else None

    def release(self, deliver: bool) -> None:
        """Let a held request or answer go: deliver it, or drop it (reset the client)."""
        self._deliver = deliver
        self._released.set()

    def _claims(self, method: str, path: str, body: bytes) -> bool:
        """Count a matching request; True when it is one this fault acts on."""
        if method != self.method or not self._path.search(path):
            return False
        if self._body is not None and not self._body.search(body):
            return False
        self._seen += 1
        if self._seen < self.nth:
            return False
        return self.count == 0 or self._seen < self.nth + self.count

    async def _held(self) -> bool:
        deadline = time.monotonic() + HOLD_LIMIT
        while not self._released.is_set():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return self._deliver


class ProxyError(RuntimeError):
    pass


# -- HTTP framing (just enough to find where one message ends) ----------------------------


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > _HEAD_LIMIT:
        raise ProxyError("header too long")
    return head


def _headers(head: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, body) of one request framed by Content-Length (all the operator sends)."""
    head = await _read_head(reader)
    length = int(_headers(head).get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return head, body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    raw = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        raw += line
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            break
        raw += await reader.readexactly(size + 2)
    while True:  # trailers up to the empty line
        line = await reader.readuntil(b"\r\n")
        raw += line
        if line == b"\r\n":
            return bytes(raw)


async def _read_quiet_eof(reader: asyncio.StreamReader) -> bytes:
    raw = bytearray()
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), _EOF_QUIET)
        except TimeoutError:
            return bytes(raw)
        if not chunk:
            return bytes(raw)
        raw += chunk


async def read_response(reader: asyncio.StreamReader, method: str) -> tuple[int, bytes]:
    """(status, raw bytes) of one complete response, interim 1xx answers included."""
    raw = bytearray()
    while True:
        head = await _read_head(reader)
        raw += head
        status = int(head.split(b" ", 2)[1])
        if not (100 <= status < 200 and status != 101):
            break
    headers = _headers(head)
    if method == "HEAD" or status in (204, 304):
        return status, bytes(raw)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raw += await _read_chunked(reader)
    elif "content-length" in headers:
        raw += await reader.readexactly(int(headers["content-length"]))
    else:
        raw += await _read_quiet_eof(reader)
    return status, bytes(raw)


def _answer(status: int) -> bytes:
    reasons = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
    reason = reasons.get(status, "Error")
    body = f"{status} {reason} (injected by the fault proxy)\n".encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0): the peer's read fails with ECONNRESET."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    await asyncio.sleep(0)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.write_eof()


class FaultProxy:
    """See the module docstring. Use as a context manager or call start()/stop()."""

    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the proxy forwards to http:// URLs only, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.host = host
        self.port = 0
        self._faults: list[Fault] = []
        self._log: list[Exchange] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, self.host, 0, limit=_HEAD_LIMIT + 1024)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise ProxyError(f"the proxy did not start: {failure[0]}")
        return self

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        for fault in self.faults():
            fault.release(False)
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- control --------------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove(self, fault: Fault) -> None:
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def exchanges(
        self, *, method: str | None = None, job_name: str | None = None
    ) -> list[Exchange]:
        with self._lock:
            return [
                e
                for e in self._log
                if (method is None or e.method == method)
                and (job_name is None or e.job_name == job_name)
            ]

    def submits_forwarded(self, job_name: str) -> int:
        """How many submits carrying `job_name` were written to slurmrestd in full."""
        return sum(1 for e in self.exchanges(method="POST", job_name=job_name) if e.forwarded)

    def replay(self, exchange: Exchange, timeout: float = 30) -> tuple[int, bytes]:
        """Send a recorded request again, byte for byte, straight to slurmrestd."""
        return self._call(self._replay(exchange.raw), timeout)

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
        if self._loop is None:
            raise ProxyError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _replay(self, raw: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(*self.upstream)
        try:
            writer.write(raw)
            await writer.drain()
            method = raw.split(b" ", 1)[0].decode()
            return await read_response(reader, method)
        finally:
            await _close(writer)

    # -- serving --------------------------------------------------------------------------

    def _claim(self, method: str, path: str, body: bytes) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault._claims(method, path, body):
                    return fault
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._exchange(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()
        except Exception:
            writer.transport.abort()
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head, body = await read_request(reader)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError):
            await _close(writer)
            return
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.rsplit(" ", 1)[0].split("?", 1)[0]
        found = _JOB_NAME.search(body) if method == "POST" else None
        fault = self._claim(method, path, body)
        action = fault.action if fault is not None else Action.FORWARD
        exchange = Exchange(
            method,
            path,
            found.group(1).decode() if found else None,
            action,
            raw=head + body,
        )
        with self._lock:
            self._log.append(exchange)
        if fault is None:
            await self._forward(exchange, reader, writer)
            return
        fault.hits.append(exchange)
        fault.matched.set()
        try:
            await self._faulty(fault, exchange, writer)
        finally:
            fault.finished.set()

    async def _connect_upstream(
        self, exchange: Exchange
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        up_reader, up_writer = await asyncio.open_connection(
            *self.upstream, limit=_HEAD_LIMIT + 1024
        )
        up_writer.write(exchange.raw)
        await up_writer.drain()
        exchange.forwarded = True
        return up_reader, up_writer

    async def _forward(
        self,
        exchange: Exchange,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Byte for byte: the request, the answer, and whatever either side sends after."""
        try:
            up_reader, up_writer = await self._connect_upstream(exchange)
        except OSError:
            await _reset(writer)
            return
        try:
            status, answer = await read_response(up_reader, exchange.method)
            exchange.status = status
            writer.write(answer)
            await writer.drain()
            pumps = [
                asyncio.ensure_future(_pump(up_reader, writer)),
                asyncio.ensure_future(_pump(reader, up_writer)),
            ]
            _, pending = await asyncio.wait(
                pumps, timeout=_PIPE_LIMIT, return_when=asyncio.FIRST_COMPLETED
            )
            if pending:  # one side is done: give the other a moment to finish
                _, pending = await asyncio.wait(pending, timeout=1)
            for task in pending:
                task.cancel()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            await _reset(writer)
        finally:
            up_writer.transport.abort()
            await _close(writer)

    async def _faulty(self, fault: Fault, exchange: Exchange, writer: asyncio.StreamWriter) -> None:
        action = fault.action
        if action is Action.RESET:
            await _reset(writer)
            return
        if action is Action.ANSWER_5XX and not fault.forward:
            writer.write(_answer(fault.status))
            with contextlib.suppress(OSError):
                await writer.drain()
            await _close(writer)
            return
        if action is Action.HOLD_REQUEST and not await fault._held():
            await _reset(writer)
            return
        try:
            up_reader, up_writer = await self._connect_upstream(exchange)
        except OSError:
            await _reset(writer)
            return
        fault.forwarded.set()
        try:
            status, answer = await read_response(up_reader, exchange.method)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            up_writer.transport.abort()
            await _reset(writer)
            return
        up_writer.transport.abort()
        exchange.status = status
        fault.answered.set()
        data: bytes | None = answer
        if action is Action.DROP_RESPONSE:
            data = None
        elif action is Action.DELAY:
            await asyncio.sleep(fault.delay)
        elif action is Action.ANSWER_5XX:
            data = _answer(fault.status)
        elif action is Action.HOLD_RESPONSE and not await fault._held():
            data = None
        if data is None:
            await _reset(writer)
            return
        try:
            writer.write(data)
            await writer.drain()
        except OSError:
            pass
        await _close(writer)
