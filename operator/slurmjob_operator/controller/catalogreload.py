"""The re-read of every cluster's site catalogs while the operator runs (`site.catalogwatch`
decides; this looks every `RECHECK_SECONDS` and says what it found).

A refused edit is logged as an error and counted (`slurmjob_operator_catalog_reload_errors_total`,
`slurmjob_operator_catalog_stale` = 1 until the file is fixed); `doctor` says the same from the
file; a `CatalogEditRefused` Warning Event goes on the operator's own pod where it knows its
name (`HOSTNAME`, as in a pod) and may post Events in its namespace. A SlurmJob already
submitted is never rendered again, so an edit, good or bad, reaches only the attempts
prepared after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from slurmjob_operator.core.reread import Outcome
from slurmjob_operator.metrics import CatalogMetrics
from slurmjob_operator.site.catalogwatch import RECHECK_SECONDS, CatalogChange, CatalogWatch

log = logging.getLogger(__name__)

REFUSED_REASON = "CatalogEditRefused"
#: Posts an Event (type, reason, message) on the operator's own pod.
EventPoster = Callable[[str, str, str], Awaitable[None]]


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CatalogReload:
    def __init__(
        self,
        watches: Sequence[tuple[str, CatalogWatch]],
        metrics: CatalogMetrics,
        *,
        interval: float = RECHECK_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        event: EventPoster | None = None,
    ) -> None:
        """`watches`: each cluster's name and its site's catalogs."""
        self._watches = list(watches)
        self._metrics = metrics
        self._interval = interval
        self._sleep = sleep
        self._event = event
        for cluster, watch in self._watches:
            for kind, (_, copy) in watch.copies().items():
                metrics.observe(cluster, kind.value, loaded_at=copy.loaded_at, stale=copy.stale)

    async def run(self) -> None:
        while True:
            await self._sleep(self._interval)
            await self.once()

    async def once(self) -> None:
        """One look at every cluster's files."""
        for cluster, watch in self._watches:
            try:
                changes = await asyncio.to_thread(watch.check)
            except Exception:  # a bug must not end the re-reads of the other files
                log.exception("catalogs of cluster %s: the re-read failed", cluster)
                continue
            for change in changes:
                self._report(cluster, change)
                if change.outcome is Outcome.REFUSED and self._event is not None:
                    await self._post(cluster, change)

    async def _post(self, cluster: str, change: CatalogChange) -> None:
        assert self._event is not None
        message = (
            f"{change.kind.value} of cluster {cluster}: the edit is refused, the copy read at "
            f"{_when(change.copy.loaded_at)} stays in use: {change.copy.refused}"
        )
        try:
            await self._event("Warning", REFUSED_REASON, message)
        except Exception as exc:  # an Event is a courtesy: the log and the metric remain
            log.warning("catalog refusal Event not posted: %s", exc)

    def _report(self, cluster: str, change: CatalogChange) -> None:
        copy = change.copy
        refused = change.outcome is Outcome.REFUSED
        self._metrics.observe(
            cluster, change.kind.value, loaded_at=copy.loaded_at, stale=copy.stale, refused=refused
        )
        if refused:
            log.error(
                "%s of cluster %s: the edit is refused and the copy read at %s stays in use "
                "until the file is fixed: %s",
                change.kind.value,
                cluster,
                _when(copy.loaded_at),
                copy.refused,
            )
        elif change.outcome is Outcome.LOADED:
            log.info(
                "%s of cluster %s: %s read again; SlurmJobs submitted from now on use it",
                change.kind.value,
                cluster,
                copy.name,
            )
        else:
            log.info(
                "%s of cluster %s: %s holds the copy in use again (the refused edit is undone)",
                change.kind.value,
                cluster,
                copy.name,
            )
