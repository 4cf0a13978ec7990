"""Whether slurmrestd answers, told on every followed SlurmJob (its SlurmReachable condition):
once per change, a few at a time, each under its resource's lock and from a fresh read."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from slurmjob_operator.config import Settings
from slurmjob_operator.controller.registry import Tracked
from slurmjob_operator.controller.resource import ResourceEdge, ResourceGone
from slurmjob_operator.core.following import reachability
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)


class Reachability:
    def __init__(self, settings: Settings, edge: ResourceEdge) -> None:
        self.settings = settings
        self.edge = edge
        self._reachable: bool | None = None

    async def report(
        self, followed: Sequence[Tracked], reachable: bool, reason: Reason, message: str
    ) -> None:
        """slurmrestd answered (or refused) the last sweep: say so on every followed job
        whose condition does not say so already, once per change, a few at a time."""
        if self._reachable is reachable:
            return
        wanted = ("True" if reachable else "False", str(reason))
        limit = asyncio.Semaphore(self.settings.refresh_concurrency)

        async def tell(item: Tracked) -> bool:
            async with limit, self.edge.step(item.ref.uid):
                try:
                    view = await self.edge.fresh(item.ref)
                    if view is not None:
                        transition = reachability(
                            view.status, reachable, reason, message, view.generation, utc_now()
                        )
                        await self.edge.apply(view, transition)
                except ResourceGone:
                    pass
                except Exception:  # one resource must not keep the others from hearing it
                    log.exception("cannot report reachability on %s", item.ref.name)
                    return False
                return True

        # A job that never had the condition needs none while slurmrestd answers (the jobs
        # submitted after the last report): only a failure is worth telling every one.
        due = [
            i for i in followed if i.reachable != wanted and not (reachable and i.reachable is None)
        ]
        told = await asyncio.gather(*(tell(i) for i in due))
        if all(told):
            self._reachable = reachable
