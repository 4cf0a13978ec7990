"""A counting HTTP proxy in front of slurmrestd, run as its own process.

The operator's transport sends one request per connection (see `slurm.http`), so the proxy
does the same: it reads one request, forwards it, reads one response (framed by
Content-Length, chunking or the end of the connection), writes it back and closes both sides.
What slurmrestd writes after the first response (26.05 writes a second one after every error)
is dropped, as the operator's transport drops it.

Every exchange is appended to a JSON-lines file: wall time, method, path template, status,
response body bytes. Being a separate process keeps its CPU out of the operator's and the
bench's own figures, and the per-request log lets the bench cut windows after the fact.

    python -m bench.scale.proxy --upstream http://127.0.0.1:26820 --log /tmp/requests.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import sys
import time
from typing import IO
from urllib.parse import urlsplit

_HEAD_LIMIT = 64 * 1024
# Job ids, het/array refs ("123+1", "123_4") and SLUIDs ("s" + base32) in a path segment.
_ID_SEGMENT = re.compile(r"/(?:\d+(?:[+_]\d+)?|s[0-9A-Za-z]{8,})(?=/|$)")


def template(path: str) -> str:
    """`/slurm/v0.0.45/job/123?x=1` -> `/slurm/v0.0.45/job/{id}`: counted per kind, not per job."""
    return _ID_SEGMENT.sub("/{id}", path.split("?", 1)[0])


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    """The body that follows `head`, as framed by its headers (raw: chunks stay chunked)."""
    encoding = (_header(head, b"transfer-encoding") or b"").lower()
    if b"chunked" in encoding:
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            parts.append(size_line)
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # trailers end with an empty line
                while True:
                    line = await reader.readuntil(b"\r\n")
                    parts.append(line)
                    if line == b"\r\n":
                        return b"".join(parts)
            parts.append(await reader.readexactly(size + 2))
    length = _header(head, b"content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    return b""


def _chunked_payload(raw: bytes) -> int:
    """Payload bytes of a chunked body (what the client's parser hands over)."""
    total, pos = 0, 0
    while pos < len(raw):
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end].split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            break
        total += size
        pos = end + 2 + size + 2
    return total


class Counter:
    def __init__(self, upstream: str, out: IO[str]) -> None:
        parts = urlsplit(upstream)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.out = out

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started = time.time()
        record: dict[str, object] = {"t": started}
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _HEAD_LIMIT:
                return
            body = await _read_body(reader, head)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            record["m"] = method
            target = rest.rsplit(" ", 1)[0]
            record["p"] = template(target)
            ref = _ID_SEGMENT.search(target.split("?", 1)[0])
            if ref:  # which job: the baseline's rounds are counted in distinct jobs
                record["i"] = ref.group(0)[1:]
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            try:
                up_writer.write(head + body)
                await up_writer.drain()
                answer_head = await up_reader.readuntil(b"\r\n\r\n")
                framed = (
                    _header(answer_head, b"content-length") is not None
                    or b"chunked" in (_header(answer_head, b"transfer-encoding") or b"").lower()
                )
                answer = (
                    await _read_body(up_reader, answer_head) if framed else await up_reader.read()
                )
            finally:
                up_writer.close()
                with contextlib.suppress(OSError):
                    await up_writer.wait_closed()
            status = answer_head.split(b" ", 2)[1]
            record["s"] = int(status)
            chunked = b"chunked" in (_header(answer_head, b"transfer-encoding") or b"").lower()
            record["b"] = _chunked_payload(answer) if chunked else len(answer)
            record["d"] = round(time.time() - started, 4)
            writer.write(answer_head + answer)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            record["e"] = 1  # a broken exchange still counts: the operator sent it
        finally:
            if "m" in record:
                self.out.write(json.dumps(record, separators=(",", ":")) + "\n")
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _flush(out: IO[str]) -> None:
    # Buffered writes, flushed often enough for the bench to cut windows a second later.
    while True:
        await asyncio.sleep(0.5)
        out.flush()


async def main_async(upstream: str, port: int, log_path: str) -> None:
    with open(log_path, "a", buffering=1 << 16) as out:  # noqa: ASYNC230 - one open at start
        counter = Counter(upstream, out)
        server = await asyncio.start_server(counter.serve, "127.0.0.1", port, limit=1 << 20)
        bound = server.sockets[0].getsockname()[1]
        print(f"http://127.0.0.1:{bound}", flush=True)
        flusher = asyncio.create_task(_flush(out))
        stop = asyncio.Event()
        # SIGTERM from the bench: stop accepting, keep what was counted.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        try:
            async with server:
                await stop.wait()
        finally:
            flusher.cancel()
            out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.proxy")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main_async(args.upstream, args.port, args.log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
