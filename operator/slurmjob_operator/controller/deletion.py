"""Deleting a resource: cancel its job unless it is final, wait for the end, write the last
log tails into the status when anything besides the operator's finalizer still holds the
resource (`decisions.tails_outlive_deletion`: otherwise it is gone at once and nobody reads
them), archive every attempt's files (`archiving.Archiver`, when the admin set an archive
root), remove the staging directory.

The cancel is sent as the Slurm user of the resource's tenant, found from its namespace (the
tenants file), never from the status; looking the job up and waiting for its end is the
operator's own. The cancels and waits of resources deleted together are coalesced
(`cancelling.Canceller`): one `DELETE /jobs` and one state sweep per moment for all of them."""

from __future__ import annotations

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
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.removals import RemovalSweep, remove_checkpoint
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.arrays import shown_index
from slurmjob_operator.core.decisions import belongs, tails_outlive_deletion
from slurmjob_operator.core.finality import is_final
from slurmjob_operator.core.following import with_logs
from slurmjob_operator.core.jobview import by_leader
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmNotFound
from slurmjob_operator.storage.executors import Pool, run_in
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
            status = view.status
            attempt = status.current_attempt
            live = not is_final(status)
            if attempt is not None and live:
                client = await self.slurm()
                await self._end_job(view, client, attempt)
                if tails_outlive_deletion(view.finalizers, FINALIZER, kept=self.resources_kept):
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

    async def _end_job(self, view: ResourceView, client: SlurmClient, attempt: Attempt) -> None:
        """Cancel the attempt's job, once a read shows it is the resource's to cancel, and
        wait for its end. Returns at once (the finalizer goes) when it is gone, not the
        attempt's, or not the resource's to change on this cluster (each said in an Event)."""
        ref = view.ref
        refused = "it is not cancelled"
        if attempt.job_id is None:
            # An unconfirmed submission may still have created a job: cancel what carries
            # this attempt's name and identity.
            owners = await self.identity.owners(view)
            if owners is None:
                return
            found = await client.find_by_name(attempt.job_name)
            mine = [j for j in found if belongs(j, ref.uid, attempt)]
            for views in by_leader(mine).values():
                job = await self.identity.check(view, attempt, views, refused, owners=owners)
                if job is not None:
                    await self.identity.cancel_quietly(job)
            return
        # The job id is a claim (ids are reused; a status can be written): look before
        # cancelling, and leave another's job alone.
        try:
            job = await self.identity.read(view, attempt, refused, through_sluid=True)
            if job is None:
                return
            # Coalesced with the other deletions of the moment: one DELETE for all of them.
            await self.canceller.cancel(job)
        except SlurmNotFound:
            return
        target = client.lifecycle_ref(job.job_id, job.sluid)
        # An array's id stands for all its tasks: cancelled together, waited for together.
        array = attempt.array is not None
        if await self.canceller.until_final(
            attempt.job_id, self.settings.delete_timeout, array=array
        ):
            via = f" through its SLUID {target}" if isinstance(target, str) else ""
            text = f"Slurm job {attempt.job_id} cancelled{via} on deletion"
            await self.edge.event(ref, "Normal", "Cancelled", text)
            return
        raise RetryLater(f"Slurm job {attempt.job_id} is still ending", 5)
