"""The operator's image records, kept in ConfigMaps of its own namespace: one per record
(`slurmjob-<record key>`, key `record`), so one image's users never crowd another's out of
the apiserver's 1 MiB.

Only the leader writes them (leader election), one record at a time (`lock`), so memory is
what was last written; a record is read from the apiserver the first time it is needed, and
again after `RELOAD_SECONDS` (what a previous leader wrote). A record that does not parse is
reported and treated as absent: the next import starts it over (the cache's files stay, and
the import finds a published entry under its lock). Nothing here is read from a SlurmJob.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import ValidationError

from slurmjob_operator.imagecache.record import ImageRecord
from slurmjob_operator.kube.ports import ConfigMapStore

log = logging.getLogger(__name__)

RECORD_DATA_KEY = "record"
CONFIGMAP_PREFIX = "slurmjob-"
RELOAD_SECONDS = 300.0
#: Records kept in memory; past it the least recently read is dropped (read again on need).
MAX_CACHED = 4096


def configmap_name(key: str) -> str:
    return CONFIGMAP_PREFIX + key


class RecordStore:
    def __init__(self, configmaps: ConfigMapStore, namespace: str) -> None:
        self._configmaps = configmaps
        self._namespace = namespace
        self._memory: dict[str, tuple[float, ImageRecord | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @asynccontextmanager
    async def lock(self, key: str) -> AsyncIterator[None]:
        """One decision at a time per record (the gate's read, act, write)."""
        # One lock per record the process ever decided about: as many as the site has images.
        async with self._locks.setdefault(key, asyncio.Lock()):
            yield

    async def read(self, key: str) -> ImageRecord | None:
        known = self._memory.get(key)
        if known is not None and time.monotonic() - known[0] < RELOAD_SECONDS:
            return known[1]
        data = await self._configmaps.read_configmap(self._namespace, configmap_name(key))
        record = _parse(key, (data or {}).get(RECORD_DATA_KEY))
        self._remember(key, record)
        return record

    async def write(self, record: ImageRecord) -> None:
        await self._configmaps.merge_configmap(
            self._namespace, configmap_name(record.key), {RECORD_DATA_KEY: record.to_json()}
        )
        self._remember(record.key, record)

    def in_flight(self) -> dict[str, int]:
        """Imports in flight per scope, among the records in memory (every record this
        leader decided about; a record a previous leader left in flight counts once read)."""
        counts: dict[str, int] = {}
        for _, record in self._memory.values():
            if record is not None and record.in_flight:
                counts[record.scope] = counts.get(record.scope, 0) + 1
        return counts

    def _remember(self, key: str, record: ImageRecord | None) -> None:
        self._memory.pop(key, None)
        if len(self._memory) >= MAX_CACHED:
            del self._memory[next(iter(self._memory))]
        self._memory[key] = (time.monotonic(), record)


def _parse(key: str, text: str | None) -> ImageRecord | None:
    if text is None:
        return None
    try:
        record = ImageRecord.from_json(text)
    except (ValueError, ValidationError) as exc:
        log.warning("image record %s does not parse (%s): starting it over", key, exc)
        return None
    if record.key != key:
        log.warning("image record %s names itself %s: starting it over", key, record.key)
        return None
    return record
