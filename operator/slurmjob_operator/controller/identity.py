"""Proving a Slurm job is a resource's before anything changes it, and acting as its owner.

Every change to a job (cancel, hold, release, a dependency update) goes through a
`core.verified.VerifiedJob`, which only `core.verified` makes, from views read in the current
step. This module is the controller's one door to it: it reads the job (or takes views the
caller read in this step, such as an adoption's search by name) through the operator's client
of this cluster, works out which Slurm users the resource may own there, has the handle made,
and says why when it cannot be: a `JobIdentityMismatch` or `JobChangeRefused` Warning Event
and `job_changes_refused_total{why}`. The client that then changes the job is the one acting
as the handle's owner, never one chosen from the status or the namespace alone.

Which cluster a resource is on comes from its spec (`spec.cluster`, immutable) and its
tenant's clusters, never from its status (`attempts[].cluster` is only a claim): a resource
whose spec names another cluster, or whose tenant may not use this one, has nothing changed
here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.status import Attempt, AttemptDependency
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.core import naming
from slurmjob_operator.core.decisions import IDENTITY_MISMATCH, mismatch_text
from slurmjob_operator.core.jobview import SlurmJobView
from slurmjob_operator.core.verified import Unverified, VerifiedJob, Why, step, verify
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound

log = logging.getLogger(__name__)

#: The Warning Event of a change refused before any job was read: the resource may not have
#: anything changed on this cluster.
CHANGE_REFUSED = "JobChangeRefused"


async def refuse_stranger(
    edge: ResourceEdge, ref: ObjectRef, attempt: Attempt, job: SlurmJobView, refused: str
) -> None:
    """Say that Slurm's job under the attempt's id is not the attempt's: both identities in
    the operator's log, ours and what differs in a Warning Event."""
    log.warning(
        "%s/%s attempt %s: Slurm job %s is not its job (expected name %r, uid %s; found job "
        "%s named %r with comment %r): %s",
        ref.namespace,
        ref.name,
        attempt.number,
        attempt.job_id,
        attempt.job_name,
        ref.uid,
        job.job_id,
        job.name,
        job.comment,
        refused,
    )
    await edge.event(
        ref, "Warning", IDENTITY_MISMATCH, mismatch_text(job, ref.uid, attempt, refused)
    )


