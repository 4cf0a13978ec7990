"""The operator's own bounded thread pools for blocking file work, one per kind, so that one
kind filling its pool never holds up another (issue 42).

asyncio's default pool (`asyncio.to_thread`) has `min(32, cpus + 4)` threads shared by every
blocking call: a few deletions of checkpoint trees with millions of files once held all of
them, and every tenant's log read waited behind them until its `READ_TIMEOUT` (a 504). Here:

- `REMOVALS`: checkpoint and attempt-directory removals. Metadata-bound (unlink, rmdir) on the
  same storage: more threads contend on the same directories and journal and take the GIL from
  the event loop; two keep one removal going while another starts.
- `ARCHIVE`: archive entry writes, sweeps and record reads. The archiver writes at most two
  entries at once (`controller.archiving.ArchiveSlots`: one per owner, two owners), so two
  threads are busy writing at most and the others serve the sweep and the log API's record
  reads of deleted SlurmJobs.
- `LOG_READS`: the status tails (`controller.following`) and the log API's reads
  (`controller.logaccess`, at most 8 at once there). Each is bounded in bytes and by
  `READ_TIMEOUT`; eight keep the API's reads and a poll's tails going together.

Everything else (staging, scans, probe records) stays on the default pool. The pools are
opened at startup and shut down at cleanup (`handlers.lifecycle`, `local.runner`); a caller
before that (the doctor, a test) opens them on first use.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Pool(enum.Enum):
    REMOVALS = "removals"
    ARCHIVE = "archive"
    LOG_READS = "log-reads"


#: Threads of each pool (the module docstring says why each size).
SIZES: dict[Pool, int] = {Pool.REMOVALS: 2, Pool.ARCHIVE: 4, Pool.LOG_READS: 8}

_pools: dict[Pool, ThreadPoolExecutor] = {}


def open_pools() -> None:
    """Make the pools that are not open yet."""
    for kind in Pool:
        executor(kind)


def close_pools() -> None:
    """Shut every pool down: work not started is dropped, work running ends on its own (a
    removal pass is bounded, `core.removal`); a later call opens new ones."""
    pools = list(_pools.values())
    _pools.clear()
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)


def executor(kind: Pool) -> ThreadPoolExecutor:
    pool = _pools.get(kind)
    if pool is None:
        pool = _pools[kind] = ThreadPoolExecutor(
            max_workers=SIZES[kind], thread_name_prefix=f"slurmjob-{kind.value}"
        )
    return pool


async def run_in(kind: Pool, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`asyncio.to_thread` on the pool of `kind` (the context goes along, as there)."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await loop.run_in_executor(executor(kind), call)
