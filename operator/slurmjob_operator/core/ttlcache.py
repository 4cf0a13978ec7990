"""A small cache whose entries expire, bounded in size whatever its callers put in.

The log API keeps three things a short while (`logserver.py`): whether a user the apiserver
named may read a SlurmJob's log (seconds: a revoked right must stop working soon), the
SlurmJob itself (a second: several followers of one job share one read), and the secret
values to hide in its logs. The keys come from requests, so the size is capped: the oldest
entry goes first when it is full. `now` is passed in (a monotonic clock), so the rules are
tested without waiting.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(self, ttl: float, max_entries: int) -> None:
        if ttl <= 0 or max_entries < 1:
            raise ValueError("ttl must be positive and max_entries at least 1")
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        """The value kept for `key`, None when there is none or it has expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if now >= expires:
            del self._entries[key]
            return None
        return value

    def put(self, key: K, value: V, now: float) -> None:
        """Keep `value` for `ttl` seconds from `now` (an older value for `key` is replaced
        and its time restarts); the oldest entries go when the cache is full."""
        self._entries.pop(key, None)
        self._entries[key] = (now + self.ttl, value)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
