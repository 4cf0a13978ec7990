"""A raw asyncio TCP server that replays byte-exact HTTP answers, and real captured answers.

Not aiohttp on purpose: the point is to write responses a strict HTTP server never would.
The captures below were recorded from the test clusters' slurmrestd (26.05.5 and 22.05.8).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

# POST /slurm/v0.0.45/job/submit to partition "nope" on 26.05.5: two responses back to back.
SUBMIT_422_2605 = (
    b"HTTP/1.1 422 UNPROCESSABLE CONTENT\r\n"
    b"Connection: Close\r\n"
    b"Content-Length: 715\r\n"
    b"Content-Type: application/json\r\n"
    b"\r\n"
    b"{\n"
    b'  "errors": [\n'
    b"    {\n"
    b'      "description": "Batch job submission failed",\n'
    b'      "error_number": 2000,\n'
    b'      "error": "Invalid partition name specified",\n'
    b'      "source": "slurm_submit_batch_job()"\n'
    b"    }\n"
    b"  ],\n"
    b'  "warnings": [],\n'
    b'  "meta": {\n'
    b'    "plugin": {\n'
    b'      "type": "openapi\\/slurmctld",\n'
    b'      "name": "Slurm OpenAPI slurmctld",\n'
    b'      "data_parser": "data_parser\\/v0.0.45",\n'
    b'      "accounting_storage": ""\n'
    b"    },\n"
    b'    "client": {\n'
    b'      "source": "127.0.0.1:26820(fd:9)",\n'
    b'      "user": "root",\n'
    b'      "group": "root"\n'
    b"    },\n"
    b'    "command": [],\n'
    b'    "slurm": {\n'
    b'      "version": {\n'
    b'        "major": "26",\n'
    b'        "micro": "5",\n'
    b'        "minor": "05"\n'
    b"      },\n"
    b'      "release": "26.05.5",\n'
    b'      "cluster": "tb2605"\n'
    b"    }\n"
    b"  }\n"
    b"}HTTP/1.1 422 UNPROCESSABLE CONTENT\r\n"
    b"Connection: Close\r\n"
    b"Content-Length: 32\r\n"
    b"Content-Type: text/plain\r\n"
    b"\r\n"
    b"Invalid partition name specified"
)

# GET /slurm/v0.0.45/job/999999 on 26.05.5: two responses back to back.
GET_404_2605 = (
    b"HTTP/1.1 404 NOT FOUND\r\n"
    b"Connection: Close\r\n"
    b"Content-Length: 875\r\n"
    b"Content-Type: application/json\r\n"
    b"\r\n"
    b"{\n"
    b'  "jobs": [],\n'
    b'  "last_backfill": {\n'
    b'    "set": true,\n'
    b'    "infinite": false,\n'
    b'    "number": 0\n'
    b"  },\n"
    b'  "last_update": {\n'
    b'    "set": true,\n'
    b'    "infinite": false,\n'
    b'    "number": 0\n'
    b"  },\n"
    b'  "meta": {\n'
    b'    "plugin": {\n'
    b'      "type": "openapi\\/slurmctld",\n'
    b'      "name": "Slurm OpenAPI slurmctld",\n'
    b'      "data_parser": "data_parser\\/v0.0.45",\n'
    b'      "accounting_storage": ""\n'
    b"    },\n"
    b'    "client": {\n'
    b'      "source": "127.0.0.1:26820(fd:9)",\n'
    b'      "user": "root",\n'
    b'      "group": "root"\n'
    b"    },\n"
    b'    "command": [],\n'
    b'    "slurm": {\n'
    b'      "version": {\n'
    b'        "major": "26",\n'
    b'        "micro": "5",\n'
    b'        "minor": "05"\n'
    b"      },\n"
    b'      "release": "26.05.5",\n'
    b'      "cluster": "tb2605"\n'
    b"    }\n"
    b"  },\n"
    b'  "errors": [\n'
    b"    {\n"
    b'      "description": "Unable to query JobId=999999",\n'
    b'      "error_number": 2017,\n'
    b'      "error": "Invalid job id specified",\n'
    b'      "source": "_handle_job_get"\n'
    b"    }\n"
    b"  ],\n"
    b'  "warnings": []\n'
    b"}HTTP/1.1 404 NOT FOUND\r\n"
    b"Connection: Close\r\n"
    b"Content-Length: 24\r\n"
    b"Content-Type: text/plain\r\n"
    b"\r\n"
    b"Invalid job id specified"
)

# GET /slurm/v0.0.38/ping with `Connection: close` on 22.05.8: a stray line after the body.
PING_CLOSE_2205 = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Length: 386\r\n"
    b"Content-Type: application/json\r\n"
    b"\r\n"
    b"{\n"
    b'  "meta": {\n'
    b'    "plugin": {\n'
    b'      "type": "openapi\\/v0.0.38",\n'
    b'      "name": "Slurm OpenAPI v0.0.38"\n'
    b"    },\n"
    b'    "Slurm": {\n'
    b'      "version": {\n'
    b'        "major": 22,\n'
    b'        "micro": 8,\n'
    b'        "minor": 5\n'
    b"      },\n"
    b'      "release": "22.05.8"\n'
    b"    }\n"
    b"  },\n"
    b'  "errors": [\n'
    b"  ],\n"
    b'  "pings": [\n'
    b"    {\n"
    b'      "hostname": "vm",\n'
    b'      "ping": "UP",\n'
    b'      "status": 0,\n'
    b'      "mode": "primary"\n'
    b"    }\n"
    b"  ]\n"
    b"}Connection: Close\r\n"
)

#: What the server does after reading a request: "close" after writing the answer, "keep"
#: the connection open until the client closes it, "drop" without answering, "hang" never
#: answering. "greet" writes the answer as soon as a client connects, reads nothing, and
#: waits for the client to close.
Mode = str
Reply = bytes | Callable[[bytes], Awaitable[bytes]]


@dataclass
class RawServer:
    reply: Reply = b""
    mode: Mode = "close"
    requests: list[bytes] = field(default_factory=list)
    active: int = 0
    peak: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return head + await reader.readexactly(length)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if self.mode == "greet":
                assert isinstance(self.reply, bytes)
                writer.write(self.reply)
                await writer.drain()
                await reader.read()
                return
            request = await self._read_request(reader)
            self.requests.append(request)
            if self.mode == "hang":
                await reader.read()  # until the client goes away
                return
            if self.mode != "drop":
                reply = self.reply if isinstance(self.reply, bytes) else await self.reply(request)
                writer.write(reply)
                await writer.drain()
            if self.mode == "keep":
                await reader.read()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.active -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._tasks.discard(task)

    async def start(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()


@contextlib.asynccontextmanager
async def raw_server(reply: Reply = b"", mode: Mode = "close") -> AsyncIterator[RawServer]:
    server = await RawServer(reply, mode).start()
    try:
        yield server
    finally:
        await server.stop()
