"""A network namespace holding the listening end of the operator's log port.

The apiserver reaches an aggregated API server at the address of an EndpointSlice, which
may not be loopback (``ValidateEndpointIP``), while the test bed's apiserver and the
operator listen on 127.0.0.1 only and no test may connect to the host's own non-loopback
address. So the test bed makes a network namespace joined to the host by a veth pair in a
private /30 (nothing routes beyond it: the namespace has no other link and no default route,
the host forwards nothing), and puts one thing there: a listening socket, created by a
thread that entered the namespace (``setns``), accepted on by a relay in this process that
forwards each connection to the operator's port on 127.0.0.1. TLS passes through the relay
untouched: the apiserver and the operator see each other's certificates.

Idempotent: ``ensure`` keeps a namespace of a previous run that is as it should be and
rebuilds one that is not; ``remove`` deletes both ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import json
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

NAME = "slurmjob-testbed-logs"
HOST_LINK = "sjtb-logs-h"  # interface names: at most 15 characters
NS_LINK = "sjtb-logs-n"
NETWORK = ipaddress.IPv4Network("172.31.254.240/30")
HOST_ADDRESS = str(NETWORK[1])
NS_ADDRESS = str(NETWORK[2])
PREFIX = NETWORK.prefixlen
NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """The namespace could not be made, entered or removed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed (rc {proc.returncode}): {proc.stderr}")
    return proc


