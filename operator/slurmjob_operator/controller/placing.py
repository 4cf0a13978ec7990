"""Which cluster's part a SlurmJob belongs to: `core.claims.placed` on the resource's spec
and its tenant's entry, with what its attempt claims told apart."""

from __future__ import annotations

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.core.claims import Placement, placed
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.site.tenants import Tenants


def placement(clusters: Clusters, tenants: Tenants | None, view: ResourceView) -> Placement:
    tenant = tenants.get(view.ref.namespace) if tenants is not None else None
    return placed(
        clusters,
        view.status,
        view.spec_cluster,
        tenant.default_cluster if tenant is not None else None,
        tenant.clusters if tenant is not None else None,
    )
