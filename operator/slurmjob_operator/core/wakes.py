"""Wakes of dependents, bounded per namespace and coalesced, never dropped.

A change of an upstream SlurmJob wakes its dependents (`controller.dependencies`), and each
wake costs at least an apiserver read. Whoever writes the upstream's status chooses how often
it changes, and the namespace's users choose how many dependents it has, so the wakes are
spent from a token bucket per namespace (`core.budget`): `capacity` at once, as many again per
`interval`. A wake the bucket refuses waits here, once per dependent however often it is asked
for again (the dependent reads its upstreams when it is woken, so one wake serves every change
since), and is given out, oldest first, when its namespace has a wake again. A wake may also
be asked for no sooner than a given time (a dependent whose Slurm change must wait for the next
interval). `now` is passed in (a monotonic clock), so the rules are tested without waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from slurmjob_operator.core.budget import Budgets

T = TypeVar("T")


class WakeQueue(Generic[T]):
    def __init__(self, capacity: int, interval: float) -> None:
        self.budgets = Budgets(capacity, interval)
        # namespace -> key -> (what to wake, not before): in the order they were asked for
        self._waiting: dict[str, dict[str, tuple[T, float]]] = {}
        self._where: dict[str, str] = {}  # key -> namespace

    def ask(
        self, namespace: str, key: str, item: T, now: float, *, not_before: float | None = None
    ) -> bool:
        """True: wake `item` now (one of the namespace's wakes is spent). False: it waits, or
        waited already (kept once: the earlier of the two times)."""
        after = now if not_before is None else not_before
        where = self._where.get(key)
        if where is not None:
            kept, at = self._waiting[where][key]
            self._waiting[where][key] = (kept, min(at, after))
            return False
        if after <= now and self.budgets.take(namespace, now):
            return True
        self._waiting.setdefault(namespace, {})[key] = (item, after)
        self._where[key] = namespace
        return False

    def due(self, now: float, keep: Callable[[str], bool] = lambda key: True) -> list[T]:
        """The waiting wakes given out now, each spending one of its namespace's; those
        `keep` says are no longer wanted are dropped without spending any."""
        out: list[T] = []
        for namespace, waiting in list(self._waiting.items()):
            for key, (item, after) in list(waiting.items()):
                if not keep(key):
                    self._remove(namespace, key)
                    continue
                if after > now:
                    continue
                if not self.budgets.take(namespace, now):
                    break
                self._remove(namespace, key)
                out.append(item)
        return out

    def due_at(self, namespace: str, now: float, not_before: float | None = None) -> float:
        """When a wake of `namespace` asked for now (no sooner than `not_before`) could be
        given out at the earliest."""
        return max(now + self.budgets.wait(namespace, now), not_before or now)

    def next_at(self, now: float) -> float | None:
        """When the next waiting wake could be given out (None: none waits)."""
        best: float | None = None
        for namespace, waiting in self._waiting.items():
            earliest = min(after for _, after in waiting.values())
            at = self.due_at(namespace, now, earliest)
            best = at if best is None else min(best, at)
        return best

    def drop(self, key: str) -> None:
        where = self._where.get(key)
        if where is not None:
            self._remove(where, key)

    def waiting(self, key: str) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)

    def _remove(self, namespace: str, key: str) -> None:
        waiting = self._waiting[namespace]
        del waiting[key]
        del self._where[key]
        if not waiting:
            del self._waiting[namespace]
