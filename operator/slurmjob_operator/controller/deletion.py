"""Deleting a resource: cancel its job unless it is final, wait for the end, archive the log
tails into the status, remove the staging directory.

The cancel is sent as the Slurm user of the resource's tenant, found from its namespace (the
tenants file), never from the status; looking the job up and waiting for its end is the
operator's own. The cancels and waits of resources deleted together are coalesced
(`cancelling.Canceller`): one `DELETE /jobs` and one state sweep per moment for all of them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.status import Attempt
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.cancelling import Canceller
from slurmjob_operator.controller.following import Following, refuse_stranger
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.controller.slurmlink import cancel_quietly
from slurmjob_operator.core.arrays import shown_index
from slurmjob_operator.core.decisions import belongs, stranger
from slurmjob_operator.core.following import with_logs
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmNotFound
from slurmjob_operator.storage.staging import remove_resource_dir


class Deletion:
    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        slurm: Callable[[], Awaitable[SlurmClient]],
        following: Following,
        site: Site | None = None,
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]] | None = None,
    ) -> None:
        """`slurm_as(user)`: the client acting as Slurm user `user` (a tenant's slurmUser, as
        `site` says for the namespace)."""
        self.settings = settings
        self.edge = edge
        self.slurm = slurm
        self.following = following
        self._site = site
        self._slurm_as = slurm_as
        self.canceller = Canceller(slurm, self._client_as)
        self.queues: Queues | None = None

    async def _client_as(self, user: str | None) -> SlurmClient:
        return await (self.slurm() if self._slurm_as is None else self._slurm_as(user))

    def _user(self, ref: ObjectRef) -> str | None:
        """Who cancels `ref`'s jobs: its namespace's tenant's Slurm user (a non-admin
        operator user may not cancel another user's job); None: the operator."""
        if self._slurm_as is None or self._site is None:
            return None
        return self._site.slurm_user(ref.namespace)

    async def finalize(self, view: ResourceView) -> None:
        """Raises RetryLater while the job is still ending."""
        ref = view.ref
        async with self.edge.lock(ref.uid):
            # The handler's body predates the lock: a retry may have submitted a new attempt.
            view = await self.edge.fresh(ref) or view
            status = view.status
            attempt = status.current_attempt
            live = status.phase is None or not status.phase.is_terminal
            if attempt is not None and live:
                client = await self.slurm()
                await self._end_job(ref, client, attempt)
                fresh = await self.edge.fresh(ref)
                if fresh is not None and attempt.staging_dir:
                    logs = await self.following.logs(
                        fresh, attempt, index=shown_index(fresh.status)
                    )
                    if logs is not None:
                        tails = with_logs(fresh.status, logs, self.settings.status_tail_bytes)
                        await self.edge.apply(fresh, Transition(tails))
            await asyncio.to_thread(
                remove_resource_dir, self.settings, ref.namespace, ref.name, ref.uid
            )
            if self.queues is not None:
                await self.queues.delete(view)  # the quota is released with the job
        self.edge.forget(ref)

    async def _end_job(self, ref: ObjectRef, client: SlurmClient, attempt: Attempt) -> None:
        if attempt.job_id is None:
            # An unconfirmed submission may still have created a job: cancel what carries
            # this attempt's name and identity.
            for job in await client.find_by_name(attempt.job_name):
                if belongs(job, ref.uid, attempt):
                    await cancel_quietly(await self._client_as(self._user(ref)), job.job_id)
            return
        target = client.lifecycle_ref(attempt.job_id, attempt.sluid)
        # The job id is a claim (ids are reused; a status can be written): look before
        # cancelling, and leave another's job alone.
        try:
            other = stranger(await client.get_job(target), ref.uid, attempt)
            if other is not None:
                await refuse_stranger(self.edge, ref, attempt, other, "it is not cancelled")
                return
            # Coalesced with the other deletions of the moment: one DELETE for all of them.
            await self.canceller.cancel(self._user(ref), target)
        except SlurmNotFound:
            return
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
