"""The operator's records, kept in ConfigMaps of its own namespace: one per record
(`slurmjob-<record key>`, key `record`), so one image's users never crowd another's out of
the apiserver's 1 MiB. `ConfigMapRecords` keeps one kind of record (`RecordKind`: the image
records here as `RecordStore`, the verified artifacts' in `verifystore`).

Only the leader writes them (leader election), one record at a time (`lock`), so memory is
what was last written; a record is read from the apiserver the first time it is needed, and
again after `RELOAD_SECONDS` (what a previous leader wrote). A record that does not parse is
reported and treated as absent: the next import starts it over (the cache's files stay, and
the import finds a published entry under its lock), the next verification checks the file
again. Nothing here is read from a SlurmJob.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pydantic import ValidationError

from slurmjob_operator.imagecache.layout import RECORD_KEY_PREFIX
from slurmjob_operator.imagecache.record import ImageRecord
from slurmjob_operator.kube.ports import ConfigMapLister, ConfigMapStore, ConfigMapUnavailable

log = logging.getLogger(__name__)

RECORD_DATA_KEY = "record"
CONFIGMAP_PREFIX = "slurmjob-"
RELOAD_SECONDS = 300.0
#: Records kept in memory; past it the least recently read is dropped (read again on need).
MAX_CACHED = 4096


def configmap_name(key: str) -> str:
    return CONFIGMAP_PREFIX + key


class Stored(Protocol):
    @property
    def key(self) -> str: ...

    def to_json(self) -> str: ...


S = TypeVar("S", bound=Stored)


@dataclass(frozen=True)
class RecordKind(Generic[S]):
    """One kind of record: what the log calls it, the prefix of its keys, how it is parsed,
    and what becomes of one that does not parse."""

    noun: str
    key_prefix: str
    parse: Callable[[str], S]
    otherwise: str


class ConfigMapRecords(Generic[S]):
    """Records of one kind, a ConfigMap each: read through memory, written by the leader."""

    def __init__(self, configmaps: ConfigMapStore, namespace: str, kind: RecordKind[S]) -> None:
        self._configmaps = configmaps
        #: Listing and deleting (the sweep, a forgotten entry): the apiserver's client has
        #: them; a store without them keeps its records until they are decided about again.
        self._lister = configmaps if isinstance(configmaps, ConfigMapLister) else None
        self._namespace = namespace
        self._kind = kind
        self._memory: dict[str, tuple[float, S | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @asynccontextmanager
    async def lock(self, key: str) -> AsyncIterator[None]:
        """One decision at a time per record (the gate's read, act, write)."""
        # One lock per record the process ever decided about: as many as the site has images
        # and registry artifacts.
        async with self._locks.setdefault(key, asyncio.Lock()):
            yield

    async def read(self, key: str) -> S | None:
        known = self._memory.get(key)
        if known is not None and time.monotonic() - known[0] < RELOAD_SECONDS:
            return known[1]
        data = await self._configmaps.read_configmap(self._namespace, configmap_name(key))
        record = self._parse(key, (data or {}).get(RECORD_DATA_KEY))
        self._remember(key, record)
        return record

    async def write(self, record: S) -> None:
        await self._configmaps.merge_configmap(
            self._namespace, configmap_name(record.key), {RECORD_DATA_KEY: record.to_json()}
        )
        self._remember(record.key, record)

    @property
    def lister(self) -> ConfigMapLister:
        if self._lister is None:
            raise ConfigMapUnavailable("this store cannot list or delete its ConfigMaps")
        return self._lister

    async def read_all(self) -> list[S]:
        """Every record on the apiserver (the cache's sweep); one that does not parse is
        left out, as `read` treats it. Not remembered: memory may be newer."""
        found = await self.lister.list_configmaps(
            self._namespace, configmap_name(self._kind.key_prefix)
        )
        records = []
        for name, data in sorted(found.items()):
            key = name.removeprefix(CONFIGMAP_PREFIX)
            record = self._parse(key, data.get(RECORD_DATA_KEY))
            if record is not None:
                records.append(record)
        return records

    async def delete(self, key: str) -> None:
        """Delete the record `key` (its entry went and nothing is in flight)."""
        await self.lister.delete_configmap(self._namespace, configmap_name(key))
        self._remember(key, None)

    def remembered(self) -> Iterator[S]:
        """The records in memory: every record this leader decided about (one a previous
        leader left counts once read)."""
        return (record for _, record in self._memory.values() if record is not None)

    def _remember(self, key: str, record: S | None) -> None:
        self._memory.pop(key, None)
        if len(self._memory) >= MAX_CACHED:
            del self._memory[next(iter(self._memory))]
        self._memory[key] = (time.monotonic(), record)

    def _parse(self, key: str, text: str | None) -> S | None:
        if text is None:
            return None
        noun, otherwise = self._kind.noun, self._kind.otherwise
        try:
            record = self._kind.parse(text)
        except (ValueError, ValidationError) as exc:
            log.warning("%s %s does not parse (%s): %s", noun, key, exc, otherwise)
            return None
        if record.key != key:
            log.warning("%s %s names itself %s: %s", noun, key, record.key, otherwise)
            return None
        return record


IMAGE_RECORDS = RecordKind(
    "image record", RECORD_KEY_PREFIX, ImageRecord.from_json, "starting it over"
)


class RecordStore(ConfigMapRecords[ImageRecord]):
    def __init__(self, configmaps: ConfigMapStore, namespace: str) -> None:
        super().__init__(configmaps, namespace, IMAGE_RECORDS)

    def in_flight(self) -> dict[str, int]:
        """Imports in flight per scope, among the records in memory (every record this
        leader decided about; a record a previous leader left in flight counts once read)."""
        counts: dict[str, int] = {}
        for record in self.remembered():
            if record.in_flight:
                counts[record.scope] = counts.get(record.scope, 0) + 1
        return counts
