"""Removing a deleted SlurmJob's checkpoint directory in bounded passes (issue 42): the
finalizer's few passes (`remove_checkpoint`), and the background sweep that finishes what
they leave (`RemovalSweep`).

Every pass runs on the removals pool (`storage.executors`), never on the default pool that
staging and other reads share, nor on the log-reads pool. The finalizer runs at most
`FINALIZER_PASSES` passes; what is left then stays in the trash (`storage.trash`), the
deletion goes on with a `CheckpointNotRemoved` Event saying so, and the sweep removes the rest
one pass at a time. After a restart the sweep finds what is left by listing the trash."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.config import Settings
from slurmjob_operator.core.removal import (
    DEFAULT_BOUNDS,
    FINALIZER_PASSES,
    After,
    PassBounds,
    after_pass,
)
from slurmjob_operator.storage import checkpoint, trash
from slurmjob_operator.storage.executors import Pool, run_in

log = logging.getLogger(__name__)

#: Trash entries one scan of the sweep lists at most.
SCAN_ENTRIES = 1_000
#: Seconds the sweep sleeps when nothing is left to remove, unless a finalizer wakes it.
IDLE_INTERVAL = 300.0

#: Posts an Event: (ref, type, reason, message).
EventPoster = Callable[[ObjectRef, str, str, str], Awaitable[None]]


class RemovalSweep:
    """One task for the operator (started and stopped with it): one pass at a time on the
    trash of every storage root, until nothing is left there but what cannot be removed."""

    def __init__(
        self,
        roots: Iterable[Path],
        *,
        bounds: PassBounds = DEFAULT_BOUNDS,
        finalizer_passes: int = FINALIZER_PASSES,
        scan: int = SCAN_ENTRIES,
        interval: float = IDLE_INTERVAL,
    ) -> None:
        """`bounds`: of every pass, the finalizers' too; `finalizer_passes`: the passes a
        finalizer runs before it leaves the rest to the sweep."""
        self.roots = sorted(set(roots))
        self.bounds = bounds
        self.finalizer_passes = finalizer_passes
        self.scan = scan
        self.interval = interval
        self._wake = asyncio.Event()
        # Entries a pass found only unremovable things in: retried after a restart (an admin
        # may have fixed them), not at every pass. The scan lists at most `scan` names, so
        # more stuck entries than that hide the rest until a restart.
        self.stuck: set[tuple[Path, str]] = set()

    def wake(self) -> None:
        self._wake.set()

    async def sweep_once(self) -> bool:
        """One pass on one leftover; False when there is none left to work on."""
        for root in self.roots:
            try:
                names = await run_in(Pool.REMOVALS, trash.entries, root, self.scan)
            except OSError as exc:  # UnsafePath too: not the operator's own directory
                log.warning("cannot sweep the removals under %s: %s", root, exc)
                continue
            for name in names:
                if (root, name) in self.stuck:
                    continue
                outcome = await run_in(Pool.REMOVALS, trash.removal_pass, root, name, self.bounds)
                if after_pass(outcome, 1, None) is After.STUCK:
                    self.stuck.add((root, name))
                    log.warning(
                        "cannot remove %s in full: %s",
                        root / trash.TRASH_DIR / name,
                        "; ".join(outcome.problems[:3]) or "nothing removable is left",
                    )
                return True
        return False

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                busy = await self.sweep_once()
            except OSError as exc:  # a pass's trash gone meanwhile, or refused
                log.warning("cannot sweep the removals: %s", exc)
                busy = False
            if not busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)


async def remove_checkpoint(
    settings: Settings,
    ref: ObjectRef,
    event: EventPoster,
    sweep: RemovalSweep | None,
) -> bool:
    """Remove the checkpoint directory of `ref` as far as the sweep's `finalizer_passes` go
    (all of it when there is no `sweep` to finish it: the local runner), and say in a
    `CheckpointNotRemoved` Event what is left. True when something stays in the resource
    directory."""
    bounds = sweep.bounds if sweep is not None else DEFAULT_BOUNDS
    cap = sweep.finalizer_passes if sweep is not None else None
    try:
        removal = await run_in(
            Pool.REMOVALS, checkpoint.set_aside, settings, ref.namespace, ref.name, ref.uid
        )
    except OSError as exc:  # UnsafePath too
        await event(ref, "Warning", "CheckpointNotRemoved", f"the checkpoint directory: {exc}")
        return True
    if removal is None:
        return False
    passes, step = 0, After.AGAIN
    problems: tuple[str, ...] = ()
    while step is After.AGAIN:
        outcome = await run_in(Pool.REMOVALS, checkpoint.removal_pass, settings, removal, bounds)
        passes += 1
        step = after_pass(outcome, passes, cap)
        problems = outcome.problems
    if step is After.DONE:
        return False
    if step is After.HAND_OVER:
        background = removal.trash is not None and sweep is not None
        if background and sweep is not None:
            sweep.wake()
        rest = "in the background" if background else "with the staging directory"
        text = (
            f"the checkpoint directory holds more than {passes} removal passes take "
            f"({bounds.entries} entries each); the deletion goes on and the rest is removed {rest}"
        )
    else:
        first = problems[0] if problems else f"{removal.where}: nothing removable is left"
        text = (
            f"the checkpoint directory was not removed in full ({len(problems)} path(s)); "
            f"first: {first}"
        )
    await event(ref, "Warning", "CheckpointNotRemoved", text)
    return removal.trash is None
