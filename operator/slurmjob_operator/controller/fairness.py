"""A fair limiter: at most `limit` holders at once, the waiters served round-robin by key.

Why: every SlurmJob's handler would otherwise render, stage and submit at once, so memory
and slurmrestd load follow the backlog (8,000 SlurmJobs created before the operator starts
peaked at 2.5 GB). A plain semaphore bounds that but is FIFO across everyone, so one
namespace that queues 10,000 submits delays another namespace's single submit by all of
them. Here the waiters are grouped by key (the namespace) and a freed slot goes to the next
key, in round-robin order, among the keys that have waiters (FIFO within a key): a key that
starts waiting is served after at most one grant to each key already waiting.

Properties the submission side relies on:

* never more than `limit` holders; a slot freed while others wait is handed straight to the
  next waiter, so every slot is taken while anyone waits and a newcomer cannot jump the
  queue;
* a holder may give its slot back before its body ends (`Held.release`, once; the end of the
  body then releases nothing): a submit frees its slot as soon as its POST has been answered;
* cancellation-safe: a waiter cancelled while waiting leaves nothing behind (nor its key,
  once that key has no other waiter); one cancelled just after it was granted passes the slot
  on; a holder that is cancelled releases its slot (`slot` is a context manager);
* no polling: each waiter awaits its own future, resolved by the release that grants it;
* O(1) per grant, per arrival and per cancellation (ordered dicts: a FIFO that can also drop
  any entry, the key ring likewise), and memory only for the current waiters;
* a waiter may also be parked (`park`): no task and no future, only a token and what to start
  once granted, so a burst of 10,000 creates waits as 10,000 small entries instead of 10,000
  kopf handlers each holding its body, its task and its handler's machinery (the burst's
  memory high-water mark: docs/benchmarks.md). A token parked again keeps its place and takes
  the newer start.

Lock order: a slot is never awaited while a resource's lock is held (`Submission.reconcile`
takes the slot first, then the lock). A holder only ever waits for its own resource's lock,
and whoever holds that lock waits for no slot, so holders always finish and no cycle exists.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Held:
    """One slot held: `release` gives it back, the first call only."""

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    @property
    def held(self) -> bool:
        return self._release is not None

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


#: What a parked waiter starts once granted: True when it took the slot (it releases the
#: `Held` it was given, once its work is done), False when it cannot run any more (its owner
#: closed): the slot then goes to the next waiter. It must not run the work synchronously.
Start = Callable[[Held], bool]


class FairLimiter(Generic[K]):
    """At most `limit` holders; waiters grouped by key and served round-robin across keys.

    `on_waiting(n)` is called with the number of waiters whenever it changes (a gauge).
    Single event loop only, like the rest of the controller."""

    def __init__(self, limit: int, *, on_waiting: Callable[[int], None] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._limit = limit
        self._held = 0
        self._waiting = 0
        self._on_waiting = on_waiting
        # Per key, its waiters in arrival order; the ring holds exactly the keys with waiters,
        # the next one to serve first.
        # A waiter is a future (`acquire`) mapped to None, or a parked token mapped to its start.
        self._queues: dict[K, OrderedDict[Hashable, Start | None]] = {}
        self._ring: OrderedDict[K, None] = OrderedDict()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def held(self) -> int:
        """Slots held now (a waiter granted but not yet resumed counts as holding)."""
        return self._held

    @property
    def waiting(self) -> int:
        return self._waiting

    def waiting_for(self, key: K) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    @asynccontextmanager
    async def slot(self, key: K) -> AsyncIterator[Held]:
        """Hold one slot for the body, waiting in `key`'s queue when none is free; the body
        may give it back early through the `Held` it is given."""
        await self.acquire(key)
        held = Held(self.release)
        try:
            yield held
        finally:
            held.release()

    def try_slot(self) -> Held | None:
        """A slot at once, or None when every slot is taken (or anyone waits)."""
        if self._held < self._limit:
            self._held += 1
            return Held(self.release)
        return None

    def park(self, key: K, token: Hashable, start: Start) -> None:
        """Wait in `key`'s queue as `token` without a task: `start(held)` is called once a
        slot is granted (at once when one is free). A token already parked keeps its place
        and takes this `start` instead."""
        queue = self._queues.get(key)
        if queue is not None and token in queue:
            queue[token] = start
            return
        held = self.try_slot()
        if held is not None:
            if not start(held):
                self.release()
            return
        if queue is None:
            queue = self._queues[key] = OrderedDict()
            self._ring[key] = None
        queue[token] = start
        self._changed(+1)

    async def acquire(self, key: K) -> None:
        """Take a slot (pair with `release`; `slot` does both)."""
        if self._held < self._limit:
            # A free slot means nobody waits (a release hands its slot straight over).
            self._held += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = OrderedDict()
            self._ring[key] = None
        queue[future] = None
        self._changed(+1)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted, then cancelled before it resumed: pass it on
            else:
                self._discard(key, future)
            raise

    def release(self) -> None:
        """Free a slot: hand it to the next waiter of the next key, if any."""
        if self._held < 1:
            raise RuntimeError("release of a FairLimiter slot that is not held")
        while self._ring:
            key = next(iter(self._ring))
            queue = self._queues[key]
            waiter, start = queue.popitem(last=False)
            if queue:
                self._ring.move_to_end(key)
            else:
                del self._queues[key]
                del self._ring[key]
            self._changed(-1)
            if start is not None:
                if start(Held(self.release)):
                    return
            elif isinstance(waiter, asyncio.Future) and not waiter.done():
                # (a waiter cancelled but not yet resumed is skipped)
                waiter.set_result(None)
                return
        self._held -= 1

    def _discard(self, key: K, future: Hashable) -> None:
        """Drop a cancelled waiter (a release may have dropped it already)."""
        queue = self._queues.get(key)
        if queue is None or future not in queue:
            return
        del queue[future]
        if not queue:
            del self._queues[key]
            del self._ring[key]
        self._changed(-1)

    def _changed(self, delta: int) -> None:
        self._waiting += delta
        if self._on_waiting is not None:
            self._on_waiting(self._waiting)
