"""Several Slurm clusters behind one operator: one `Controller` (and one poller) per cluster,
and the routing of each SlurmJob to the one that owns it (`core.placement`).

Each cluster's part has its own slurmrestd client, registry and reachability: a cluster that
is down leaves the others' jobs alone, and each is swept once per interval. The fleet is what
kopf's handlers talk to; it holds no state of its own besides the members.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.controller.controller import Controller
from slurmjob_operator.controller.placing import placement
from slurmjob_operator.controller.registry import Tracked
from slurmjob_operator.controller.resource import RetryLater
from slurmjob_operator.core.claims import Placement, claimed_cluster
from slurmjob_operator.core.placement import Clusters

log = logging.getLogger(__name__)

# Seconds between two looks at a resource whose cluster is not configured.
UNPLACED_RETRY = 300.0
#: Resources whose unplaced attempt was reported, remembered at most (then told again).
MAX_TOLD = 10_000


class Fleet:
    def __init__(self, members: list[Controller], clusters: Clusters) -> None:
        """`members`: one controller per cluster, in the order of `clusters.names`."""
        if [m.name for m in members] != list(clusters.names):
            raise ValueError("one controller per cluster, in the clusters' order")
        self.clusters = clusters
        self.members = members
        self._by_name = {m.name: m for m in members}
        # The process's one wake service (every member shares it: `handlers.lifecycle`): a
        # wake reads the resource afresh and routes it here.
        self.wakes = members[0].wakes
        self.wakes.bind(self.wake)
        self._told: set[str] = set()  # uids whose unplaced attempt was reported
        # A dependent may be any cluster's: a finished SlurmJob is kept while one of any
        # cluster still needs it.
        for member in members:
            member.expiry.upstream_of = self.depended_on

    def depended_on(self, namespace: str, name: str) -> bool:
        return any(m.depended_on(namespace, name) for m in self.members)

    @property
    def default(self) -> Controller:
        return self.members[0]

    def _placement(self, view: ResourceView) -> Placement:
        return placement(self.clusters, self.default.site.tenants, view)

    def owner(self, view: ResourceView) -> Controller | None:
        """The controller that follows the resource (`core.claims.Placement.followed_on`:
        where its spec and tenant put it); None when its current attempt claims another
        cluster (a cluster removed or renamed, a tenant's default changed, or a status
        rewritten): no cluster's part follows or resubmits it, since one's lookups would
        call another's job lost. A deletion still looks for its jobs (`finalize`)."""
        name = self._placement(view).followed_on
        return self._by_name[name] if name is not None else None

    async def _unplaced(self, view: ResourceView) -> None:
        where = self._placement(view)
        attempt = view.status.current_attempt
        named = claimed_cluster(attempt) if attempt is not None else None
        message = (
            f"attempt {attempt.number if attempt else '?'} names cluster "
            f"{named or '(unnamed)'}, but the SlurmJob belongs to cluster {where.home} "
            f"(spec.cluster, else its tenant's default, else the first of "
            f"{', '.join(self.clusters.names)}): it is neither followed nor resubmitted; "
            "deleting it cancels its live jobs wherever they are found"
            + (
                " (an unnamed attempt belongs to the cluster named SLURMJOB_CLUSTER_NAME)"
                if named is None
                else ""
            )
        )
        if view.ref.uid not in self._told:
            if len(self._told) >= MAX_TOLD:
                self._told.clear()
            self._told.add(view.ref.uid)
            log.warning("%s/%s: %s", view.ref.namespace, view.ref.name, message)
            await self.default.event(view.ref, "Warning", "ClusterUnknown", message)
        raise RetryLater(message, UNPLACED_RETRY)

    async def reconcile(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        # The apiserver's copy (the watch's, or a wake's read): a submit may be made from it,
        # its writes conditioned on its version (`Submission.reconcile`).
        view = ResourceView.of(body, conditioned=True)
        owner = self.owner(view)
        if owner is None:
            await self._unplaced(view)
            return
        await owner.reconcile(ref, view)  # the view parsed here, not parsed again

    async def wake(self, ref: ObjectRef) -> None:
        """Reconcile `ref` now, from a fresh read (something it depends on changed)."""
        body = await self.members[0].kube.get(ref.namespace, ref.name)
        if body is None or (body.get("metadata") or {}).get("uid") != ref.uid:
            return
        await self.reconcile(ref, body)

    async def finalize(self, body: Mapping[str, Any]) -> None:
        view = ResourceView.of(body)
        where = self._placement(view)
        follower = where.followed_on or where.home
        for name in where.looked_on:
            if name != follower:
                # The resource's live jobs on the other cluster of the two (where it belongs,
                # where its attempt claims to be) are ended too, found by name and verified.
                await self._by_name[name].end_jobs(view)
        await self._by_name[follower].finalize(view)

    def observe_body(self, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        # Every watch event of every SlurmJob: parsed once for the routing and the owner.
        view = ResourceView.of(body)
        owner = None if deleted else self.owner(view)
        # A resource is followed by one cluster's part at most (its placement never changes
        # once an attempt is recorded; before that nothing follows it anywhere). Every part
        # keeps it as an upstream its own dependents may name, until it is really deleted.
        for member in self.members:
            member.observe_body(view, deleted=member is not owner, gone=deleted)

    def followed(self) -> list[Tracked]:
        return [item for member in self.members for item in member.followed()]

    def phase_counts(self) -> Mapping[str, int]:
        total: Counter[str] = Counter()
        for member in self.members:
            total.update(member.phase_counts())
        return dict(total)
