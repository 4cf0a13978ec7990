"""A token bucket: at most `capacity` uses at once, filling again at `capacity` per
`interval`, so that in any window of that length no more than twice `capacity` are spent.

Used where tenants choose how often the operator would read (the SlurmJobs a dependent names,
`controller.dependencies`): each namespace has its own bucket, and one namespace spending its
own leaves the others theirs. `now` is passed in (a monotonic clock), so the rules are tested
without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    tokens: float
    at: float


def take(bucket: Bucket | None, now: float, capacity: int, interval: float) -> tuple[bool, Bucket]:
    """Whether one use is allowed now, and the bucket after it (None: a full bucket)."""
    if bucket is None:
        tokens = float(capacity)
    else:
        # A clock that went back fills nothing rather than emptying the bucket.
        elapsed = max(0.0, now - bucket.at)
        tokens = min(float(capacity), bucket.tokens + elapsed * capacity / interval)
    if tokens >= 1.0:
        return True, Bucket(tokens - 1.0, now)
    return False, Bucket(tokens, now)


def is_full(bucket: Bucket, now: float, capacity: int, interval: float) -> bool:
    """Whether the bucket has filled again by `now` (it may be forgotten: None is full)."""
    return bucket.tokens + max(0.0, now - bucket.at) * capacity / interval >= capacity
