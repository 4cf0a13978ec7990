"""A TCP gate between one process and a server (the kube-apiserver, TLS passed through).

`TcpGate(host, port).start()` listens on a free port of 127.0.0.1 (`gate.port`) and pipes
every connection to the server byte for byte. `cut()` resets every open connection and every
new one until `heal()`: to the process behind the gate the server is gone, while everyone
else still reaches it. It runs its own event loop in a background thread, so a synchronous
test controls it in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading


class TcpGate:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.upstream_port = port
        self.port = 0
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    def start(self) -> TcpGate:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(asyncio.start_server(self._pipe, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, name="tcp-gate", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def cut(self) -> None:
        """Reset every connection, and every new one until `heal()`."""
        self._cut = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._reset_all)

    def heal(self) -> None:
        self._cut = False

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            _reset(writer)
        self._writers.clear()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            _reset(writer)
            return
        self._writers.update((writer, up_writer))

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    if self._cut:
                        return
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        self._writers.difference_update((writer, up_writer))


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            # SO_LINGER 0: close() sends a RST, the other side sees the connection reset.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError, RuntimeError):
        writer.transport.abort()