class JobIdentity:
    def __init__(
        self,
        cluster: str,
        site: Site,
        edge: ResourceEdge,
        metrics: Metrics,
        slurm: Callable[[], Awaitable[SlurmClient]],
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]] | None = None,
    ) -> None:
        """`slurm`: the operator's client of this cluster (it reads); `slurm_as(user)`: the
        client acting as Slurm user `user` (None: the operator's own)."""
        self.cluster = cluster
        self.site = site
        self.edge = edge
        self.metrics = metrics
        self.slurm = slurm
        self._slurm_as = slurm_as

    async def owners(self, view: ResourceView) -> frozenset[str] | None:
        """The Slurm users whose jobs `view` may own on this cluster: its tenant's
        `slurmUser` here, and the operator's own user (jobs submitted before the tenant had
        one, or where it has none). None, said in an Event: nothing may be changed here."""
        refusal = self._cluster_refusal(view)
        if refusal is not None:
            self.metrics.job_changes_refused_total.labels(Why.CLUSTER.value).inc()
            log.warning("%s/%s: %s", view.ref.namespace, view.ref.name, refusal)
            await self.edge.event(view.ref, "Warning", CHANGE_REFUSED, refusal)
            return None
        users: set[str] = set()
        own = (await self.slurm()).user
        if own is not None:
            users.add(own)
        tenant = self.site.tenant_of(view.ref.namespace)
        if tenant is not None and tenant.slurm_user is not None:
            users.add(tenant.slurm_user)
        return frozenset(users)

    def _cluster_refusal(self, view: ResourceView) -> str | None:
        wanted = view.spec_cluster
        if wanted is not None and wanted != self.cluster:
            return (
                f"spec.cluster is {wanted}, but its attempt names cluster {self.cluster}: no "
                f"Slurm job on {self.cluster} is changed for it"
            )
        tenants = self.site.tenants
        tenant = tenants.get(view.ref.namespace) if tenants is not None else None
        if tenant is not None and not tenant.allows(self.cluster):
            return (
                f"tenant {tenant.name} may not use cluster {self.cluster}: no Slurm job there "
                "is changed for it (drain a cluster before removing it from a tenant)"
            )
        return None

    async def check(
        self,
        view: ResourceView,
        attempt: Attempt,
        views: Sequence[SlurmJobView],
        refused: str,
        *,
        owners: frozenset[str] | None = None,
    ) -> VerifiedJob | None:
        """A handle on the attempt's job from `views` (one job's, read in this step), or None
        when it is not the attempt's or not the resource's to change (said, nothing done).
        `owners`: as `owners(view)` answered in this step (asked again when None)."""
        if owners is None:
            owners = await self.owners(view)
            if owners is None:
                return None
        made = verify(views, view.ref.uid, attempt, owners=owners, cluster=self.cluster)
        if isinstance(made, VerifiedJob):
            return made
        await self._refused(view.ref, attempt, made, refused)
        return None

    async def read(
        self,
        view: ResourceView,
        attempt: Attempt,
        refused: str,
        job_id: int | None = None,
        *,
        through_sluid: bool = False,
    ) -> VerifiedJob | None:
        """Read the attempt's job (`job_id`, else the attempt's) now and make its handle;
        `through_sluid`: the attempt's job by the SLUID its status records, where the version
        takes one (an id Slurm reused since cannot answer for it). Raises `SlurmNotFound`
        when Slurm does not know the job, and the other `SlurmError`s of the read."""
        wanted = job_id if job_id is not None else attempt.job_id
        if wanted is None:
            raise SlurmNotFound("the attempt has no job id")
        owners = await self.owners(view)
        if owners is None:
            return None
        client = await self.slurm()
        ref = client.lifecycle_ref(wanted, attempt.sluid) if through_sluid else wanted
        views = await client.get_job(ref)
        return await self.check(view, attempt, views, refused, owners=owners)

    async def upstream_jobs(self, view: ResourceView, records: Sequence[AttemptDependency]) -> bool:
        """Whether each upstream job id of `records` (taken from an upstream SlurmJob's
        status: a claim) is, read now, that upstream's attempt's job: its derived name, its
        comment carrying the upstream's uid and attempt, a Slurm user of the tenant's. Only
        then does it go into a Slurm dependency: `afterok` on another's job would tell this
        one how that job ended. Each that is not is said in an Event."""
        if not records:
            return True
        owners = await self.owners(view)
        if owners is None:
            return False
        client = await self.slurm()
        for record in records:
            name = naming.job_name(view.ref.namespace, record.name, record.uid, record.attempt)
            attempt = Attempt(number=record.attempt, job_name=name, job_id=record.job_id)
            try:
                views = await client.get_job(record.job_id)
            except SlurmNotFound:
                return False
            with step():
                made = verify(views, record.uid, attempt, owners=owners, cluster=self.cluster)
            if not isinstance(made, VerifiedJob):
                await self._refused(
                    view.ref, attempt, made, f"it is not made a dependency (upstream {record.name})"
                )
                return False
        return True

    async def acting(self, job: VerifiedJob) -> SlurmClient:
        """The client acting as the job's owner."""
        if self._slurm_as is None:
            return await self.slurm()
        return await self._slurm_as(job.owner)

    async def cancel_quietly(self, job: VerifiedJob) -> None:
        """Cancel a job the operator does not wait for (a duplicate, a refused record, a late
        job): gone already is fine, a failure only logged."""
        try:
            await (await self.acting(job)).cancel(job)
        except SlurmNotFound:
            pass
        except SlurmError:
            log.exception("cannot cancel Slurm job %s", job.job_id)

    async def hold(self, job: VerifiedJob, held: bool) -> None:
        """Hold (or release) the job as its owner: every heterogeneous component (the
        client's `hold`), so none keeps nodes reserved in the backfill plan, blocking the jobs
        Kueue admitted in a held one's place."""
        await (await self.acting(job)).hold(job, held)

    async def _refused(
        self, ref: ObjectRef, attempt: Attempt, made: Unverified, refused: str
    ) -> None:
        if made.why is Why.NOTHING:
            return
        self.metrics.job_changes_refused_total.labels(made.why.value).inc()
        assert made.view is not None
        if made.why is Why.IDENTITY:
            await refuse_stranger(self.edge, ref, attempt, made.view, refused)
            return
        await self._foreign_owner(ref, attempt, made.view, refused)

    async def refused_owner(
        self, ref: ObjectRef, attempt: Attempt, job: SlurmJobView, refused: str
    ) -> None:
        """Say that a job carrying the attempt's identity is run by a Slurm user the resource
        may not own (a copied name and comment), and count it."""
        self.metrics.job_changes_refused_total.labels(Why.OWNER.value).inc()
        await self._foreign_owner(ref, attempt, job, refused)

    async def _foreign_owner(
        self, ref: ObjectRef, attempt: Attempt, job: SlurmJobView, refused: str
    ) -> None:
        log.warning(
            "%s/%s attempt %s: Slurm job %s belongs to Slurm user %r, not one this resource "
            "may own: %s",
            ref.namespace,
            ref.name,
            attempt.number,
            job.job_id,
            job.user,
            refused,
        )
        text = (
            f"Slurm job {job.job_id} carries attempt {attempt.number}'s identity but belongs "
            f"to a Slurm user this resource's jobs are never submitted as; {refused}"
        )
        await self.edge.event(ref, "Warning", IDENTITY_MISMATCH, text)
