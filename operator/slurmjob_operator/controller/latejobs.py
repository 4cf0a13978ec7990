"""Late jobs: a job of an attempt proven absent (`core.absence`) that shows up after all (its
request held in a proxy longer than the fencing window) duplicates the newer attempt. It is
cancelled, through a handle its identity check made, and the window said to be too short."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.core.absence import Window, late_candidates, late_jobs
from slurmjob_operator.core.jobview import by_leader
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.times import parse_rfc3339, utc_now

log = logging.getLogger(__name__)

#: The Event of a late job of an attempt proven absent, cancelled.
LATE_SUBMIT_CANCELLED = "LateSubmitCancelled"


class LateJobs:
    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        slurm: Callable[[], Awaitable[SlurmClient]],
        identity: JobIdentity,
        on_late: Callable[[], None],
    ) -> None:
        """`on_late`: counts a late submit cancelled."""
        self.edge = edge
        self.slurm = slurm
        self.identity = identity
        self._on_late = on_late
        self._window = Window(
            settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
        )

    async def cancel(self, view: ResourceView, status: SlurmJobStatus) -> None:
        """A job of an attempt proven absent that shows up after all (its request held in a
        proxy longer than the fencing window) duplicates the newer attempt: cancel it and say
        that the window was too short. Looked for at each fold, for a while after the proof,
        of the attempts just before the current one (`core.absence.late_candidates`), in one
        listing of the controller's jobs: one `GET /jobs` a fold, whatever the status says."""
        now = utc_now()
        candidates = late_candidates(status.attempts, now, self._window)
        if not candidates:
            return
        try:
            listing = await (await self.slurm()).list_jobs()
        except SlurmError as exc:
            log.info("looking for late jobs of %s: %s", view.ref.name, exc)
            return
        for attempt, late in late_jobs(candidates, listing.jobs, view.ref.uid):
            for views in by_leader(late).values():
                job = await self.identity.check(view, attempt, views, "it is not cancelled")
                if job is None:
                    continue
                await self.identity.cancel_quietly(job)
                self._on_late()
                proven = parse_rfc3339(attempt.proven_absent_at)
                after = (now - proven).total_seconds() if proven else 0.0
                text = (
                    f"Slurm job {job.job_id} of attempt {attempt.number} appeared {after:.0f} s "
                    "after that attempt was proven absent (its request was held longer than "
                    f"the fencing window of {self._window.seconds:.0f} s: raise "
                    "SLURMJOB_ABSENCE_MARGIN); cancelled as a duplicate of attempt "
                    f"{status.attempts[-1].number}"
                )
                log.warning("%s/%s: %s", view.ref.namespace, view.ref.name, text)
                await self.edge.event(view.ref, "Warning", LATE_SUBMIT_CANCELLED, text)
