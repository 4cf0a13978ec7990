"""A submit's answer, and the job of an attempt whose answer was lost.

`confirm`: the job fetched once by its numeric id, its SLUID recorded and its state folded (a
job that is not the attempt's, by name and comment, is not confirmed). `adopt`: the last POST's
answer was lost, so the job is looked for by its unique name and adopted (its duplicates
cancelled, impostors refused); not found, it is proven absent through accounting
(`core.absence`) or declared lost by a person, and only then may a new attempt be submitted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import Attempt
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.following import Following
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater, Stale
from slurmjob_operator.core.absence import Mode, Next, Verdict, Window, mode, next_check, verdict
from slurmjob_operator.core.decisions import AdoptAction, adoption, belongs, declared_lost_now
from slurmjob_operator.core.jobview import SlurmJobView, by_leader, job_of, leader
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import (
    DECLARE_LOST_ANNOTATION,
    confirmed,
    declared_lost,
    not_submitted,
    proven_absent,
    submitted,
    unconfirmed,
)
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound
from slurmjob_operator.storage.executors import Pool, run_in
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.staging import is_staged, remove_attempt
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

#: Writes of a receipt's job id tried on fresh copies when the resource keeps changing.
RECEIPT_WRITES = 3


class Adopter:
    """Confirms receipts and adopts (or proves absent) the jobs of lost answers."""

    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        metrics: Metrics,
        slurm: Callable[[], Awaitable[SlurmClient]],
        following: Following,
        identity: JobIdentity,
        backoff: float,
    ) -> None:
        self.settings = settings
        self.edge = edge
        self.metrics = metrics
        self.slurm = slurm
        self.following = following
        self.identity = identity
        self._backoff = backoff
        self.window = Window(
            settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
        )
        # (uid, attempt) -> monotonic time this process first found the unconfirmed attempt
        # nowhere: any request for it was sent before (by this process, or by one that died
        # or stopped leading before this one took over).
        self._unfound_since: dict[tuple[str, int], float] = {}

    async def confirm_receipt(self, view: ResourceView, job_id: int) -> None:
        """The POST's answer in hand: its job id and the confirmation go in one status write
        when the confirming read succeeds and shows the attempt's job; otherwise the job id is
        written alone at once (an attempt whose id is not written would be looked for by name
        after any slurmrestd error) and confirmed as any written receipt is.

        The writes are conditioned on the version the write-ahead record returned. When the
        resource changed meanwhile (a label edited during the POST, say), the id held here is
        written onto a fresh copy while the same attempt is current there without one, so that
        no edit sends a submitted attempt through adoption."""
        attempt = view.status.current_attempt
        assert attempt is not None
        client = await self.slurm()
        try:
            views: list[SlurmJobView] | None = await client.get_job(job_id)
        except SlurmError:
            views = None  # not found yet, or slurmrestd failing: the id first, then as before
        for _ in range(RECEIPT_WRITES):
            try:
                await self._write_receipt(view, job_id, views)
                return
            except Stale:
                fresh = await self.edge.fresh(view.ref, conditioned=True)
                current = fresh.status.current_attempt if fresh is not None else None
                if fresh is None or current is None or current.number != attempt.number:
                    return  # gone, or another attempt since: nothing of this one to write
                if current.job_id is not None:
                    if not current.confirmed:
                        await self.confirm(fresh)
                    return
                view = fresh
        raise RetryLater(
            f"Slurm job {job_id}: the resource changed at each of {RECEIPT_WRITES} writes of its "
            "id; the attempt is looked for by its name instead",
            self._backoff,
        )

    async def _write_receipt(
        self, view: ResourceView, job_id: int, views: list[SlurmJobView] | None
    ) -> None:
        submission = submitted(view.status, job_id, view.generation, utc_now())
        if not views:
            await self.confirm(await self.edge.apply(view, submission))
            return
        if await self.following.fold(
            view, confirmed(submission.status, leader(views).sluid), views
        ):
            for event in submission.events:
                await self.edge.event(view.ref, event.type, event.reason, event.message)
            return
        # Not the attempt's job (fold said so in an Event and wrote nothing): the receipt's id
        # is kept, unconfirmed, as `confirm` would leave it.
        number = (
            submission.status.current_attempt.number if submission.status.current_attempt else 0
        )
        await self.edge.apply(view, submission)
        raise RetryLater(f"Slurm job {job_id} is not attempt {number}'s job", self._backoff)

    async def confirm(self, view: ResourceView) -> None:
        """Fetch the job once by its numeric id: record the SLUID, take its state."""
        attempt = view.status.current_attempt
        assert attempt is not None
        assert attempt.job_id is not None
        client = await self.slurm()
        try:
            views: list[SlurmJobView] | None = await client.get_job(attempt.job_id)
        except SlurmNotFound:
            views = None  # purged already (a long outage): accounting, else Unknown
        except SlurmError as exc:
            raise RetryLater(str(exc), self._backoff) from exc
        sluid = leader(views).sluid if views else None
        # A quick job may already have ended: the same fold as the poller's (log tails, retry).
        # It refuses a job that is not this attempt's (the receipt's id, or the adopted one's,
        # is only a claim until the job's name and comment say so): nothing is confirmed.
        if not await self.following.fold(view, confirmed(view.status, sluid), views):
            raise RetryLater(
                f"Slurm job {attempt.job_id} is not attempt {attempt.number}'s job", self._backoff
            )

    async def adopt(self, view: ResourceView) -> ResourceView | None:
        """The last POST's answer was lost: look for the job by its unique name and adopt it.
        The view when the attempt gave way to a new one instead (declared lost, or never
        sent): the caller submits that, through the gate and holding a slot."""
        status = view.status
        attempt = status.current_attempt
        assert attempt is not None
        if declared_lost_now(attempt, view.annotations):
            return await self.edge.apply(view, declared_lost(status, view.generation, utc_now()))
        try:
            client = await self.slurm()
            found = await client.find_by_name(attempt.job_name)
        except SlurmError as exc:
            raise RetryLater(str(exc), self.settings.poll_interval) from exc
        # Derived from the resource: a status can be written by others (storage.locate).
        staging = attempt_dir(
            self.settings.storage_root, view.ref, attempt.number, attempt.staging_dir
        )
        staged = not attempt.staging_dir or await asyncio.to_thread(
            is_staged, self.settings, staging
        )
        owners = await self.identity.owners(view)
        if owners is None:
            raise RetryLater("not this cluster's to adopt", self.settings.poll_interval)
        decision = adoption(found, view.ref.uid, attempt, staged=staged, owners=owners)
        for impostor in decision.impostors:
            await self.identity.refused_owner(view.ref, attempt, impostor, "it is not adopted")
        if decision.action is AdoptAction.RESTART:
            # The operator stopped before the attempt's files were complete, and they are
            # always complete before the POST: this attempt was never sent. Start it over.
            assert attempt.staging_dir is not None
            await run_in(Pool.REMOVALS, remove_attempt, self.settings, staging)
            text = (
                f"attempt {attempt.number} was interrupted before it was sent; submitting it again"
            )
            return await self.edge.apply(
                view,
                not_submitted(status, Reason.SUBMIT_INTERRUPTED, text, view.generation, utc_now()),
            )
        key = (view.ref.uid, attempt.number)
        if decision.action is AdoptAction.WAIT:
            gave_way = await self._prove_absent(view, client, attempt, key)
            if gave_way is not None:
                return gave_way
            text = f"the job is not visible in Slurm yet; {self._way_out(client, attempt)}"
            await self.edge.apply(view, unconfirmed(status, text, view.generation, utc_now()))
            raise RetryLater(f"job {attempt.job_name} not found yet", self.settings.poll_interval)
        self._unfound_since.pop(key, None)
        keep = decision.keep
        assert keep is not None
        # The job's own id: an array's, not one of its tasks' (whose record may be all that
        # is left of it), which names every task for a cancel, a hold or a look-up.
        kept = job_of(keep)
        groups = by_leader(found)
        for duplicate in decision.duplicates:
            other = job_of(duplicate)
            job = await self.identity.check(
                view, attempt, groups[other], "the duplicate is not cancelled"
            )
            if job is None:
                continue
            await self.identity.cancel_quietly(job)
            self.metrics.duplicates_total.inc()
            await self.edge.event(
                view.ref,
                "Warning",
                "DuplicateCancelled",
                f"Slurm job {other} duplicated attempt {attempt.number} (kept {kept}); cancelled",
            )
        self.metrics.count_adoption("name")
        # An array has no SLUID of its own: each one names a single task's record.
        sluid = keep.sluid if keep.array_job_id is None else None
        view = await self.edge.apply(
            view,
            submitted(status, kept, view.generation, utc_now(), sluid=sluid, adopted=True),
        )
        await self.confirm(view)
        return None

    def _way_out(self, client: SlurmClient, attempt: Attempt) -> str:
        if mode(client.accounting) is Mode.PROOF:
            return (
                "with accounting answering it is proven absent, and the next attempt submitted, "
                f"once not found {self.window.seconds:.0f} s after it could last have been sent"
            )
        return (
            "without accounting only a person can declare it lost, after checking Slurm: "
            f"annotate {DECLARE_LOST_ANNOTATION}={attempt.number}"
        )

    async def _prove_absent(
        self, view: ResourceView, client: SlurmClient, attempt: Attempt, key: tuple[str, int]
    ) -> ResourceView | None:
        """The view with the attempt proven absent (`core.absence`), or None: not yet, not
        provable here, or found after all (the next search adopts it)."""
        now = time.monotonic()
        waited = now - self._unfound_since.setdefault(key, now)
        step = next_check(waited, self.window, await client.has_accounting())
        if step is not Next.PROVE:
            return None
        try:
            before = await client.dbd_queue()
            found = await client.find_by_name(attempt.job_name)
            after = await client.dbd_queue()
        except SlurmError as exc:
            log.info("proving %s absent: %s", attempt.job_name, exc)
            return None
        mine = any(belongs(job, view.ref.uid, attempt) for job in found)
        outcome = verdict(before, mine, after)
        if outcome is not Verdict.PROVEN:
            if outcome is Verdict.LAGGING:
                log.info(
                    "%s not proven absent: slurmctld has job records queued for slurmdbd "
                    "(%s before the lookup, %s after)",
                    attempt.job_name,
                    before,
                    after,
                )
            return None
        self._unfound_since.pop(key, None)
        self.metrics.proven_absent_total.inc()
        return await self.edge.apply(
            view, proven_absent(view.status, waited, view.generation, utc_now())
        )
