"""The collective probe's memory across jobs: the cache (per key, the index of the site's
rung that passed, and until when) and the avoid lists (per tenant and cluster, the nodes its
probes blamed, each until when), in one ConfigMap the operator owns.

It is read whole into memory, and again after `RELOAD_SECONDS` (a new leader sees what the
last one wrote); a submission only ever looks in memory. A read that fails (or takes longer
than `CALL_TIMEOUT`) is tried again after `RETRY_SECONDS`, not by the next submission. A change
is written as a merge patch of the one key it touches. A write that fails is logged and
dropped: the cost is one more probe, never a job held up. Only what the operator derived is
stored (a rung's index, node names checked against the record's own node list), never text
of the job's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from slurmjob_operator.api.probestatus import MAX_PROBE_NODES, NODE_NAME_RE, AttemptProbe
from slurmjob_operator.kube import ConfigMapUnavailable
from slurmjob_operator.kube.ports import ConfigMapStore
from slurmjob_operator.times import parse_rfc3339, rfc3339, utc_now

log = logging.getLogger(__name__)

#: Seconds after which memory is read again from the ConfigMap.
RELOAD_SECONDS = 300.0
#: Seconds after a read that failed before the next one.
RETRY_SECONDS = 60.0
#: Seconds one read or write of the ConfigMap may take.
CALL_TIMEOUT = 10.0
#: Keys the ConfigMap may hold (each well under 2 KiB: far inside its 1 MiB).
MAX_KEYS = 2000
_KEY_RE = re.compile(r"^(probe|avoid)-[0-9a-f]{40}$")
_NODE_RE = re.compile(NODE_NAME_RE)


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
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._store = store
        self._where = (namespace, name)
        self._cache_for = timedelta(seconds=cache_seconds)
        self._avoid_for = timedelta(seconds=avoid_seconds)
        self._clock = clock
        self._rungs: dict[str, tuple[int, datetime]] = {}
        self._avoid: dict[str, dict[str, datetime]] = {}
        self._tried: datetime | None = None
        self._read = False

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
        self._read = True
        self._rungs, self._avoid = {}, {}
        for key, value in (data or {}).items():
            try:
                self._take(key, json.loads(value))
            except (ValueError, TypeError, KeyError):
                log.warning("probe cache: entry %r is not this operator's; ignored", key[:64])

    def _take(self, key: str, value: Any) -> None:
        if not _KEY_RE.match(key):
            raise ValueError(key)
        if key.startswith("probe-"):
            rung, until = int(value["rung"]), parse_rfc3339(str(value["until"]))
            if until is None or not 0 <= rung < 16:
                raise ValueError(key)
            self._rungs[key] = (rung, until)
            return
        nodes: dict[str, datetime] = {}
        for node, when in dict(value).items():
            until = parse_rfc3339(str(when))
            if until is None or not _NODE_RE.match(node):
                raise ValueError(key)
            nodes[node] = until
        self._avoid[key] = dict(list(nodes.items())[:MAX_PROBE_NODES])

    def cached_rung(self, key: str) -> int | None:
        entry = self._rungs.get(key)
        if entry is None or entry[1] <= self._clock():
            return None
        return entry[0]

    def avoided(self, key: str) -> tuple[str, ...]:
        now = self._clock()
        return tuple(sorted(n for n, until in self._avoid.get(key, {}).items() if until > now))

    async def remember(self, probe: AttemptProbe) -> None:
        """What an attempt's record taught: a passing rung is cached, a probe that failed
        everywhere forgets the key's rung and adds the nodes it blamed to the avoid list."""
        now = self._clock()
        changes: dict[str, str | None] = {}
        if probe.outcome == "Passed" and probe.rung is not None:
            until = now + self._cache_for
            self._rungs[probe.key] = (probe.rung, until)
            changes[probe.key] = json.dumps({"rung": probe.rung, "until": rfc3339(until)})
        elif probe.outcome == "Failed":
            if self._rungs.pop(probe.key, None) is not None:
                changes[probe.key] = None
            if probe.blamed:
                nodes = {n: u for n, u in self._avoid.get(probe.avoid, {}).items() if u > now}
                for node in probe.blamed:
                    nodes[node] = now + self._avoid_for
                # The latest blamed are kept when a list would grow past the bound.
                kept = sorted(nodes.items(), key=lambda item: item[1])[-MAX_PROBE_NODES:]
                self._avoid[probe.avoid] = dict(kept)
                changes[probe.avoid] = json.dumps({n: rfc3339(u) for n, u in kept})
        changes.update(self._evicted(now))
        if changes:
            await self._write(changes)

    def _evicted(self, now: datetime) -> dict[str, str | None]:
        """Keys to drop: expired ones, and the soonest to expire past MAX_KEYS."""
        gone = [k for k, (_, until) in self._rungs.items() if until <= now]
        gone += [k for k, nodes in self._avoid.items() if all(u <= now for u in nodes.values())]
        for key in gone:
            self._rungs.pop(key, None)
            self._avoid.pop(key, None)
        over = len(self._rungs) + len(self._avoid) - MAX_KEYS
        if over > 0:
            soonest = sorted(self._rungs, key=lambda k: self._rungs[k][1])[:over]
            for key in soonest:
                del self._rungs[key]
            gone += soonest
        return dict.fromkeys(gone)

    async def _write(self, changes: dict[str, str | None]) -> None:
        try:
            await asyncio.wait_for(self._store.merge_configmap(*self._where, changes), CALL_TIMEOUT)
        except (ConfigMapUnavailable, TimeoutError) as exc:
            log.warning("probe cache not written (%r): later jobs may probe again", exc)
