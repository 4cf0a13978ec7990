"""The test bed's relay (tests/k8s/netns.py) keeps its bounds: connections at once, bytes per
connection, idle time, and loopback targets only. On a loopback listener, no cluster: the
network namespace itself is made by test_kubectl_plugin.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.k8s.netns import NetnsError, Relay

pytestmark = pytest.mark.integration


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A loopback server echoing whatever it gets, one thread per connection."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while chunk := conn.recv(65536):
                conn.sendall(chunk)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[:2]
    stop.set()
    thread.join()
    server.close()


def _relay(target: tuple[str, int], **bounds: Any) -> Relay:
    listener = socket.create_server(("127.0.0.1", 0))
    return Relay(listener, target, **bounds).start()


def _closed(conn: socket.socket, within: float = 5) -> bool:
    conn.settimeout(within)
    try:
        while conn.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_it_forwards_and_counts(echo: tuple[str, int]) -> None:
    relay = _relay(echo)
    try:
        with socket.create_connection(relay.address, timeout=5) as conn:
            conn.sendall(b"hello")
            assert conn.recv(100) == b"hello"
        time.sleep(0.2)
        assert (relay.stats.accepted, relay.stats.bytes_in, relay.stats.bytes_out) == (1, 5, 5)
        assert relay.stats.peers == {"127.0.0.1"}
    finally:
        relay.close()


def test_one_connection_over_the_cap_is_closed_at_once(echo: tuple[str, int]) -> None:
    relay = _relay(echo, max_connections=1)
    try:
        with socket.create_connection(relay.address, timeout=5) as first:
            first.sendall(b"a")
            assert first.recv(10) == b"a"
            with socket.create_connection(relay.address, timeout=5) as second:
                started = time.monotonic()
                assert _closed(second)
                assert time.monotonic() - started < 1
            first.sendall(b"b")  # the first goes on
            assert first.recv(10) == b"b"
        assert relay.stats.refused == 1
    finally:
        relay.close()


def test_a_connection_is_cut_after_its_bytes_or_when_idle(echo: tuple[str, int]) -> None:
    relay = _relay(echo, max_bytes=1000, idle=0.5)
    try:
        with socket.create_connection(relay.address, timeout=5) as big:
            big.sendall(b"x" * 600)
            big.sendall(b"x" * 600)
            assert _closed(big)
        with socket.create_connection(relay.address, timeout=5) as quiet:
            started = time.monotonic()
            assert _closed(quiet)
            assert 0.4 < time.monotonic() - started < 3
        time.sleep(0.2)
        assert relay.stats.cut == 2
    finally:
        relay.close()


def test_it_forwards_to_loopback_only() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, pytest.raises(NetnsError, match="loopback only"):
        Relay(listener, ("192.0.2.7", 443))
