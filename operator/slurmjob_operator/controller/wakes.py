"""The one place that owns "look at this resource again at time t".

Every wait ends here: a submit that waits for Kueue, its upstreams or its retry's due time; a
dependent woken by its upstream; an eviction still ending; a reconcile that failed. kopf's
create, resume and update handlers hand their reconcile to `attempt` and always return: a wait
costs no apiserver write (a kopf retry writes its progress annotations on the object), and an
unexpected exception is logged, counted and becomes a wake with backoff instead of a dropped
resource. Deletion keeps kopf's retry: the finalizer must stay until the job has ended.

Bounded by design: one pending wake per resource, the earliest wins; a wake runs its target
once, which reads the resource afresh (a deleted one is dropped there). Nothing is persisted:
after a restart kopf's resume of every object derives the waits again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.controller.resource import RetryLater
from slurmjob_operator.metrics import Metrics

log = logging.getLogger(__name__)


class Handle(Protocol):
    def cancel(self) -> None: ...


#: (delay, callback) -> something to cancel: the event loop's call_later, or a test's clock.
Timer = Callable[[float, Callable[[], None]], Handle]
Target = Callable[[ObjectRef], Awaitable[None]]


def reconcile_failed(metrics: Metrics) -> Callable[[], None]:
    """What counts a reconcile that failed unexpectedly."""
    return metrics.reconcile_errors_total.inc


def _loop_timer(delay: float, callback: Callable[[], None]) -> Handle:
    return asyncio.get_running_loop().call_later(delay, callback)


@dataclass
class _Pending:
    ref: ObjectRef
    due: float
    handle: Handle


class Wakes:
    """Pending wakes by uid, each on a timer; fired, a wake runs the target under `attempt`."""

    def __init__(
        self,
        target: Target | None = None,
        *,
        backoff: float,
        on_error: Callable[[], None] | None = None,
        timer: Timer = _loop_timer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`target(ref)`: reconcile `ref` from a fresh read (`bind` sets it when the owner
        is made later); `backoff`: seconds before a reconcile that failed unexpectedly is
        tried again; `on_error`: counts such failures (a metric)."""
        self._target = target
        self.backoff = backoff
        self._on_error = on_error
        self._timer = timer
        self._clock = clock
        self._pending: dict[str, _Pending] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    def bind(self, target: Target) -> None:
        self._target = target

    def at(self, ref: ObjectRef, delay: float) -> None:
        """Look at `ref` again in `delay` seconds, unless a wake of it is due sooner."""
        if self._closed:
            return
        due = self._clock() + max(0.0, delay)
        pending = self._pending.get(ref.uid)
        if pending is not None:
            if pending.due <= due:
                return
            pending.handle.cancel()
        handle = self._timer(max(0.0, delay), lambda: self._fire(ref.uid))
        self._pending[ref.uid] = _Pending(ref, due, handle)

    def due_in(self, uid: str) -> float | None:
        """Seconds until the pending wake of `uid` (None: none is pending)."""
        pending = self._pending.get(uid)
        return None if pending is None else max(0.0, pending.due - self._clock())

    def forget(self, uid: str) -> None:
        """The resource is gone: its pending wake is dropped."""
        pending = self._pending.pop(uid, None)
        if pending is not None:
            pending.handle.cancel()

    def __len__(self) -> int:
        return len(self._pending)

    async def attempt(self, ref: ObjectRef, reconcile: Awaitable[None]) -> None:
        """Await a reconcile of `ref`; when it must run again (RetryLater), or failed, a wake
        after its delay (or the backoff). Never raises but on cancellation."""
        try:
            await reconcile
        except RetryLater as exc:
            self.at(ref, exc.delay)
        except Exception:
            log.exception(
                "%s/%s: reconcile failed; trying again in %.0f s",
                ref.namespace,
                ref.name,
                self.backoff,
            )
            if self._on_error is not None:
                self._on_error()
            self.at(ref, self.backoff)

    def _fire(self, uid: str) -> None:
        pending = self._pending.pop(uid, None)
        if pending is None or self._target is None or self._closed:
            return
        target = self._target
        self._spawn(pending.ref, target)

    def run(
        self,
        ref: ObjectRef,
        reconcile: Target,
        done: Callable[[], None] | None = None,
    ) -> bool:
        """Run `reconcile(ref)` now as a wake does (a task of its own, under `attempt`,
        cancelled by `close`), then `done()` however it ended, even cancelled before it
        started. False, and nothing run, once closed."""
        if self._closed:
            return False
        self._spawn(ref, reconcile, done)
        return True

    def _spawn(
        self, ref: ObjectRef, target: Target, done: Callable[[], None] | None = None
    ) -> None:
        async def run() -> None:
            # The reconcile is made here, not by the caller: a task cancelled before it
            # starts leaves no coroutine behind that was never awaited.
            await self.attempt(ref, target(ref))

        task = asyncio.get_running_loop().create_task(
            run(), name=f"slurmjob-wake-{ref.namespace}/{ref.name}"
        )
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if done is not None:
            task.add_done_callback(lambda _: done())

    async def drain(self) -> None:
        """Wait for the wakes due now and those running, and what they woke for now in turn
        (tests, and a clean stop); later ones stay pending."""
        while True:
            if self._running:
                await asyncio.gather(*list(self._running), return_exceptions=True)
            elif any(p.due <= self._clock() for p in self._pending.values()):
                await asyncio.sleep(0.001)  # its timer fires on the loop's next turns
            else:
                return

    async def close(self) -> None:
        """No more wakes: the pending ones dropped, the running ones cancelled."""
        self._closed = True
        for pending in self._pending.values():
            pending.handle.cancel()
        self._pending.clear()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*list(self._running), return_exceptions=True)
