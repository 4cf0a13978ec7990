"""Give the allocator's free memory back to the system, now and then.

A burst (the first list of 10,000 SlurmJobs, a mass apply) makes a task, a queue, a body and a
patch per object at once. When the burst ends most of that is freed, but a few long-lived
objects allocated in its middle keep the heap's high-water mark: the freed pages stay with the
process and RSS never falls. With Python's objects in glibc's heap (`PYTHONMALLOC=malloc`, as
the image and the chart run it), `malloc_trim(0)` hands back every free page of the heap, not
only its top. Without glibc (musl, macOS) there is nothing to call and nothing is done.
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


@functools.cache
def _trim_function() -> Callable[[int], int] | None:
    """glibc's malloc_trim, by its soname (no `find_library`: that runs ldconfig, at every
    start of every process that imports this); None without glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def available() -> bool:
    return _trim_function() is not None


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
    trim_function = _trim_function()
    if trim_function is None:
        return 0
    before = resident_bytes()
    trim_function(0)
    after = resident_bytes()
    if before is None or after is None:
        return 0
    return max(0, before - after)


async def trim_periodically(interval: float, on_trim: Callable[[int], None]) -> None:
    """Trim every `interval` seconds until cancelled; `on_trim` gets the bytes returned."""
    if interval <= 0 or _trim_function() is None:
        if interval > 0:
            log.info("memory trim: no glibc malloc_trim here, nothing to do")
        return
    while True:
        await asyncio.sleep(interval)
        on_trim(trim())
