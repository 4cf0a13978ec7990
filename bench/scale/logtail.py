"""A 10 GB log tailed with the project's own `storage.logs.read_tail`: O(tail), not O(file)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from slurmjob_operator.storage.logs import read_tail

SIZE = 10 * 10**9
SAMPLE = 256 * 2**20  # bytes read front to back to price a whole-file read


def measure(size: int = SIZE, runs: int = 9) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="slurmjob-bench-tail-") as tmp:
        root = Path(tmp)
        path = root / "job.out"
        tail = b"".join(f"step {i}: loss 0.{i:04d}\n".encode() for i in range(3000))
        # Sparse: no 10 GB written; the last bytes are a real log tail.
        with path.open("wb") as f:
            f.truncate(size - len(tail))
            f.seek(size - len(tail))
            f.write(tail)
        times = []
        got = None
        for _ in range(runs):
            started = time.perf_counter()
            got = read_tail(path, root=root, owner=os.getuid())
            times.append(time.perf_counter() - started)
        assert got is not None
        assert got.tail.endswith("loss 0.2999\n")
        started = time.perf_counter()
        with path.open("rb") as f:
            left = SAMPLE
            while left > 0:
                left -= len(f.read(min(left, 1 << 20)) or b"x" * left)
        sample_seconds = time.perf_counter() - started
    return {
        "file_bytes": size,
        "runs": runs,
        "median_ms": 1000 * statistics.median(times),
        "max_ms": 1000 * max(times),
        "tail_bytes": len(got.tail.encode()),
        # Reading a sparse file costs no disk: this is the best case of a whole-file read.
        "whole_file_seconds_estimate": sample_seconds * size / SAMPLE,
    }
