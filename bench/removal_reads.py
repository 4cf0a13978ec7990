"""Another tenant's log reads while a checkpoint directory of 100,000 files is removed
(issue 42).

The claim under test: a checkpoint removal, however many files the job left, never makes
another tenant's log read wait for it. Removals run in bounded passes on the operator's
removals pool and log reads on their own pool (`storage.executors`); before, a removal was one
`rmtree` in asyncio's default pool, which the log reads shared.

For each path the bench builds the checkpoint tree(s) in a temporary storage root (files
spread over directories of 1,000), then starts the removal(s) and, until every file is gone,
reads another tenant's small log (4 KiB, both tails) every 10 ms with the function the status
tails use, measuring each read's latency (a read over `READ_TIMEOUT` is what the log API
answers 504):

* `operator`: `controller.removals.remove_checkpoint`, as the finalizer calls it (a
  `RemovalSweep` running, which takes over after the finalizer's passes), and the reads through
  `controller.following.read_tails` (the log-reads pool);
* `old`: the removal as it was (`shutil.rmtree` from the resource directory's descriptor, in
  `asyncio.to_thread`), and the same read in `asyncio.to_thread`.

`--deletions k` splits the files among k SlurmJobs deleted at once; asyncio's default pool has
`min(32, cpus + 4)` threads, so k at least that many is "a few deletions" filling it.

    .venv/bin/python -m bench.removal_reads --files 100000 --deletions 1
    .venv/bin/python -m bench.removal_reads --files 100000 --deletions 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import stat
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.following import read_tails
from slurmjob_operator.controller.removals import RemovalSweep, remove_checkpoint
from slurmjob_operator.core import naming
from slurmjob_operator.storage.executors import SIZES, Pool, close_pools, executor, open_pools
from slurmjob_operator.storage.logs import READ_TIMEOUT, read_attempt_logs
from slurmjob_operator.storage.nofollow import below, dir_owners, job_owner, lstat_at, walk

PER_DIR = 1_000
READ_PERIOD = 0.01
READER = ObjectRef("team-b", "reader", "22222222-0000-0000-0000-000000000000")


@dataclass(frozen=True)
class Figures:
    path: str
    files: int
    deletions: int
    reads: int
    timeouts: int  # reads over READ_TIMEOUT: a 504 of the log API
    p50_ms: float
    p99_ms: float
    max_ms: float
    removal_s: float


def deleted(index: int) -> ObjectRef:
    return ObjectRef("team-a", f"chain-{index}", f"{index:08d}-1111-0000-0000-000000000000")


def build(root: Path, files: int, deletions: int) -> list[ObjectRef]:
    """The checkpoint trees of `deletions` SlurmJobs holding `files` empty files in all, and
    the reader's attempt directory with its two logs."""
    refs = [deleted(i) for i in range(deletions)]
    for number, ref in enumerate(refs):
        top = naming.checkpoint_dir(root, ref.namespace, ref.name, ref.uid)
        share = files // deletions + (1 if number < files % deletions else 0)
        for first in range(0, share, PER_DIR):
            sub = top / f"step-{first // PER_DIR}"
            sub.mkdir(parents=True)
            for i in range(first, min(share, first + PER_DIR)):
                os.close(os.open(sub / f"shard-{i}.pt", os.O_CREAT | os.O_WRONLY, 0o644))
    logs = naming.staging_dir(root, READER.namespace, READER.name, READER.uid, 1)
    logs.mkdir(parents=True)
    line = b"epoch 12 step 3400 loss 0.4312 lr 0.0003\n"
    for name in naming.log_files(None):
        (logs / name).write_bytes(line * (4096 // len(line)))
    return refs


def old_remove(settings: Settings, ref: ObjectRef) -> None:
    """The removal as it was before issue 42: one rmtree from the resource directory's
    descriptor (no link followed), whatever the tree holds."""
    path = naming.resource_dir(settings.storage_root, ref.namespace, ref.name, ref.uid)
    parts = below(settings.storage_root, path)
    with walk(settings.storage_root, parts, dir_owners(job_owner(settings))) as resource:
        entry = lstat_at(resource, naming.CHECKPOINT_DIR)
        if entry is not None and stat.S_ISDIR(entry.st_mode):
            shutil.rmtree(naming.CHECKPOINT_DIR, dir_fd=resource, ignore_errors=True)


async def _no_event(ref: ObjectRef, kind: str, reason: str, text: str) -> None:
    return None


async def _operator_removal(settings: Settings, refs: list[ObjectRef]) -> None:
    """The finalizers' capped passes, then the sweep's, one at a time, until none is left
    (what `RemovalSweep.run` does without its idle sleeps)."""
    sweep = RemovalSweep([settings.storage_root])
    await asyncio.gather(*(remove_checkpoint(settings, r, _no_event, sweep) for r in refs))
    while await sweep.sweep_once():
        pass


async def _old_removal(settings: Settings, refs: list[ObjectRef]) -> None:
    await asyncio.gather(*(asyncio.to_thread(old_remove, settings, r) for r in refs))


async def _operator_read(settings: Settings, base: Path) -> None:
    await read_tails(settings, base, [], None)


async def _old_read(settings: Settings, base: Path) -> None:
    read = asyncio.to_thread(read_attempt_logs, settings, base, [], None)
    await asyncio.wait_for(read, READ_TIMEOUT)


async def _reads_until(
    done: asyncio.Future[None], read: Callable[[], Awaitable[None]]
) -> tuple[list[float], int]:
    latencies: list[float] = []
    timeouts = 0
    while not done.done():
        start = time.perf_counter()
        try:
            await read()
        except TimeoutError:
            timeouts += 1
        latencies.append(time.perf_counter() - start)
        await asyncio.sleep(READ_PERIOD)
    return latencies, timeouts


async def measure(root: Path, path: str, files: int, deletions: int) -> Figures:
    """Build, then remove by `path` ("operator" or "old") while reading; the figures."""
    settings = Settings(storage_root=root)
    refs = build(root, files, deletions)
    base = naming.staging_dir(root, READER.namespace, READER.name, READER.uid, 1)
    if path == "operator":
        removal, read = _operator_removal(settings, refs), _operator_read
    else:
        removal, read = _old_removal(settings, refs), _old_read
    start = time.perf_counter()
    task = asyncio.ensure_future(removal)
    latencies, timeouts = await _reads_until(task, lambda: read(settings, base))
    await task
    elapsed = time.perf_counter() - start
    for ref in refs:
        assert not naming.checkpoint_dir(root, ref.namespace, ref.name, ref.uid).exists()
    cuts = (
        statistics.quantiles(latencies, n=100, method="inclusive")
        if len(latencies) > 1
        else latencies * 99
    )
    return Figures(
        path=path,
        files=files,
        deletions=deletions,
        reads=len(latencies),
        timeouts=timeouts,
        p50_ms=round(statistics.median(latencies) * 1000, 2),
        p99_ms=round(cuts[98] * 1000, 2),
        max_ms=round(max(latencies) * 1000, 2),
        removal_s=round(elapsed, 2),
    )


async def reads_while_removals_blocked(root: Path, files: int, reads: int = 5) -> tuple[int, int]:
    """The structural check behind the smoke test: every thread of the removals pool is held,
    a checkpoint removal is started (it can only wait), and the reader reads `reads` times.
    Returns (reads answered, files still there when they were): all reads and all files,
    unless log reads wait behind removals."""
    open_pools()
    settings = Settings(storage_root=root)
    [ref] = build(root, files, 1)
    base = naming.staging_dir(root, READER.namespace, READER.name, READER.uid, 1)
    release = threading.Event()
    held = [executor(Pool.REMOVALS).submit(release.wait) for _ in range(SIZES[Pool.REMOVALS])]
    removal = asyncio.create_task(remove_checkpoint(settings, ref, _no_event, None))
    answered = 0
    try:
        for _ in range(reads):
            await read_tails(settings, base, [], None)
            answered += 1
    except TimeoutError:
        pass
    top = naming.checkpoint_dir(root, ref.namespace, ref.name, ref.uid)
    left = sum(len(names) for _, _, names in os.walk(top))
    release.set()
    for future in held:
        future.result()
    await removal
    return answered, left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--deletions", type=int, default=1)
    parser.add_argument("--paths", default="old,operator", help="comma-separated, in order")
    parser.add_argument("--dir", type=Path, default=None, help="where the trees are built")
    args = parser.parse_args(argv)
    results = []
    for path in args.paths.split(","):
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="removal-reads-") as tmp:
            figures = asyncio.run(measure(Path(tmp), path, args.files, args.deletions))
            close_pools()
        results.append(asdict(figures))
        print(json.dumps(asdict(figures)), file=sys.stderr)
    print(json.dumps({"default_pool": min(32, (os.cpu_count() or 1) + 4), "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
