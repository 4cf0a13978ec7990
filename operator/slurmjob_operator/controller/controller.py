"""The controller: one per Slurm cluster (`controller.fleet` routes the resources between
them; one alone in `LocalRunner`), composing the lifecycle pieces around one resource edge, one
registry and one slurmrestd client.

The poller, the fleet and the local runner use only the methods below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.archiving import Archiver
from slurmjob_operator.controller.deletion import Deletion
from slurmjob_operator.controller.dependencies import Dependencies
from slurmjob_operator.controller.expiry import Expiry
from slurmjob_operator.controller.fairness import FairLimiter
from slurmjob_operator.controller.following import Following
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.pipeline import Site, probe_keys_of
from slurmjob_operator.controller.probebook import ProbeBook, probe_book
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.reachability import Reachability
from slurmjob_operator.controller.registry import Registry, Tracked
from slurmjob_operator.controller.removals import RemovalSweep
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.controller.slurmlink import ClientSource, SlurmLink
from slurmjob_operator.controller.submission import Submission
from slurmjob_operator.controller.wakes import Wakes, reconcile_failed
from slurmjob_operator.core.dependencies import waiting_interval
from slurmjob_operator.core.expiry import TtlPolicy
from slurmjob_operator.core.jobview import SlurmJobView
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.imagecache.meter import CacheMeter
from slurmjob_operator.imagecache.verifygate import artifact_gate
from slurmjob_operator.imagecache.wiring import cache_sweeper, image_gate
from slurmjob_operator.kube import ResourceStore, WorkloadStore
from slurmjob_operator.kube.ports import (
    KeepsDeleted,
    NamespaceReader,
    ResourceDeleter,
)
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.auth import TokenProvider
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import make_token_provider
from slurmjob_operator.slurm.http import HttpTransport


class Controller:
    def __init__(
        self,
        settings: Settings,
        kube: ResourceStore,
        transport: HttpTransport,
        metrics: Metrics,
        *,
        token: TokenProvider | None = None,
        link: ClientSource | None = None,
        clusters: Clusters | None = None,
        submit_slots: FairLimiter[str] | None = None,
        wakes: Wakes | None = None,
        probes: ProbeBook | None = None,
    ) -> None:
        """`settings`: this cluster's (`site.clusters`); `clusters`: every cluster's name
        (None: this one alone); `wakes`: the process's wake service (the fleet's, bound to
        its routing; None: one of its own, reconciling here); `probes`: the process's probe
        book (`probe_book`; None: one of its own, where the store holds ConfigMaps)."""
        self.settings = settings
        self.name = settings.cluster_name
        self.clusters = clusters or Clusters((self.name,))
        self.kube = kube
        self.transport = transport
        self.metrics = metrics
        self.token = token or make_token_provider(settings)
        self.site = Site.load(settings, self.clusters.names)
        # A tenant whose jobs could never be sent as its user, or whose files could never be
        # shared with it, is refused here rather than job by job.
        self.site.check_tenant_users()
        self.registry = Registry()
        self._link = link or SlurmLink(
            settings,
            transport,
            self.token,
            metrics.requests_of(self.name),
            users=self.site.slurm_users,
        )
        self._edge = ResourceEdge(kube, metrics, self.registry)
        # The one door to changing a Slurm job: read now, proven the resource's, as its owner.
        self.identity = JobIdentity(
            self.name, self.site, self._edge, metrics, self.slurm, self.slurm_as
        )
        # How soon to try again when Slurm or a Secret is not there yet: a few poll intervals.
        backoff = max(1.0, min(30.0, settings.poll_interval * 5))
        if wakes is None:
            wakes = Wakes(self.reconcile, backoff=backoff, on_error=reconcile_failed(metrics))
            metrics.wakes_pending.set_function(lambda: len(self.wakes))
        self.wakes = wakes
        self._following = Following(
            settings,
            self._edge,
            self.slurm,
            self.wakes,
            backoff,
            job_uid=self.site.job_uid,
            identity=self.identity,
            on_late=metrics.late_submits_cancelled_total.inc,
            probe_keys=lambda view, placed: (
                probe_keys_of(view.spec, self.site, view.ref.namespace, placed)
                if view.spec is not None
                else None
            ),
        )
        # One for the process (the fleet's clusters share it): submits in progress at once,
        # the waiting ones by namespace.
        self.submit_slots = submit_slots or FairLimiter[str](
            settings.submit_concurrency, on_waiting=metrics.waiting_submissions.set
        )
        self._dependencies = Dependencies(
            kube,
            self.clusters,
            self.name,
            self.wakes,
            interval=waiting_interval(settings.poll_interval),
            tenants=self.site.tenants,
        )
        # Kueue's Workloads, where the store can hold them (not the local runner's files).
        self._queues = Queues(kube) if isinstance(kube, WorkloadStore) else None
        if self._queues is not None:
            self._edge.after_phase = self._queues.observed
        self._reachability = Reachability(settings, self._edge)
        self._submission = Submission(
            settings,
            self.site,
            self._edge,
            metrics,
            self.slurm,
            self._following,
            backoff,
            slurm_as=self.slurm_as,
            limiter=self.submit_slots,
            clusters=self.clusters,
            dependencies=self._dependencies,
            queues=self._queues,
            identity=self.identity,
        )
        self.expiry = Expiry(
            self._edge,
            kube if isinstance(kube, ResourceDeleter) else None,
            TtlPolicy(settings.ttl_after_finished_default, settings.ttl_after_finished_max),
            self.wakes,
            self.depended_on,
            recheck=waiting_interval(settings.poll_interval),
        )
        self._submission.expiry = self.expiry
        self._deletion = Deletion(
            settings, self._edge, self.slurm, self._following, self.identity, self.slurm_as
        )
        self._deletion.queues = self._queues
        self.archiver = Archiver(
            settings,
            self._edge,
            kube if isinstance(kube, NamespaceReader) else None,
            self.site.job_uid,
            tenant_of=self.site.tenant_name,
        )
        self._deletion.archiver = self.archiver
        self._deletion.resources_kept = isinstance(kube, KeepsDeleted)
        # The collective probe's cache and avoid lists, where the store holds ConfigMaps.
        # One book for every cluster's part (`probes`): each weighing the ConfigMap's bound
        # on its own memory would let them fill it past the bound together.
        self.probes = probes if probes is not None else probe_book(settings, kube)
        self._following.probing.probes = self.probes
        self._submission.sender.checks.probes = self.probes
        # The image cache, where images are enabled and the store holds ConfigMaps.
        gate = image_gate(settings, kube, self.slurm_as, metrics)
        self._submission.sender.checks.images = gate
        # Registry artifacts verified once by a job of the cache user, where the site says so.
        self._submission.sender.checks.artifacts = artifact_gate(settings, kube, self.slurm_as)
        #: The leader's sweep of the image cache (started by the startup handler).
        sizes = CacheMeter(metrics).sizes
        self.image_sweeper = cache_sweeper(gate, kube, sizes) if gate is not None else None

    def depended_on(self, namespace: str, name: str) -> bool:
        """Whether a SlurmJob of this cluster still to finish names this one in dependsOn."""
        return bool(self._dependencies.dependents_of(namespace, name))

    async def slurm(self) -> SlurmClient:
        """The operator's own client, connected (and the version chosen) on first use."""
        return await self._link.client()

    async def slurm_as(self, user: str | None) -> SlurmClient:
        """The client acting as Slurm user `user` (a tenant's slurmUser; None: the operator)."""
        return await self._link.client_for(user)

    async def reconcile(
        self, ref: ObjectRef, body: Mapping[str, Any] | ResourceView | None = None
    ) -> None:
        """Drive the submission side one step; raises RetryLater when it must run again.
        `body`: the resource as the watch delivered it, when there is one (kopf's handlers;
        the fleet passes the view it parsed to route it)."""
        seen = (
            body
            if isinstance(body, ResourceView) or body is None
            else ResourceView.of(body, conditioned=True)
        )
        await self._submission.reconcile(ref, seen)

    async def refresh(
        self, tracked: Tracked, views: Sequence[SlurmJobView] | None, *, logs_only: bool = False
    ) -> None:
        await self._following.refresh(tracked, views, logs_only=logs_only)

    def sweep_removals_with(self, sweep: RemovalSweep) -> None:
        """What the finalizer leaves of a checkpoint directory goes to `sweep` (the
        operator's, started with it); without one the finalizer removes all of it."""
        self._deletion.sweep = sweep

    async def finalize(self, body: Mapping[str, Any] | ResourceView) -> None:
        """Deletion; raises RetryLater while the job is still ending."""
        await self._deletion.finalize(_view(body))

    async def end_jobs(self, view: ResourceView) -> bool:
        """Cancel the resource's live jobs on this cluster and wait for their end (a deletion
        of a resource that belongs to another cluster while its attempt names this one)."""
        async with self._edge.step(view.ref.uid):
            return await self._deletion.end_jobs(view)

    async def report_reachability(self, reachable: bool, reason: Reason, message: str) -> None:
        await self._reachability.report(self.registry.followed(), reachable, reason, message)

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        await self._edge.event(ref, type_, reason, message)

    def observe_body(
        self,
        body: Mapping[str, Any] | ResourceView,
        *,
        deleted: bool = False,
        gone: bool | None = None,
    ) -> None:
        """Every watch event: what the poller must follow, and whose dependents to wake.
        `deleted`: deleted, or another cluster's (the fleet); `gone`: deleted (None: as
        `deleted`), since another cluster's SlurmJob may still be an upstream here."""
        view = _view(body)
        if deleted if gone is None else gone:
            self.wakes.forget(view.ref.uid)  # really deleted: nothing to look at again
        if deleted:
            self._edge.forget(view.ref)
        else:
            self._edge.observe(view.ref, view.status)
            self.expiry.noticed(view)
        self._dependencies.noticed(view, deleted=deleted, gone=gone)

    def followed(self) -> list[Tracked]:
        return self.registry.followed()

    def phase_counts(self) -> Mapping[str, int]:
        return self.registry.phase_counts()


def _view(body: Mapping[str, Any] | ResourceView) -> ResourceView:
    return body if isinstance(body, ResourceView) else ResourceView.of(body)
