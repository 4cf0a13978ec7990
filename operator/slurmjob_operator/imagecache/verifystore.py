"""The operator's records of verified registry artifacts, kept as the image records are
(imagecache/store.py): one ConfigMap of its namespace per record (`slurmjob-artifact-...`,
key `record`), written by the leader only, one decision at a time per record, read from the
apiserver the first time it is needed and again after `RELOAD_SECONDS`.

A record that does not parse is reported and treated as absent: the artifact is verified
again (a job's time on a CPU node, never a pass). Nothing here is read from a SlurmJob.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import ValidationError

from slurmjob_operator.imagecache.store import (
    MAX_CACHED,
    RECORD_DATA_KEY,
    RELOAD_SECONDS,
    configmap_name,
)
from slurmjob_operator.imagecache.verifyrecord import ArtifactRecord
from slurmjob_operator.kube.ports import ConfigMapStore

log = logging.getLogger(__name__)


class ArtifactRecordStore:
    def __init__(self, configmaps: ConfigMapStore, namespace: str) -> None:
        self._configmaps = configmaps
        self._namespace = namespace
        self._memory: dict[str, tuple[float, ArtifactRecord | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @asynccontextmanager
    async def lock(self, key: str) -> AsyncIterator[None]:
        """One decision at a time per record (the gate's read, act, write)."""
        # One lock per artifact of the registry (and of its earlier versions): a few dozen.
        async with self._locks.setdefault(key, asyncio.Lock()):
            yield

    async def read(self, key: str) -> ArtifactRecord | None:
        known = self._memory.get(key)
        if known is not None and time.monotonic() - known[0] < RELOAD_SECONDS:
            return known[1]
        data = await self._configmaps.read_configmap(self._namespace, configmap_name(key))
        record = _parse(key, (data or {}).get(RECORD_DATA_KEY))
        self._remember(key, record)
        return record

    async def write(self, record: ArtifactRecord) -> None:
        await self._configmaps.merge_configmap(
            self._namespace, configmap_name(record.key), {RECORD_DATA_KEY: record.to_json()}
        )
        self._remember(record.key, record)

    def _remember(self, key: str, record: ArtifactRecord | None) -> None:
        self._memory.pop(key, None)
        if len(self._memory) >= MAX_CACHED:
            del self._memory[next(iter(self._memory))]
        self._memory[key] = (time.monotonic(), record)


def _parse(key: str, text: str | None) -> ArtifactRecord | None:
    if text is None:
        return None
    try:
        record = ArtifactRecord.from_json(text)
    except (ValueError, ValidationError) as exc:
        log.warning("artifact record %s does not parse (%s): verifying it again", key, exc)
        return None
    if record.key != key:
        log.warning("artifact record %s names itself %s: verifying it again", key, record.key)
        return None
    return record
