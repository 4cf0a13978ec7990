"""Run the operator with Python's allocation tracing, for the memory floor's allocation profile.

    BENCH_TRACEMALLOC=DIR python -m bench.scale.traced slurmjob_operator run -n NS

(what the scale bench starts with `--operator-env BENCH_TRACEMALLOC=DIR`). Every
`BENCH_TRACEMALLOC_EVERY` seconds (default 30) one JSON line goes to `DIR/profile-<pid>.jsonl`:
the process's VmRSS, the traced memory (current and peak since start) and the largest
allocation sites still held, by file and by line. Tracing slows the process and adds its own
memory: a traced run gives the profile, never the bench's figures.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from slurmjob_operator.memtrim import resident_bytes

TOP = 30


def _top(snapshot: tracemalloc.Snapshot, key: str) -> list[dict[str, object]]:
    return [
        {"where": str(stat.traceback[0]), "bytes": stat.size, "count": stat.count}
        for stat in snapshot.statistics(key)[:TOP]
    ]


def _dump(path: Path, every: float) -> None:
    while True:
        time.sleep(every)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        current, peak = tracemalloc.get_traced_memory()
        row = {
            "t": time.time(),
            "rss": resident_bytes() or 0,
            "traced": current,
            "traced_peak": peak,
            "by_file": _top(snapshot, "filename"),
            "by_line": _top(snapshot, "lineno"),
        }
        with path.open("a") as out:
            out.write(json.dumps(row) + "\n")


def main() -> None:
    out = Path(os.environ["BENCH_TRACEMALLOC"])
    out.mkdir(parents=True, exist_ok=True)
    every = float(os.environ.get("BENCH_TRACEMALLOC_EVERY", "30"))
    tracemalloc.start(1)
    run_sampled(_dump, out / f"profile-{os.getpid()}.jsonl", every)


def run_sampled(dump: Callable[[Path, float], None], path: Path, every: float) -> None:
    """`dump(path, every)` in a daemon thread beside the module this process runs: the one
    named by the first argument, as its own `__main__`, with the rest as its argv."""
    threading.Thread(target=dump, args=(path, every), daemon=True).start()
    module, *rest = sys.argv[1:]
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
