"""The submission side of a resource, one step at a time: confirming a receipt and adopting a
job whose answer was lost (`adopter`), following a job in Slurm (Kueue's evictions, holds and
releases: `evictions`; spec.suspend's hold: `suspendhold`; dependency repoints: `repointing`),
and before a submit the chain of gates (`gates`), then the submit itself (`sender`).

What changes a tenant's job (the POST, a cancel, hold and release) is done as the tenant's
`slurmUser` (`slurm_as`); what only reads (confirmation, adoption lookups) as the operator
(`slurmlink`).

At most `submit_concurrency` submits at once; the others wait for a slot of the controller's
`FairLimiter`, served round-robin by namespace (lock order: `Submission.reconcile`). A submit
due from the watch's copy waits parked (the uid and that copy, no task, no kopf handler: the
handler returns; a handler never waits for a slot), so a burst of creates costs memory for
small entries, not for handlers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.adopter import Adopter
from slurmjob_operator.controller.dependencies import Dependencies
from slurmjob_operator.controller.evictions import Evictions
from slurmjob_operator.controller.expiry import Expiry
from slurmjob_operator.controller.fairness import FairLimiter, Held, Start
from slurmjob_operator.controller.following import Following
from slurmjob_operator.controller.gates import Chain, Pending
from slurmjob_operator.controller.gates.queue import AdmissionGate, RequiredQueueGate
from slurmjob_operator.controller.gates.refusal import SettledRefusalGate
from slurmjob_operator.controller.gates.retry import RetryDueGate
from slurmjob_operator.controller.gates.suspend import SuspendGate
from slurmjob_operator.controller.gates.upstreams import UpstreamsGate
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.limits import LimitsCache
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.repointing import Repointing
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater, Stale
from slurmjob_operator.controller.sender import Sender
from slurmjob_operator.controller.suspendhold import SuspendHold
from slurmjob_operator.core.decisions import Hold, awaits_upstream, gate, hold_action
from slurmjob_operator.core.dependencies import waiting_interval
from slurmjob_operator.core.kueue import queue_of
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.reconcile import Step, next_step
from slurmjob_operator.core.summary import with_summary
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.times import utc_now


def _started(status: SlurmJobStatus) -> bool:
    """Whether an attempt ever started: its dependencies were met then."""
    return any(a.started_at is not None for a in status.attempts)


class Submission:
    def __init__(
        self,
        settings: Settings,
        site: Site,
        edge: ResourceEdge,
        metrics: Metrics,
        slurm: Callable[[], Awaitable[SlurmClient]],
        following: Following,
        backoff: float,
        *,
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]] | None = None,
        limiter: FairLimiter[str] | None = None,
        clusters: Clusters | None = None,
        limits: LimitsCache | None = None,
        dependencies: Dependencies | None = None,
        queues: Queues | None = None,
        identity: JobIdentity | None = None,
    ) -> None:
        """`slurm_as(user)`: the client acting as a tenant's Slurm user (None: `slurm`);
        `identity`: what makes a job's handle before it is changed (None: one of its own);
        `limiter`: the slots submits are made in, by namespace (None: its own); `clusters`:
        every cluster's name (this one is `settings.cluster_name`); `limits`: the cluster's
        limits a request is checked against (None: read through `slurm`, per poll interval)."""
        cluster = settings.cluster_name
        clusters = clusters or Clusters((cluster,))
        self.edge = edge
        self.following = following
        self._limiter = limiter or FairLimiter[str](settings.submit_concurrency)
        limits = limits or LimitsCache(cluster, slurm, settings.poll_interval)
        identity = identity or JobIdentity(cluster, site, edge, metrics, slurm, slurm_as)
        # Kueue's admission is looked for this often while it waits, besides the Workload
        # watch (SLURMJOB_KUEUE) waking it on every change.
        admission_wait = max(1.0, min(10.0, settings.poll_interval))
        self.adopter = Adopter(settings, edge, metrics, slurm, following, identity, backoff)
        self.sender = Sender(
            settings,
            site,
            edge,
            metrics,
            slurm,
            slurm_as,
            clusters,
            limits,
            identity,
            self.adopter,
            backoff,
        )
        self.evictions = (
            Evictions(queues, edge, identity, slurm, backoff, admission_wait)
            if queues is not None
            else None
        )
        self.suspend_hold = SuspendHold(edge, identity)
        # Set by the controller where finished SlurmJobs may be deleted (`controller.expiry`).
        self.expiry: Expiry | None = None
        self.repointing = Repointing(dependencies, edge, identity, backoff)
        admission = AdmissionGate(queues, edge, self.evictions, self._again, admission_wait)
        # How soon a dependent that waits looks again, besides being woken by a change.
        self._upstreams = UpstreamsGate(
            dependencies, limits, waiting_interval(settings.poll_interval)
        )
        self.gates = Chain(
            edge,
            [
                SuspendGate(edge, admission.inactive),
                SettledRefusalGate(),
                RequiredQueueGate(site),
                admission,
                self._upstreams,
                RetryDueGate(),
            ],
        )

    @property
    def limits(self) -> LimitsCache:
        """The cluster's limits, one cache for the submit's check and the upstreams gate's."""
        return self.sender.limits

    @limits.setter
    def limits(self, cache: LimitsCache) -> None:
        self.sender.limits = cache
        self._upstreams.limits = cache

    async def reconcile(self, ref: ObjectRef, seen: ResourceView | None = None) -> None:
        """Drive a resource's submission side one step (create, resume and spec updates).

        Only a submit (render, record, stage, POST) holds a slot, given back once the POST is
        answered: the confirmation (a GET and the status write) is made after it, as
        following a job is, so the slots pace what only a submit costs. The slot is
        taken first, then the lock: the first step only finds a submit due, and the lock is
        let go while the slot is awaited (a waiter blocks no finalizer or poller, and no slot
        is awaited under a lock: `controller.fairness`); the second step reads the resource
        again, suspended, deleted or submitted by a concurrent retry meanwhile.

        `seen`: the resource as the watch delivered it (the handler's body). Where it shows
        nothing to do but follow the job, or a submit that is due, no read is made for the
        first step; anything else (a write to make) is decided on a fresh read, since a patch
        computed from a stale status could undo a newer one. A restart's resume of 10,000
        followed SlurmJobs costs no GET, a create one GET instead of two.

        A due submit is made from `seen` itself when it is conditioned (`ResourceView.of`):
        every status write of that step carries its resourceVersion (then the version the
        previous write returned), so a copy older than the apiserver's writes nothing, not
        even the write-ahead record before the POST, and the step is made again from a fresh
        read (`Stale`). A create then costs no GET at all."""
        if seen is not None and seen.ref.uid == ref.uid and not seen.deleting:
            settled = self._settled(seen)
            if settled is not None:
                if not settled:
                    if self.expiry is not None and next_step(seen.status) is Step.DONE:
                        await self.expiry.look(seen)
                    return
                await self._in_slot(ref, seen, park=True)
                return
        if not await self._step(ref, slot=None):
            return
        # A handler's call (`seen` given) waits for no slot either; a wake's or a test's does.
        await self._in_slot(ref, None, park=seen is not None)

    async def _in_slot(self, ref: ObjectRef, seen: ResourceView | None, *, park: bool) -> None:
        """The due submit of `ref` in a slot, from `seen` or a fresh read. With `park`, when
        every slot is taken the caller returns at once and the submit waits parked (the uid
        and `seen`: `FairLimiter.park`), to run as a wake once granted."""
        if not park:
            async with self._limiter.slot(ref.namespace) as held:
                await self._submit(ref, seen, held)
            return
        free = self._limiter.try_slot()
        if free is None:
            self._limiter.park(ref.namespace, ref.uid, self._parked(ref, seen))
            return
        await self._submit(ref, seen, free)

    async def _submit(self, ref: ObjectRef, seen: ResourceView | None, held: Held) -> None:
        """The due submit in the slot `held` (given back at the latest here): from `seen`, a
        conditioned copy read again once when it is stale (a second conflict is a wake, like
        any RetryLater), or from a fresh read."""
        try:
            if seen is None:
                await self._step(ref, slot=held)
                return
            try:
                await self._step(ref, slot=held, seen=seen if seen.resource_version else None)
            except Stale:
                await self._step(ref, slot=held)
        finally:
            held.release()

    def _parked(self, ref: ObjectRef, seen: ResourceView | None) -> Start:
        """What a parked submit starts once granted a slot: the step as a wake (its RetryLater
        and failures become wakes, `close` cancels it), the slot given back however it
        ends."""

        def start(held: Held) -> bool:
            return self.following.wakes.run(
                ref, lambda _: self._submit(ref, seen, held), done=held.release
            )

        return start

    def _settled(self, seen: ResourceView) -> bool | None:
        """From the watch's copy alone: True when a submit is due now (not suspended, no
        retry in the future), False when the job only needs following, None when a fresh read
        must decide."""
        step = next_step(seen.status)
        if awaits_upstream(seen.status) or (seen.depends_on and not _started(seen.status)):
            return None  # the upstreams are read first (a fresh read, before any slot)
        if queue_of(seen.labels):
            return None  # Kueue is asked first, and an eviction looked for (a fresh read)
        if step is Step.TRACK and hold_action(seen.status, seen.suspend) is Hold.NOTHING:
            self.edge.observe(seen.ref, seen.status)
            return False
        if (
            step is Step.DONE
            and with_summary(seen.status, seen.generation, utc_now()) == seen.status
        ):
            self.edge.observe(seen.ref, seen.status)
            return False  # final and written in step: a restart reads none of them again
        if step is Step.SUBMIT and not seen.suspend:
            blocked, transition = gate(seen.status, False, seen.generation, utc_now())
            if not blocked and transition is None:
                return True
        return None

    async def _step(
        self, ref: ObjectRef, *, slot: Held | None, seen: ResourceView | None = None
    ) -> bool:
        """One step under the resource's lock, from `seen` (a conditioned copy: `Stale` when
        it is not the apiserver's any more) or a fresh read. True: a submit is due and no
        `slot` is held; nothing was sent. A submit gives `slot` back once its POST is
        answered."""
        async with self.edge.step(ref.uid):
            view = seen if seen is not None else await self.edge.fresh(ref, conditioned=True)
            if view is None or view.deleting:
                return False
            step = next_step(view.status)
            # Before any gate: an unconfirmed attempt is adopted even while suspended or not
            # admitted (its job may run), and a receipt confirmed.
            if step is Step.ADOPT:
                gave_way = await self.adopter.adopt(view)
                if gave_way is None:
                    return False
                # The attempt gave way to a new one: SUBMIT or RETRY now, behind the gates.
                view, step = gave_way, next_step(gave_way.status)
            if step is Step.CONFIRM:
                await self.adopter.confirm(view)
                return False
            if step is Step.DONE:
                # Written only when out of step: a job that ended under a release without
                # the `Finished` condition gets it on its first reconcile after the upgrade.
                view = await self.edge.apply(view, Transition(view.status))
                if self.expiry is not None:
                    await self.expiry.look(view)
            if step not in (Step.SUBMIT, Step.RETRY):
                self.edge.observe(ref, view.status)
                if step is Step.TRACK:
                    await self._follow(view)
                return False
            pending = Pending(view, step)
            if not await self.gates.run(pending):
                return False
            if slot is None or not slot.held:
                return True
            await self.sender.submit(
                pending.view, pending.upstream, pending.admitted, sent=slot.release
            )
            return False

    def _again(self, ref: ObjectRef, delay: float) -> None:
        """Reconcile `ref` again after `delay`: for what a Workload event's reconcile, which
        no handler retries, would otherwise drop."""
        self.following.wakes.at(ref, max(delay, 1.0))

    async def _follow(self, view: ResourceView) -> None:
        """A job in Slurm: Kueue's verdict on it first (an eviction ends or holds it), then
        spec.suspend's hold and the repoints of its dependencies."""
        followed: ResourceView | None = view
        if self.evictions is not None:
            try:
                followed = await self.evictions.follow(view)
            except RetryLater as exc:
                # A followed job has no handler retry pending (a Workload event's reconcile
                # drops RetryLater): it is tried again from here.
                self._again(view.ref, exc.delay)
                raise
        if followed is None:
            return
        await self.suspend_hold.sync(followed)
        await self.repointing.follow(followed)
