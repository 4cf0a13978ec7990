"""A token bucket: at most `capacity` uses at once, filling again at `capacity` per
`interval`, so that in any window of that length no more than twice `capacity` are spent.

Used where tenants choose how often the operator would read or act: the SlurmJobs a dependent
names, the dependents an upstream's change wakes and the Slurm dependencies repointed for
them (`controller.dependencies`). Each namespace has its own bucket (`Budgets`), and one
namespace spending its own leaves the others theirs. `now` is passed in (a monotonic clock),
so the rules are tested without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    tokens: float
    at: float


def _tokens(bucket: Bucket | None, now: float, capacity: int, interval: float) -> float:
    if bucket is None:
        return float(capacity)
    # A clock that went back fills nothing rather than emptying the bucket.
    elapsed = max(0.0, now - bucket.at)
    return min(float(capacity), bucket.tokens + elapsed * capacity / interval)


def take(bucket: Bucket | None, now: float, capacity: int, interval: float) -> tuple[bool, Bucket]:
    """Whether one use is allowed now, and the bucket after it (None: a full bucket)."""
    tokens = _tokens(bucket, now, capacity, interval)
    if tokens >= 1.0:
        return True, Bucket(tokens - 1.0, now)
    return False, Bucket(tokens, now)


def is_full(bucket: Bucket, now: float, capacity: int, interval: float) -> bool:
    """Whether the bucket has filled again by `now` (it may be forgotten: None is full)."""
    return bucket.tokens + max(0.0, now - bucket.at) * capacity / interval >= capacity


def until_token(bucket: Bucket | None, now: float, capacity: int, interval: float) -> float:
    """Seconds from `now` until one use is allowed (0: now)."""
    tokens = _tokens(bucket, now, capacity, interval)
    if tokens >= 1.0:
        return 0.0
    return (1.0 - tokens) * interval / capacity


class Budgets:
    """A bucket per key (a namespace). Buckets that filled again are forgotten once there
    are more than `keep` (a forgotten bucket is a full one), so memory follows the keys
    spending now, not every key ever seen."""

    def __init__(self, capacity: int, interval: float, *, keep: int = 1024) -> None:
        self.capacity = capacity
        self.interval = interval
        self._keep = keep
        self._buckets: dict[str, Bucket] = {}

    def take(self, key: str, now: float) -> bool:
        """Spend one use of `key`'s, when there is one."""
        allowed, bucket = take(self._buckets.get(key), now, self.capacity, self.interval)
        self._buckets[key] = bucket
        if len(self._buckets) > self._keep:
            for name, kept in list(self._buckets.items()):
                if is_full(kept, now, self.capacity, self.interval):
                    del self._buckets[name]
        return allowed

    def wait(self, key: str, now: float) -> float:
        """Seconds from `now` until `key` has a use again (0: now)."""
        return until_token(self._buckets.get(key), now, self.capacity, self.interval)

    def __len__(self) -> int:
        return len(self._buckets)
