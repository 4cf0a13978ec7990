"""RSS and CPU time of one process, read from /proc every `period` seconds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def read_proc(pid: int) -> tuple[int, float] | None:
    """(RSS bytes, user+system CPU seconds) of `pid`, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm") as f:
            rss_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    # fields[0] is the state (field 3 of stat); utime, stime are fields 14 and 15
    cpu = (int(fields[11]) + int(fields[12])) / _TICK
    return rss_pages * _PAGE, cpu


@dataclass
class Sampler:
    pid: int
    period: float = 0.5
    samples: list[tuple[float, int, float]] = field(default_factory=list)  # (t, rss, cpu)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            got = read_proc(self.pid)
            if got is None:
                return
            self.samples.append((time.time(), got[0], got[1]))
            await asyncio.sleep(self.period)

    def between(self, t0: float, t1: float) -> list[tuple[float, int, float]]:
        return [s for s in self.samples if t0 <= s[0] <= t1]