def _addresses(*netns: str, link: str) -> list[str]:
    proc = _ip(*netns, "-j", "-4", "addr", "show", "dev", link, check=False)
    if proc.returncode != 0:
        return []
    found: list[str] = []
    for entry in json.loads(proc.stdout or "[]"):
        if "UP" not in entry.get("flags", []):
            return []
        found += [f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", [])]
    return found


def _as_it_should_be() -> bool:
    return (NETNS_DIR / NAME).exists() and (
        _addresses(link=HOST_LINK) == [f"{HOST_ADDRESS}/{PREFIX}"]
        and _addresses("-n", NAME, link=NS_LINK) == [f"{NS_ADDRESS}/{PREFIX}"]
    )


def _check_no_overlap() -> None:
    """No route of this host but the default one may cover the /30: its traffic would
    leave through the veth pair instead."""
    proc = _ip("-j", "-4", "route", "show", "table", "all")
    for route in json.loads(proc.stdout or "[]"):
        dst, dev = route.get("dst", ""), route.get("dev", "")
        if dst in ("default", "") or dev == HOST_LINK:
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.IPv4Network(dst, strict=False).overlaps(NETWORK):
                raise NetnsError(f"route {dst} dev {dev} overlaps the test bed's {NETWORK}")


def remove() -> None:
    """Delete the namespace (and with it the veth end inside) and the host end."""
    _ip("netns", "delete", NAME, check=False)
    # Deleting the namespace frees its veth end later; the host end goes now.
    _ip("link", "delete", HOST_LINK, check=False)


def ensure() -> None:
    """The namespace and its veth pair, up and addressed (re-using a previous run's)."""
    if _as_it_should_be():
        return
    remove()
    _check_no_overlap()
    _ip("netns", "add", NAME)
    try:
        _ip("link", "add", HOST_LINK, "type", "veth", "peer", "name", NS_LINK, "netns", NAME)
        _ip("addr", "add", f"{HOST_ADDRESS}/{PREFIX}", "dev", HOST_LINK)
        _ip("link", "set", HOST_LINK, "up")
        _ip("-n", NAME, "addr", "add", f"{NS_ADDRESS}/{PREFIX}", "dev", NS_LINK)
        _ip("-n", NAME, "link", "set", NS_LINK, "up")
        _ip("-n", NAME, "link", "set", "lo", "up")
    except BaseException:
        remove()
        raise
    if not _as_it_should_be():
        raise NetnsError(f"network namespace {NAME} is not as made")


def listen(port: int = 0, backlog: int = 64) -> socket.socket:
    """A TCP socket listening on NS_ADDRESS:port inside the namespace.

    A socket belongs to the namespace its creator was in, whatever thread uses it later;
    a thread of its own enters the namespace (its namespace is per thread) and ends.
    """
    result: list[socket.socket | BaseException] = []

    def inside() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(NETNS_DIR / NAME, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise NetnsError(f"setns({NAME}): {os.strerror(err)}")
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((NS_ADDRESS, port))
            sock.listen(backlog)
            result.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    thread = threading.Thread(target=inside, name=f"netns-{NAME}")
    thread.start()
    thread.join()
    got = result[0]
    if isinstance(got, BaseException):
        raise got
    return got


@dataclass
class RelayStats:
    accepted: int = 0
    refused: int = 0  # over the cap on connections: closed at once
    bytes_in: int = 0  # from the namespace's side to the target
    bytes_out: int = 0
    cut: int = 0  # ended by a bound (idle, lifetime, bytes)
    peers: set[str] = field(default_factory=set)


class Relay:
    """Accepts on ``listener`` and forwards each connection to ``target`` on loopback, in an
    event loop of its own thread. Bounded: ``max_connections`` at once (one more is closed
    at once), ``max_bytes`` each way per connection, ``idle`` seconds without a byte either
    way, ``lifetime`` seconds per connection."""

    def __init__(
        self,
        listener: socket.socket,
        target: tuple[str, int],
        *,
        max_connections: int = 32,
        max_bytes: int = 64 * 1024 * 1024,
        idle: float = 120.0,
        lifetime: float = 600.0,
    ) -> None:
        if not ipaddress.ip_address(target[0]).is_loopback:
            raise NetnsError(f"the relay forwards to loopback only, not {target[0]}")
        self.listener = listener
        self.target = target
        self.max_connections = max_connections
        self.max_bytes = max_bytes
        self.idle = idle
        self.lifetime = lifetime
        self.stats = RelayStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="netns-relay", daemon=True)
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._open = 0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> Relay:
        self._thread.start()
        if not self._started.wait(10):
            raise NetnsError("the relay did not start")
        return self

    def close(self) -> None:
        stop = self._stop
        if stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(10)
        self.listener.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, sock=self.listener)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._relay(reader, writer)
        except asyncio.CancelledError:
            # Closing the relay cancels its connections; ending quietly keeps asyncio's
            # stream callback from reporting each as an error.
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._open >= self.max_connections:
            self.stats.refused += 1
            writer.close()
            return
        self._open += 1
        self.stats.accepted += 1
        if peer:
            self.stats.peers.add(str(peer[0]))
        upstream: asyncio.StreamWriter | None = None
        pipes: list[asyncio.Task[None]] = []
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), 5)
            upstream = up_writer
            active = [self._loop.time()]
            pipes = [
                asyncio.create_task(self._pipe(reader, up_writer, active, inbound=True)),
                asyncio.create_task(self._pipe(up_reader, writer, active, inbound=False)),
            ]
            async with asyncio.timeout(self.lifetime):
                await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            if any(p.done() and not p.cancelled() and p.exception() for p in pipes):
                self.stats.cut += 1
        except (OSError, TimeoutError):
            self.stats.cut += 1
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self._open -= 1
            for w in (writer, upstream):
                if w is not None:
                    w.close()

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        active: list[float],
        *,
        inbound: bool,
    ) -> None:
        """One direction; ``active[0]`` is when either last moved a byte."""
        sent = 0
        while True:
            try:
                async with asyncio.timeout(self.idle):
                    chunk = await src.read(65536)
            except TimeoutError:
                if self._loop.time() - active[0] < self.idle:
                    continue  # the other direction moved meanwhile
                raise
            if not chunk:
                if dst.can_write_eof():
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                return
            active[0] = self._loop.time()
            sent += len(chunk)
            if sent > self.max_bytes:
                raise _Bound()
            if inbound:
                self.stats.bytes_in += len(chunk)
            else:
                self.stats.bytes_out += len(chunk)
            dst.write(chunk)
            async with asyncio.timeout(self.idle):
                await dst.drain()


class _Bound(Exception):
    """A connection reached its byte bound."""
