"""The collective probe's memory across jobs: the cache (per key, the index of the site's
rung that passed, and until when) and the avoid lists (per tenant and cluster, the nodes its
probes blamed, each until when), in one ConfigMap the operator owns.

It is read whole into memory, and again after `RELOAD_SECONDS` (a new leader sees what the
last one wrote); a submission only ever looks in memory. A read that fails (or takes longer
than `CALL_TIMEOUT`) is tried again after `RETRY_SECONDS`, not by the next submission. A change
is written as a merge patch of the keys it touches. A write that fails is logged and dropped:
the cost is one more probe, never a job held up. Only what the operator derived is stored (a
rung's index, node names checked against the record's own node list, the owner it made from
the resource), never text of the job's.

Every entry names its owner (a tenant, else a namespace), and the ConfigMap is bounded by the
share rule (`core.shares`): past the site's capacity, the owner furthest over its share loses
its oldest entries first, so one tenant's flood of failing probes evicts its own entries only
and the ConfigMap never reaches the apiserver's 1 MiB.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slurmjob_operator.api.probestatus import MAX_PROBE_NODES, NODE_NAME_RE
from slurmjob_operator.config import Settings
from slurmjob_operator.config.site import PROBE_CAPACITY_BYTES, PROBE_FLOOR_BYTES
from slurmjob_operator.core.probe import ProbeKeys, ProbeRecord
from slurmjob_operator.core.shares import OWNER_RE, Held, evictions
from slurmjob_operator.kube import ConfigMapUnavailable
from slurmjob_operator.kube.ports import ConfigMapStore
from slurmjob_operator.servingcert import operator_namespace
from slurmjob_operator.times import parse_rfc3339, rfc3339, utc_now

log = logging.getLogger(__name__)

#: Seconds after which memory is read again from the ConfigMap.
RELOAD_SECONDS = 300.0
#: Seconds after a read that failed before the next one.
RETRY_SECONDS = 60.0
#: Seconds one read or write of the ConfigMap may take.
CALL_TIMEOUT = 10.0
#: The owner of an entry the previous release wrote (it named none): one owner of its own,
#: with a share like any other, until the operator writes that key again.
LEGACY_OWNER = "legacy"
_KEY_RE = re.compile(r"^(probe|avoid)-[0-9a-f]{40}$")
_NODE_RE = re.compile(NODE_NAME_RE)


@dataclass(frozen=True)
class _Entry:
    """What the share rule weighs of a key: whose, when written, its bytes (key and value,
    as the apiserver counts a ConfigMap's size)."""

    owner: str
    written: datetime
    size: int


class ProbeBook:
    """`core.probe.ProbeLookup` from memory, and what the operator learns written through."""

    def __init__(
        self,
        store: ConfigMapStore,
        namespace: str,
        name: str,
        *,
        cache_seconds: float,
        avoid_seconds: float,
        capacity: int = PROBE_CAPACITY_BYTES,
        floor: int = PROBE_FLOOR_BYTES,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._store = store
        self._where = (namespace, name)
        self._cache_for = timedelta(seconds=cache_seconds)
        self._avoid_for = timedelta(seconds=avoid_seconds)
        self._capacity, self._floor = capacity, floor
        self._clock = clock
        self._rungs: dict[str, tuple[int, datetime]] = {}
        self._avoid: dict[str, dict[str, datetime]] = {}
        self._entries: dict[str, _Entry] = {}
        self._tried: datetime | None = None
        self._read = False
        # Nothing is written before the ConfigMap was read once: a write sized against an
        # empty memory could take a full ConfigMap past its bound.
        self._ever_read = False

    async def refresh(self) -> None:
        """Read the ConfigMap when memory is older than RELOAD_SECONDS (or was never read),
        or RETRY_SECONDS after a read that failed."""
        now = self._clock()
        wait = RELOAD_SECONDS if self._read else RETRY_SECONDS
        if self._tried is not None and (now - self._tried).total_seconds() < wait:
            return
        self._tried = now
        try:
            data = await asyncio.wait_for(self._store.read_configmap(*self._where), CALL_TIMEOUT)
        except (ConfigMapUnavailable, TimeoutError) as exc:
            self._read = False
            log.warning("probe cache not read (%r): memory is used as it is", exc)
            return
        self._read = self._ever_read = True
        self._rungs, self._avoid, self._entries = {}, {}, {}
        for key, value in (data or {}).items():
            try:
                self._take(key, value)
            except (ValueError, TypeError, KeyError, AttributeError):
                log.warning("probe cache: entry %r is not this operator's; ignored", key[:64])

    def _take(self, key: str, raw: str) -> None:
        if not _KEY_RE.match(key):
            raise ValueError(key)
        value: Any = json.loads(raw)
        owner = value.get("owner", LEGACY_OWNER)
        if owner != LEGACY_OWNER and not OWNER_RE.match(str(owner)):
            raise ValueError(key)
        if key.startswith("probe-"):
            rung, until = int(value["rung"]), parse_rfc3339(str(value["until"]))
            if until is None or not 0 <= rung < 16:
                raise ValueError(key)
            self._rungs[key] = (rung, until)
            self._entries[key] = _Entry(owner, until - self._cache_for, len(key) + len(raw))
            return
        # The previous release wrote the nodes alone, without an owner.
        listed = value["nodes"] if "owner" in value else value
        nodes: dict[str, datetime] = {}
        for node, when in dict(listed).items():
            until = parse_rfc3339(str(when))
            if until is None or not _NODE_RE.match(node):
                raise ValueError(key)
            nodes[node] = until
        if not nodes:
            raise ValueError(key)
        self._avoid[key] = dict(list(nodes.items())[:MAX_PROBE_NODES])
        written = max(nodes.values()) - self._avoid_for
        self._entries[key] = _Entry(owner, written, len(key) + len(raw))

    def cached_rung(self, key: str) -> int | None:
        entry = self._rungs.get(key)
        if entry is None or entry[1] <= self._clock():
            return None
        return entry[0]

    def avoided(self, key: str) -> tuple[str, ...]:
        now = self._clock()
        return tuple(sorted(n for n, until in self._avoid.get(key, {}).items() if until > now))

    async def remember(self, keys: ProbeKeys, record: ProbeRecord) -> None:
        """What an attempt's record taught, under the keys the operator made for the job (never
        a status's): a passing rung is cached, a probe that failed everywhere forgets the key's
        rung and adds the nodes it blamed to the owner's avoid list."""
        await self.refresh()  # a full ConfigMap is weighed as it is, not as memory last saw it
        now = self._clock()
        changes: dict[str, str | None] = {}
        written: str | None = None
        if record.outcome == "Passed" and record.rung is not None:
            until = now + self._cache_for
            self._rungs[keys.cache] = (record.rung, until)
            value = json.dumps({"rung": record.rung, "until": rfc3339(until), "owner": keys.owner})
            written = self._put(keys.cache, keys.owner, now, value, changes)
        elif record.outcome == "Failed":
            if self._rungs.pop(keys.cache, None) is not None:
                self._entries.pop(keys.cache, None)
                changes[keys.cache] = None
            if record.blamed:
                nodes = {n: u for n, u in self._avoid.get(keys.avoid, {}).items() if u > now}
                for node in record.blamed:
                    nodes[node] = now + self._avoid_for
                # The latest blamed are kept when a list would grow past the bound.
                kept = sorted(nodes.items(), key=lambda item: item[1])[-MAX_PROBE_NODES:]
                self._avoid[keys.avoid] = dict(kept)
                listed = {n: rfc3339(u) for n, u in kept}
                value = json.dumps({"owner": keys.owner, "nodes": listed})
                written = self._put(keys.avoid, keys.owner, now, value, changes)
        changes.update(self._evicted(now, written))
        if not changes:
            return
        if not self._ever_read:
            log.warning("probe cache never read: what this probe taught is kept in memory only")
            return
        await self._write(changes)

    def _put(
        self, key: str, owner: str, now: datetime, value: str, changes: dict[str, str | None]
    ) -> str:
        self._entries[key] = _Entry(owner, now, len(key) + len(value))
        changes[key] = value
        return key

    def _drop(self, key: str) -> None:
        self._rungs.pop(key, None)
        self._avoid.pop(key, None)
        self._entries.pop(key, None)

    def _evicted(self, now: datetime, keep: str | None) -> dict[str, str | None]:
        """Keys to drop: expired ones, then what the share rule evicts past the capacity
        (never `keep`, the entry written now)."""
        gone = [k for k, (_, until) in self._rungs.items() if until <= now]
        gone += [k for k, nodes in self._avoid.items() if all(u <= now for u in nodes.values())]
        for key in gone:
            self._drop(key)
        held = [
            Held(key, e.owner, e.size, e.written.timestamp()) for key, e in self._entries.items()
        ]
        for victim in evictions(held, self._capacity, self._floor, keep=keep):
            assert isinstance(victim, str)
            self._drop(victim)
            gone.append(victim)
        return dict.fromkeys(gone)

    async def _write(self, changes: dict[str, str | None]) -> None:
        try:
            await asyncio.wait_for(self._store.merge_configmap(*self._where, changes), CALL_TIMEOUT)
        except (ConfigMapUnavailable, TimeoutError) as exc:
            # Memory and the ConfigMap now differ (an eviction not made there): read it
            # again before the next change is weighed.
            self._tried = None
            log.warning("probe cache not written (%r): later jobs may probe again", exc)


def probe_book(settings: Settings, store: object) -> ProbeBook | None:
    """The process's probe book on the settings' ConfigMap (None: the store holds none, e.g.
    the local runner's)."""
    if not isinstance(store, ConfigMapStore):
        return None
    return ProbeBook(
        store,
        operator_namespace(settings),
        settings.probe_configmap,
        cache_seconds=settings.probe_cache_seconds,
        avoid_seconds=settings.probe_avoid_seconds,
        capacity=settings.probe_capacity_bytes,
        floor=settings.probe_floor_bytes,
    )
