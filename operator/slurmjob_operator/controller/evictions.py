"""Kueue's verdict on a SlurmJob whose job is in Slurm (the follow side): evicted while still
pending, the job is held in Slurm and the quota given back, then released once Kueue admits it
again (the same job: never two for one admission); evicted while running (or when the hold did
not take, or the new admission places it elsewhere), it is cancelled, its end waited for, the
attempt recorded as evicted (no retry spent) and the quota given back.

Every change of the job goes through `JobIdentity` (a handle its identity check made).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import Attempt, Phase
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.claims import action_of
from slurmjob_operator.core.following import (
    admission_conditions,
    evicted,
    kueue_held,
    kueue_hold,
    kueue_release,
)
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.core.kueue import QUEUE_LABEL, Admission, kueue_says, queue_of
from slurmjob_operator.core.kueue import Verdict as Admitted
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.core.verified import VerifiedJob
from slurmjob_operator.kube import WorkloadError
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

#: How long (x 0.5 s) an evicted job's end is waited for under its lock before trying later.
EVICTION_WAIT_ROUNDS = 60


def held_in_slurm(job: SlurmJobView) -> bool:
    """Pending and held (Slurm's reason JobHeldUser or JobHeldAdmin)."""
    return job.base_state is BaseState.PENDING and (job.reason or "").startswith("JobHeld")


class Evictions:
    """Kueue's evictions, holds and releases of followed jobs, and the quota given back."""

    def __init__(
        self,
        queues: Queues,
        edge: ResourceEdge,
        identity: JobIdentity,
        slurm: Callable[[], Awaitable[SlurmClient]],
        backoff: float,
        admission_wait: float,
    ) -> None:
        """`admission_wait`: how soon Kueue is asked again (besides the Workload watch)."""
        self.queues = queues
        self.edge = edge
        self.identity = identity
        self.slurm = slurm
        self._backoff = backoff
        self._admission_wait = admission_wait

    async def follow(self, view: ResourceView) -> ResourceView | None:
        """Kueue's verdict on a job in Slurm. Evicted while still pending: held in Slurm and
        the quota given back, then released once Kueue admits it again (the same job: never
        two for one admission). Evicted while running (or when the hold did not take, or the
        new admission places it elsewhere): cancelled, its end waited for, the attempt
        recorded as evicted (no retry spent) and the quota given back. The view to follow the
        job on with (its hold, its dependencies), or None when Kueue holds it or it was just
        ended. Raises RetryLater while the job is still ending."""
        attempt = view.status.current_attempt
        spec = view.spec
        if (
            spec is None
            or attempt is None
            or attempt.job_id is None
            or action_of(attempt) is not None
            # Cancelled: the fold of the job this eviction cancelled may have come first.
            or view.status.phase not in (Phase.QUEUED, Phase.RUNNING, Phase.CANCELLED)
        ):
            return view
        kept = kueue_held(view.status)
        if queue_of(view.labels) is None:
            if not kept:
                return view
            # Held for Kueue, then the label went: held on (nothing releases it without an
            # admission: a label removed is no way around a queue).
            text = (
                f"Slurm job {attempt.job_id} stays held: Kueue evicted it and the label "
                f"{QUEUE_LABEL} was removed since; put it back, or delete the SlurmJob"
            )
            if view.status.message != text:
                await self.edge.apply(
                    view, Transition(view.status.model_copy(update={"message": text}))
                )
            return None
        # Where the admission places the job matters only to a held job about to be released.
        place = kept and view.status.phase is Phase.QUEUED
        found = await self.queues.admission(view, spec, suspended=view.suspend, place=place)
        if kept:
            if view.status.phase is Phase.QUEUED:
                return await self._held_for_kueue(view, attempt, found)
            if found.admission is Admission.ADMITTED:
                told = admission_conditions(view.status, found, view.generation, utc_now())
                return await self.edge.apply(view, told)
            if found.admission is Admission.EVICTED or kueue_says(found):
                # Released by someone else and started without an admission: ended.
                await self._end_evicted(
                    view, attempt, found, "NotAdmitted", "started while held for Kueue"
                )
                return None
            # Kueue could not be asked, or its answer cannot be trusted: asked again.
            raise RetryLater(f"Kueue: {found.message or found.reason}", self._admission_wait)
        if found.admission is not Admission.EVICTED:
            return view
        pending = view.status.phase is Phase.QUEUED and attempt.started_at is None
        if pending and await self._hold_evicted(view, attempt, found):
            return None
        await self._end_evicted(view, attempt, found, found.reason, found.message)
        return None

    async def _components(
        self, view: ResourceView, attempt: Attempt, refused: str
    ) -> tuple[list[SlurmJobView], VerifiedJob | None] | None:
        """The attempt's job as Slurm shows it now, with its handle (([], None) when gone);
        None when the id is not the attempt's job or not the resource's to change (said, and
        nothing done to it)."""
        assert attempt.job_id is not None
        owners = await self.identity.owners(view)
        if owners is None:
            return None
        try:
            views = await (await self.slurm()).get_job(attempt.job_id)
        except SlurmNotFound:
            return [], None
        except SlurmError as exc:
            raise RetryLater(f"job {attempt.job_id}: {exc}", self._backoff) from exc
        job = await self.identity.check(view, attempt, views, refused, owners=owners)
        return None if job is None else (views, job)

    async def _hold_evicted(self, view: ResourceView, attempt: Attempt, found: Admitted) -> bool:
        """Hold the evicted job while it is still pending: True when it is held (or is not
        the attempt's job, and is left alone); False when it has started, is gone, or the
        hold did not take, and it must be ended instead."""
        assert attempt.job_id is not None
        job_id = attempt.job_id
        read = await self._components(view, attempt, "not held")
        if read is not None and read[1] is not None:
            try:
                await self.identity.hold(read[1], True)
            except SlurmError as exc:  # Slurm refuses to hold a job that has started
                log.info("%s: evicted job %s not held: %s", view.ref.name, job_id, exc)
            # Held only if every component is pending and held now: read it again.
            read = await self._components(view, attempt, "not held")
        if read is not None and (not read[0] or not all(held_in_slurm(v) for v in read[0])):
            return False
        # Held; or the id is not the attempt's job, which is left alone: either way the
        # quota goes back, so that what preempted it is admitted.
        now = utc_now()
        told = admission_conditions(view.status, found, view.generation, now)
        held = kueue_hold(told.status, found.reason, found.message)
        view = await self.edge.apply(view, Transition(held.status, told.events + held.events))
        await self.give_back(view, found, now)
        return True

    async def give_back(self, view: ResourceView, found: Admitted, now: datetime) -> None:
        """Clear the evicted Workload's quota reservation; QuotaReserved=False on the
        SlurmJob too."""
        try:
            await self.queues.give_back(view, found)
        except WorkloadError as exc:
            raise RetryLater(str(exc), self._admission_wait) from exc
        back = Admitted(Admission.WAITING, "Pending", "quota given back after the eviction")
        await self.edge.apply(view, admission_conditions(view.status, back, view.generation, now))

    async def _held_for_kueue(
        self, view: ResourceView, attempt: Attempt, found: Admitted
    ) -> ResourceView | None:
        """A job held in Slurm since its eviction: released once Kueue admits it again where
        it was submitted (cancelled, and submitted anew, when the admission places it
        elsewhere or is refused); held on, its quota given back, until then."""
        assert attempt.job_id is not None
        now = utc_now()
        if found.admission is Admission.EVICTED:
            await self.give_back(view, found, now)
            return None
        if found.admission is not Admission.ADMITTED:
            await self.edge.apply(
                view, admission_conditions(view.status, found, view.generation, now)
            )
            return None
        read = await self._components(view, attempt, "not released")
        if read is None:
            return None
        views, job = read
        moved = found.partition is not None and any(v.partition != found.partition for v in views)
        if found.refusal is not None or moved or job is None:
            why = found.refusal or "admitted again elsewhere than where its job was held"
            await self._end_evicted(view, attempt, found, "Readmitted", why)
            # The new attempt is due now and no Workload event will come: tried again at once
            # by whoever called (a handler retry, or the wake of `_again`).
            raise RetryLater("evicted attempt ended: the next one is due", 0.0)
        if not view.suspend:
            try:
                await self.identity.hold(job, False)
            except SlurmError as exc:
                raise RetryLater(
                    f"cannot release job {attempt.job_id}: {exc}", self._backoff
                ) from exc
        told = admission_conditions(view.status, found, view.generation, now)
        released = kueue_release(told.status, view.suspend, view.generation, now)
        return await self.edge.apply(
            view, Transition(released.status, told.events + released.events)
        )

    async def _end_evicted(
        self, view: ResourceView, attempt: Attempt, found: Admitted, reason: str, message: str
    ) -> None:
        """Cancel the evicted job, wait for its end, record the attempt evicted and give the
        quota back (if Kueue still counts it)."""
        assert attempt.job_id is not None
        job_id = attempt.job_id
        try:
            try:
                job = await self.identity.read(view, attempt, "it is not cancelled")
            except SlurmNotFound:
                job = None
            if job is not None:
                await self._end_now(job)
        except SlurmError as exc:
            raise RetryLater(f"evicted job {job_id}: {exc}", self._backoff) from exc
        # Ended, gone, or not the attempt's job (left alone): the attempt is over for Kueue
        # either way, and the quota goes back.
        now = utc_now()
        ended = evicted(view.status, reason, message, view.generation, now)
        told = admission_conditions(ended.status, found, view.generation, now)
        view = await self.edge.apply(view, Transition(told.status, ended.events + told.events))
        if found.admission is Admission.EVICTED:
            await self.give_back(view, found, now)

    async def _end_now(self, job: VerifiedJob) -> None:
        """Cancel an evicted job and wait for its end, under the resource's lock: the
        poller's fold of the cancelled job must find the attempt evicted, not end the
        SlurmJob Cancelled."""
        with contextlib.suppress(SlurmNotFound):
            await (await self.identity.acting(job)).cancel(job)
        client = await self.slurm()
        ref = client.lifecycle_ref(job.job_id, job.sluid)
        for _ in range(EVICTION_WAIT_ROUNDS):
            try:
                views = await client.get_job(ref)
            except SlurmNotFound:
                return
            if all(v.is_final for v in views):
                return
            await asyncio.sleep(0.5)
        raise RetryLater(f"evicted job {job.job_id} is still ending", 1.0)
