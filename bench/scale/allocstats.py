"""Run the operator with its allocator's own counts sampled: where a memory peak lives.

    BENCH_ALLOCSTATS=DIR python -m bench.scale.allocstats slurmjob_operator run -n NS

(what the scale bench starts with `--operator-env BENCH_ALLOCSTATS=DIR`). Every
`BENCH_ALLOCSTATS_EVERY` seconds (default 1) one JSON line goes to
`DIR/allocstats-<pid>.jsonl`: the process's resident set (`memtrim.resident_bytes`), Python's
allocated blocks (pymalloc's only: 0 under PYTHONMALLOC=malloc) and, when jemalloc is the
process's malloc, jemalloc's own figures: `allocated` (bytes the program holds), `active`
(the pages those sit in), `resident`, `mapped`, `retained`. Allocated against resident tells
objects still held from pages the allocator keeps. Unlike the traced run
(`bench.scale.traced`) it does not slow the process several times over; its own cost was
within the runs' noise (docs/benchmarks.md), not measured apart.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.scale.traced import run_sampled
from slurmjob_operator.memtrim import jemalloc_mallctl, resident_bytes

STATS = ("allocated", "active", "resident", "mapped", "retained", "metadata")


def _jemalloc() -> Callable[[], dict[str, int]] | None:
    """jemalloc's statistics reader, or None when the process's malloc is not jemalloc."""
    mallctl = jemalloc_mallctl()
    if mallctl is None:
        return None

    def read() -> dict[str, int]:
        # The statistics are a snapshot taken when the epoch is advanced.
        epoch = ctypes.c_uint64(1)
        size = ctypes.c_size_t(ctypes.sizeof(epoch))
        mallctl(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), size)
        out: dict[str, int] = {}
        for name in STATS:
            value = ctypes.c_size_t(0)
            length = ctypes.c_size_t(ctypes.sizeof(value))
            key = f"stats.{name}".encode()
            if mallctl(key, ctypes.byref(value), ctypes.byref(length), None, 0) == 0:
                out[name] = value.value
        return out

    return read


def sample(jemalloc: Callable[[], dict[str, int]] | None) -> dict[str, object]:
    row: dict[str, object] = {
        "t": time.time(),
        "rss": resident_bytes() or 0,
        "python_blocks": sys.getallocatedblocks(),
    }
    if jemalloc is not None:
        row["jemalloc"] = jemalloc()
    return row


def _dump(path: Path, every: float) -> None:
    jemalloc = _jemalloc()
    while True:
        with path.open("a") as out:
            out.write(json.dumps(sample(jemalloc)) + "\n")
        time.sleep(every)


def main() -> None:
    out = Path(os.environ["BENCH_ALLOCSTATS"])
    out.mkdir(parents=True, exist_ok=True)
    every = float(os.environ.get("BENCH_ALLOCSTATS_EVERY", "1"))
    run_sampled(_dump, out / f"allocstats-{os.getpid()}.jsonl", every)


if __name__ == "__main__":
    main()
