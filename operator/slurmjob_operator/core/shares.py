"""The share rule for state every tenant writes into one place (the probe cache's ConfigMap,
the log archive): who loses an entry when the place is full.

Each owner (a tenant; a namespace where no tenants file is set) may hold at most
`max(floor, capacity / active owners)` units (bytes), where `floor` and `capacity` are site
settings. When the floors of the owners present add up to more than the capacity, the floor
shrinks to `capacity / owners`, and below that every owner still keeps one entry: past that,
an incoming entry of a new owner evicts the oldest entry of the largest owner.

Past capacity, eviction starts with the owner furthest over its share, its oldest entry
first, and stops as soon as the total fits. An owner at or under its share loses nothing while
another is over its own, so one tenant flooding the place evicts only its own entries.

A pinned entry (one in use: the image cache's) goes only while its owner is over its share,
after that owner's unpinned entries: an owner cannot pin the place past its share.

Pure: the callers measure sizes and ages and act on the keys returned.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

#: An owner as written into the places that record one (the probe ConfigMap's values, the
#: archive's records): `tenant:<tenant name>` or `namespace:<namespace>`, both DNS labels.
OWNER_RE = re.compile(r"^(tenant|namespace):[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def share_owner(namespace: str, tenant: str | None) -> str:
    """Whose share an entry counts against: its tenant's (whatever Unix user its jobs run
    as), else its namespace's. The prefix keeps a tenant and a namespace of one name apart."""
    return f"tenant:{tenant}" if tenant is not None else f"namespace:{namespace}"


@dataclass(frozen=True)
class Held:
    """One entry: its key, its owner, its size in the place's unit, its age as an order
    (smaller is older: a timestamp, a sequence number), and whether it is pinned."""

    key: Hashable
    owner: str
    size: int
    order: float
    pinned: bool = False


def share(capacity: int, floor: int, owners: int) -> float:
    """What one of `owners` active owners may hold: `max(floor, capacity / owners)`, with
    the floor shrunk to `capacity / owners` when the floors add up to more than capacity."""
    if owners <= 0:
        return float(capacity)
    even = capacity / owners
    return max(min(floor, even), even)


def evictions(
    entries: Sequence[Held], capacity: int, floor: int, *, keep: Hashable | None = None
) -> list[Hashable]:
    """The keys to remove, in order, so that what stays fits `capacity`.

    `keep` names the entry being written now: it is never chosen (a caller refuses or
    truncates an entry larger than the capacity before it asks)."""
    total = sum(e.size for e in entries)
    if total <= capacity:
        return []
    by_owner: dict[str, list[Held]] = {}
    for entry in sorted(entries, key=lambda e: (e.order, str(e.key))):
        by_owner.setdefault(entry.owner, []).append(entry)
    allowed = share(capacity, floor, len(by_owner))
    used = {owner: sum(e.size for e in held) for owner, held in by_owner.items()}
    gone: list[Hashable] = []
    while total > capacity:
        victim = _victim(by_owner, used, allowed, keep)
        if victim is None:
            break
        by_owner[victim.owner].remove(victim)
        used[victim.owner] -= victim.size
        total -= victim.size
        gone.append(victim.key)
    return gone


def _victim(
    by_owner: dict[str, list[Held]], used: dict[str, int], allowed: float, keep: Hashable | None
) -> Held | None:
    """The next entry to go: the oldest evictable entry of the owner furthest over its share
    (a share is never less than the owner's newest entry: one entry each is the last floor),
    its unpinned entries before its pinned ones; when nobody is over, the oldest unpinned
    entry of the largest owner."""

    def evictable(owner: str, pinned: bool) -> list[Held]:
        return [e for e in by_owner[owner] if e.key != keep and e.pinned == pinned]

    def over(owner: str) -> float:
        held = by_owner[owner]
        return used[owner] - max(allowed, held[-1].size if held else 0)

    overs = [o for o in by_owner if over(o) > 0 and (evictable(o, False) or evictable(o, True))]
    if overs:
        furthest = max(overs, key=lambda o: (over(o), used[o], o))
        return (evictable(furthest, False) or evictable(furthest, True))[0]
    # Everyone within its share yet the place is over: more owners than entries fit.
    candidates = [o for o in by_owner if evictable(o, False)]
    if not candidates:
        return None
    largest = max(candidates, key=lambda o: (used[o], o))
    return evictable(largest, False)[0]
