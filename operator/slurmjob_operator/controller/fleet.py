"""Several Slurm clusters behind one operator: one `Controller` (and one poller) per cluster,
and the routing of each SlurmJob to the one that owns it (`core.placement`).

Each cluster's part has its own slurmrestd client, registry and reachability: a cluster that
is down leaves the others' jobs alone, and each is swept once per interval. The fleet is what
kopf's handlers talk to; it holds no state of its own besides the members.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.controller.controller import Controller
from slurmjob_operator.controller.registry import Tracked
from slurmjob_operator.core.placement import Clusters


class Fleet:
    def __init__(self, members: list[Controller], clusters: Clusters) -> None:
        """`members`: one controller per cluster, in the order of `clusters.names`."""
        if [m.name for m in members] != list(clusters.names):
            raise ValueError("one controller per cluster, in the clusters' order")
        self.clusters = clusters
        self.members = members
        self._by_name = {m.name: m for m in members}

    @property
    def default(self) -> Controller:
        return self.members[0]

    def owner(self, view: ResourceView) -> Controller:
        """The controller of the cluster the resource belongs to."""
        if len(self.members) == 1:
            return self.default
        tenant_default = None
        tenants = self.default.site.tenants
        if tenants is not None and not view.status.attempts:
            tenant_default = tenants.default_cluster(view.ref.namespace)
        name = self.clusters.place(
            view.spec_cluster, [a.cluster for a in view.status.attempts], tenant_default
        )
        return self._by_name[name]

    def _of(self, body: Mapping[str, Any]) -> Controller:
        return self.owner(ResourceView.of(body))

    async def reconcile(self, ref: ObjectRef, body: Mapping[str, Any]) -> None:
        await self._of(body).reconcile(ref, body)

    async def finalize(self, body: Mapping[str, Any]) -> None:
        await self._of(body).finalize(body)

    def observe_body(self, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        if deleted:
            for member in self.members:
                member.observe_body(body, deleted=True)
            return
        owner = self._of(body)
        owner.observe_body(body)
        # A resource is followed by one cluster's part only (its placement never changes
        # once an attempt is recorded; before that nothing follows it anywhere).
        for member in self.members:
            if member is not owner:
                member.observe_body(body, deleted=True)

    def followed(self) -> list[Tracked]:
        return [item for member in self.members for item in member.followed()]

    def phase_counts(self) -> Mapping[str, int]:
        total: Counter[str] = Counter()
        for member in self.members:
            total.update(member.phase_counts())
        return dict(total)
