"""Deleting a resource: cancel its live jobs (found by name, whatever its status says), wait
for the end, write the last log tails into the status when anything besides the operator's
finalizer still holds the resource (`decisions.tails_outlive_deletion`: otherwise it is gone
at once and nobody reads them), archive every attempt's files (`archiving.Archiver`, when the
admin set an archive root), remove the staging directory.

The cancel is sent as the Slurm user of the resource's tenant, found from its namespace (the
tenants file), never from the status; looking the jobs up and waiting for their end is the
operator's own. The listings, cancels and waits of resources deleted together are coalesced
(`joblisting.SharedListing`, `cancelling.Canceller`): one `GET /jobs`, one `DELETE /jobs` and
one state sweep per moment for all of them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from slurmjob_operator import FINALIZER
from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import Attempt
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.archiving import Archiver
from slurmjob_operator.controller.cancelling import Canceller
from slurmjob_operator.controller.following import Following
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.joblisting import SharedListing
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.removals import RemovalSweep, remove_checkpoint
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core import naming
from slurmjob_operator.core.arrays import shown_index
from slurmjob_operator.core.claims import made_numbers
from slurmjob_operator.core.decisions import tails_outlive_deletion
from slurmjob_operator.core.following import with_logs
from slurmjob_operator.core.jobview import by_leader
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.core.verified import VerifiedJob
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.storage.executors import Pool, run_in
from slurmjob_operator.storage.ledger import attempts_made
from slurmjob_operator.storage.staging import remove_resource_dir

log = logging.getLogger(__name__)


class Deletion:
    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        slurm: Callable[[], Awaitable[SlurmClient]],
        following: Following,
        identity: JobIdentity,
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]] | None = None,
    ) -> None:
        """`identity`: what makes a job's handle before it is cancelled; `slurm_as(user)`:
        the client acting as Slurm user `user` (the handle's owner)."""
        self.settings = settings
        self.edge = edge
        self.slurm = slurm
        self.following = following
        self.identity = identity
        self._slurm_as = slurm_as
        self.canceller = Canceller(slurm, self._client_as)
        self.listing = SharedListing(slurm)
        self.queues: Queues | None = None
        # Where the store keeps a resource after its finalizer (`KeepsDeleted`), the last
        # tails are read there.
        self.resources_kept = False
        self.archiver: Archiver | None = None
        # The operator's background sweep of checkpoint directories (`controller.removals`);
        # without one (the local runner) the finalizer removes all of it.
        self.sweep: RemovalSweep | None = None

    async def _client_as(self, user: str | None) -> SlurmClient:
        return await (self.slurm() if self._slurm_as is None else self._slurm_as(user))

    async def finalize(self, view: ResourceView) -> None:
        """Raises RetryLater while the job is still ending."""
        ref = view.ref
        async with self.edge.step(ref.uid):
            # The handler's body predates the lock: a retry may have submitted a new attempt.
            view = await self.edge.fresh(ref) or view
            attempt = view.status.current_attempt
            # Whatever the status says (final, another job, another cluster: claims), the
            # resource's live jobs on this cluster are looked for by name and ended.
            ended = await self.end_jobs(view)
            if (
                ended
                and attempt is not None
                and tails_outlive_deletion(view.finalizers, FINALIZER, kept=self.resources_kept)
            ):
                await self._last_tails(view, attempt)
            if self.archiver is not None and self.archiver.enabled:
                await self.archiver.archive(await self.edge.fresh(ref) or view)
            # Whatever the spec says now (an edit may have dropped walltime, or broken it).
            kept = await self._remove_checkpoint(view)
            try:
                await run_in(
                    Pool.REMOVALS,
                    remove_resource_dir,
                    self.settings,
                    ref.namespace,
                    ref.name,
                    ref.uid,
                )
            except OSError as exc:
                if not kept:
                    raise
                # What the job left unremovable in its checkpoint directory (said in the
                # Event) never holds the finalizer.
                log.warning("%s/%s: staging not removed in full: %s", ref.namespace, ref.name, exc)
            if self.queues is not None:
                await self.queues.delete(view)  # the quota is released with the job
        self.edge.forget(ref)

    async def _remove_checkpoint(self, view: ResourceView) -> bool:
        """The walltime chain's checkpoint directory, the job's own files: removed in bounded
        passes (`controller.removals`), what could not be said in an Event (True: something
        stayed in the resource directory); the finalizer never waits on it for long."""
        return await remove_checkpoint(self.settings, view.ref, self.edge.event, self.sweep)

    async def _last_tails(self, view: ResourceView, attempt: Attempt) -> None:
        """The ended job's last log tails into the status, on the version they were read
        with (a status written meanwhile is read again, once; the tails are a courtesy, the
        finalizer does not wait for them)."""
        if not attempt.staging_dir:
            return

        async def write_tails(fresh: ResourceView) -> None:
            logs = await self.following.logs(fresh, attempt, index=shown_index(fresh.status))
            if logs is not None:
                tails = with_logs(fresh.status, logs, self.settings.status_tail_bytes)
                await self.edge.apply(fresh, Transition(tails))

        await self.edge.on_fresh(view.ref, write_tails, quiet=True)

    async def end_jobs(self, view: ResourceView) -> bool:
        """Cancel every live job of the resource on this cluster, each once a read shows it
        is the resource's to cancel, and wait for their end; True when there was one.

        Found by name in the moment's shared listing (`joblisting`): the names of every
        attempt the operator made (`core.claims.next_attempt`: the status's and the attempt
        directories'), each job verified by its name, comment and Slurm user before it is
        cancelled (coalesced: one `DELETE /jobs` for the moment's deletions). Returns at once
        when the resource may have nothing changed on this cluster (said in an Event)."""
        ref = view.ref
        try:
            made = await asyncio.to_thread(
                attempts_made, self.settings, ref.namespace, ref.name, ref.uid
            )
        except OSError as exc:
            # The status's count alone: its live jobs by those names are still ended.
            log.warning("%s/%s: attempts not counted on storage: %s", ref.namespace, ref.name, exc)
            made = 0
        names = {
            naming.job_name(ref.namespace, ref.name, ref.uid, number): number
            for number in made_numbers(view.status, made)
        }
        if not names:
            return False  # no attempt was ever made: no job to look for
        owners = await self.identity.owners(view)
        if owners is None:
            return False
        try:
            live = await self.listing.live(names)
        except SlurmError as exc:
            raise RetryLater(f"the jobs of {ref.name} could not be listed: {exc}", 5) from exc
        ending: list[tuple[VerifiedJob, bool]] = []
        for views in by_leader(live).values():
            number = names[views[0].name]
            # The operator's own record of the attempt: its derived name, no claimed id.
            attempt = Attempt(number=number, job_name=views[0].name)
            job = await self.identity.check(
                view, attempt, views, "it is not cancelled", owners=owners
            )
            if job is not None:
                await self.canceller.cancel(job)
                ending.append((job, any(v.array_job_id is not None for v in views)))
        client = await self.slurm()
        for job, array in ending:
            if not await self.canceller.until_final(
                job.job_id, self.settings.delete_timeout, array=array
            ):
                raise RetryLater(f"Slurm job {job.job_id} is still ending", 5)
            target = client.lifecycle_ref(job.job_id, job.sluid)
            via = f" through its SLUID {target}" if isinstance(target, str) else ""
            text = f"Slurm job {job.job_id} cancelled{via} on deletion"
            await self.edge.event(ref, "Normal", "Cancelled", text)
        return bool(ending)
