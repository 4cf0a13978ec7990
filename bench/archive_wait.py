"""How long one namespace's finalizer waits for another's archive entry (issue 42).

The claim under test: archiving one entry at the per-entry cap for namespace A (its logs read,
redacted and written: seconds) must not hold up namespace B's finalizer; B's archiving step
waits at most 5 s at the 99th percentile. The bench runs the operator's own `Archiver` (real
files below a temporary directory, redaction with a few secret values, the real
`write_entry`; the Kubernetes edge is a stand-in that only answers the secret values and
takes Events) twice in the same process:

* `before`: one slot for everyone, what `controller/archiving.py` had (`Semaphore(1)`);
* `after`: `ArchiveSlots`, one writer per owner and `ARCHIVE_WRITERS` owners at once.

Each round archives A's entry (`--entry-mib` of logs: array-task files of the file cap,
16 MiB, each with a secret value to hide every 64 KiB) and, while it runs, starts `--per-round`
deletions of B (one small entry each) spread evenly over the time A's entry took alone (a
calibration run before the rounds). A B deletion's wait is the time its `archive()` took.

    .venv/bin/python -m bench.archive_wait --rounds 5 --per-round 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.archiving import Archiver, ArchiveSlots
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.core import naming

MIB = 1024**2
HIDDEN_VALUE = "bench-secret-value-7f3a"


class OneForAll(ArchiveSlots):
    """The design before: one entry written at a time, whoever it belongs to."""

    def __init__(self) -> None:
        super().__init__()
        self._one = asyncio.Semaphore(1)

    @asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        async with self._one:
            yield


class Edge:
    """The part of `ResourceEdge` the archiver uses: the secret values, the Events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def redactions(self, view: ResourceView) -> list[str]:
        return [HIDDEN_VALUE, "another-secret-4411"]

    async def event(self, ref: Any, type_: str, reason: str, text: str) -> None:
        self.events.append((type_, reason))


class Namespaces:
    async def namespace_uid(self, name: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def view_of(namespace: str, name: str, uid: str) -> ResourceView:
    body = {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {},
        "status": {"phase": "Succeeded", "attempts": [{"number": 1, "jobName": name}]},
    }
    return ResourceView.of(body)


def stage(settings: Settings, view: ResourceView, files: int, file_bytes: int) -> None:
    """The attempt's logs: `files` array-task files of `file_bytes`, text lines with the
    secret every 64 KiB (written once, re-read every round)."""
    ref = view.ref
    base = naming.staging_dir(settings.storage_root, ref.namespace, ref.name, ref.uid, 1)
    base.mkdir(parents=True, mode=0o700, exist_ok=True)
    line = b"step 000123 loss 0.4242 lr 0.0003 tokens/s 181234 grad-norm 1.0101 ok\n"
    block = line * (64 * 1024 // len(line)) + f"token={HIDDEN_VALUE}\n".encode()
    body = (block * (file_bytes // len(block) + 1))[:file_bytes]
    for task in range(files):
        (base / f"stdout-{task}.log").write_bytes(body)
    (base / naming.SCRIPT_FILE).write_text("#!/bin/bash\nsrun python3 train.py\n")


@dataclass
class Figures:
    design: str
    a_seconds: list[float]
    b_waits: list[float]
    b_overtook: int
    b_while_a: int

    @property
    def summary(self) -> dict[str, float]:
        waits = sorted(self.b_waits)
        return {
            "b_p50": statistics.median(waits),
            "b_p99": waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))],
            "b_max": waits[-1],
            "a_median": statistics.median(self.a_seconds),
        }


async def run_design(
    design: str, settings: Settings, a: ResourceView, rounds: int, per_round: int, spread: float
) -> Figures:
    slots = OneForAll() if design == "before" else ArchiveSlots()
    archiver = Archiver(
        settings, cast(ResourceEdge, Edge()), Namespaces(), lambda ns: None, slots=slots
    )
    figures = Figures(design, [], [], 0, 0)
    for _ in range(rounds):
        started = time.perf_counter()
        a_task = asyncio.create_task(archiver.archive(a))
        await asyncio.sleep(0)  # A takes its slot first, as the deletion that came first
        b_tasks = []
        for index in range(per_round):
            due = started + spread * index / per_round
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            b = view_of("team-b", "eval", str(uuid.uuid4()))
            stage(settings, b, 1, 4096)
            b_tasks.append(asyncio.create_task(timed(archiver, b, a_task)))
        results = await asyncio.gather(*b_tasks)
        await a_task
        figures.a_seconds.append(time.perf_counter() - started)
        for wait, overtook, while_a in results:
            figures.b_waits.append(wait)
            figures.b_overtook += overtook
            figures.b_while_a += while_a
    return figures


async def timed(
    archiver: Archiver, view: ResourceView, a: asyncio.Task[None]
) -> tuple[float, bool, bool]:
    """B's wait, whether it ended before A's entry did, whether A was writing at its start."""
    while_a = not a.done()
    start = time.perf_counter()
    await archiver.archive(view)
    return time.perf_counter() - start, not a.done(), while_a


async def bench(entry_mib: int, rounds: int, per_round: int, workdir: Path) -> dict[str, Any]:
    storage, archive = workdir / "storage", workdir / "archive"
    storage.mkdir(mode=0o700)
    archive.mkdir(mode=0o700)
    settings = Settings(
        storage_root=storage,
        archive_root=archive,
        archive_entry_max_bytes=max(entry_mib, 1) * MIB,
        archive_max_bytes=max(16 * entry_mib * MIB, 2**20),
    )
    file_cap = settings.archive_file_max_bytes
    files = max(1, entry_mib * MIB // file_cap)
    a = view_of("team-a", "train", str(uuid.uuid4()))
    stage(settings, a, files, min(file_cap, entry_mib * MIB))
    calibration = Archiver(settings, cast(ResourceEdge, Edge()), Namespaces(), lambda ns: None)
    started = time.perf_counter()
    await calibration.archive(a)
    alone = time.perf_counter() - started
    b = view_of("team-b", "eval", str(uuid.uuid4()))
    stage(settings, b, 1, 4096)
    started = time.perf_counter()
    await calibration.archive(b)
    b_alone = time.perf_counter() - started
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}",
        "entry_bytes": settings.archive_entry_cap,
        "a_alone_seconds": alone,
        "b_alone_seconds": b_alone,
        "rounds": rounds,
        "per_round": per_round,
    }
    for design in ("before", "after"):
        figures = await run_design(design, settings, a, rounds, per_round, alone)
        out[design] = {**figures.summary, **asdict(figures)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Settings().archive_entry_cap // MIB
    parser.add_argument("--entry-mib", type=int, default=default, help="A's entry (MiB)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="archive-wait-") as tmp:
        result = asyncio.run(bench(args.entry_mib, args.rounds, args.per_round, Path(tmp)))
    for design in ("before", "after"):
        figures = result[design]
        print(
            f"{design:6s} B wait p50 {figures['b_p50']:.3f} s, p99 {figures['b_p99']:.3f} s, "
            f"max {figures['b_max']:.3f} s over {len(figures['b_waits'])}; "
            f"A's entry {figures['a_median']:.2f} s (median); "
            f"B ended before A {figures['b_overtook']}/{figures['b_while_a']}"
        )
    print(
        f"alone: A {result['a_alone_seconds']:.2f} s for {result['entry_bytes']} bytes, "
        f"B {result['b_alone_seconds']:.3f} s"
    )
    if args.out is not None:
        with contextlib.suppress(FileExistsError):
            args.out.parent.mkdir(parents=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
