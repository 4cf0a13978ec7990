"""Give the allocator's free memory back to the system, now and then.

A burst (the first list of 10,000 SlurmJobs, a mass apply) makes a task, a queue, a body and a
patch per object at once. When the burst ends most of that is freed, but a few long-lived
objects allocated in its middle keep the heap's high-water mark: the freed pages stay with the
process and RSS never falls. The image and the chart run the operator with Python's objects in
the C allocator (`PYTHONMALLOC=malloc`) and that allocator jemalloc (`LD_PRELOAD`), whose
size-classed runs fragment less than glibc's heap after such a burst and which returns unused
pages on its own after `dirty_decay_ms` (docs/benchmarks.md measured both). The periodic trim
here is what makes an idle process return them too: jemalloc's purge of every arena when
jemalloc is the process's malloc, else glibc's `malloc_trim(0)` (every free page of the heap,
not only its top); with neither (musl, macOS) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


#: jemalloc's `mallctl` name for "every arena" (MALLCTL_ARENAS_ALL).
_PURGE_ALL = b"arena.4096.purge"


@functools.cache
def jemalloc_mallctl() -> Callable[..., int] | None:
    """jemalloc's `mallctl(name, oldp, oldlenp, newp, newlen)` when jemalloc is this process's
    malloc (the symbol is among those the process was linked or preloaded with), else None."""
    try:
        mallctl = ctypes.CDLL(None).mallctl
    except (OSError, AttributeError):
        return None
    mallctl.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    mallctl.restype = ctypes.c_int
    function: Callable[..., int] = mallctl
    return function


@functools.cache
def _trimmer() -> tuple[str, Callable[[], object]] | None:
    """The allocator and what returns its free pages: jemalloc's purge when jemalloc is this
    process's malloc, else glibc's malloc_trim (by its soname: no `find_library`, which runs
    ldconfig at every start of every process that imports this), else None."""
    mallctl = jemalloc_mallctl()
    if mallctl is not None:
        return "jemalloc", lambda: mallctl(_PURGE_ALL, None, None, None, 0)
    try:
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return "glibc", lambda: malloc_trim(0)


def allocator() -> str | None:
    """Which allocator the trim talks to: "jemalloc", "glibc" or None."""
    trimmer = _trimmer()
    return trimmer[0] if trimmer is not None else None


def available() -> bool:
    return _trimmer() is not None


def resident_bytes() -> int | None:
    """This process's resident set from /proc (None where there is no /proc)."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def trim() -> int:
    """Return the heap's free pages to the system; the resident bytes that went (0 when none,
    or where it cannot be measured or done). It takes the allocator's lock for as long as it
    walks the heap: milliseconds for a heap of a few hundred MB."""
    trimmer = _trimmer()
    if trimmer is None:
        return 0
    before = resident_bytes()
    trimmer[1]()
    after = resident_bytes()
    if before is None or after is None:
        return 0
    return max(0, before - after)


async def trim_periodically(interval: float, on_trim: Callable[[int], None]) -> None:
    """Trim every `interval` seconds until cancelled; `on_trim` gets the bytes returned."""
    trimmer = _trimmer()
    if interval <= 0 or trimmer is None:
        if interval > 0:
            log.info("memory trim: neither jemalloc nor glibc's malloc_trim here, nothing to do")
        return
    # Which one: an image without jemalloc runs on glibc's heap, with other figures (helm.md).
    log.info("memory trim: %s, every %g s", trimmer[0], interval)
    while True:
        await asyncio.sleep(interval)
        on_trim(trim())
