"""Dependents woken by their upstreams' changes, bounded per namespace (`core.wakes`: 64 at
once, 64 more per waiting interval): whoever writes an upstream's status chooses how often it
changes, and each wake costs the dependent's own read. A wake refused waits, once per dependent
however many changes ask for it, and is made when the namespace has one again: never dropped.
A wake allowed goes to the one wake service (`controller.wakes`), which runs it and looks at
it again when it must wait or failed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.controller.wakes import Wakes
from slurmjob_operator.core.wakes import WakeQueue

#: Dependents woken per namespace: as many at once, as many again per waiting interval.
WAKES_PER_INTERVAL = 64
#: The shortest pause between two looks at the wakes that wait (seconds).
MIN_TICK = 0.5


class DependentWakes:
    def __init__(
        self,
        service: Wakes,
        interval: float,
        wanted: Callable[[str], bool],
        clock: Callable[[], float],
    ) -> None:
        """`wanted(uid)`: whether a waiting wake is still wanted when its turn comes (the
        dependent still depends on something, or is queued behind its upstreams)."""
        self._service = service
        self._queue: WakeQueue[ObjectRef] = WakeQueue(WAKES_PER_INTERVAL, interval)
        self._wanted = wanted
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    def __len__(self) -> int:
        """Wakes waiting for their namespace's turn."""
        return len(self._queue)

    def wake(self, ref: ObjectRef, *, not_before: float | None = None) -> None:
        """Reconcile `ref` soon: now when its namespace has a wake left, else once it has
        one again (and no sooner than `not_before`); once however often it is asked for."""
        if self._woken(ref.uid):
            return
        now = self._clock()
        if not self._queue.ask(ref.namespace, ref.uid, ref, now, not_before=not_before):
            self._arm(self._queue.due_at(ref.namespace, now, not_before))
            return
        self._start(ref)

    def release(self) -> None:
        """Wake the dependents that waited and may be woken now (the timer's)."""
        self._timer, self._timer_at = None, None
        now = self._clock()
        for ref in self._queue.due(now, self._wanted):
            if not self._woken(ref.uid):
                self._start(ref)
        later = self._queue.next_at(now)
        if later is not None:
            self._arm(later)

    def _arm(self, at: float) -> None:
        """Look at the waiting wakes again at `at` (the clock's), unless already sooner."""
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(MIN_TICK, at - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self.release)
        self._timer_at = at

    def _woken(self, uid: str) -> bool:
        """A wake of `uid` is due now already (not yet run)."""
        return self._service.due_in(uid) == 0.0

    def _start(self, ref: ObjectRef) -> None:
        # The wake service runs it (after the event that woke it is handled), and looks at it
        # again when it must wait or its reconcile failed.
        self._service.at(ref, 0.0)

    async def drain(self) -> None:
        """Wait for the dependents woken so far (tests, and a clean stop)."""
        await self._service.drain()
