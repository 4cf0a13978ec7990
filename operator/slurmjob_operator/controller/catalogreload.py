"""The re-read of every cluster's site catalogs while the operator runs (`site.catalogwatch`
decides; this looks every `RECHECK_SECONDS` and says what it found).

A refused edit is logged as an error and counted (`slurmjob_operator_catalog_reload_errors_total`,
`slurmjob_operator_catalog_stale` = 1 until the file is fixed); `doctor` says the same from the
file. There is no Kubernetes object of the operator's to post an Event on: the metric and the
log are where it shows. A SlurmJob already submitted is never rendered again, so an edit, good
or bad, reaches only the attempts prepared after it.
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
    ) -> None:
        """`watches`: each cluster's name and its site's catalogs."""
        self._watches = list(watches)
        self._metrics = metrics
        self._interval = interval
        self._sleep = sleep
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
