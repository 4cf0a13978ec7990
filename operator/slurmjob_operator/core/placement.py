"""Which Slurm cluster a SlurmJob belongs to, when the operator serves several.

A resource goes where its attempts went: once an attempt is recorded, its cluster is where
the job is adopted, followed, held and cancelled, whatever the spec or the tenants file say
now. An attempt that names no cluster was written with one cluster: it belongs to the
cluster named as that one was (`SLURMJOB_CLUSTER_NAME`), or to the only one. An attempt whose
cluster is not configured (any more) belongs to none: it is left alone, never followed or
cancelled on another cluster. Before any attempt, `spec.cluster` decides, then the tenant's
default, then the first cluster. A name that is no cluster's goes to the first, whose
submission refuses it (`refusal`) with the known names: the user learns what to write, and
nothing is sent anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Clusters:
    """The names of the clusters, the default (first) one first; `legacy`: the cluster of an
    attempt that names none (a release with one cluster wrote it), None when that cannot be
    told (several clusters, none named as the operator's one cluster was)."""

    names: tuple[str, ...]
    legacy: str | None = None

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("at least one cluster")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"cluster names must be unique: {', '.join(self.names)}")

    @property
    def default(self) -> str:
        return self.names[0]

    @property
    def unnamed(self) -> str | None:
        """Where an attempt that names no cluster belongs."""
        if self.legacy in self.names:
            return self.legacy
        return self.names[0] if len(self.names) == 1 else None

    def place(
        self,
        spec_cluster: str | None,
        attempt_clusters: Sequence[str | None],
        tenant_default: str | None = None,
    ) -> str | None:
        """The cluster that owns the resource; `attempt_clusters`: the cluster of each
        recorded attempt, oldest first. None: its attempt's cluster is none of these (removed
        or renamed, or an unnamed one that cannot be told): no cluster's part may follow,
        cancel or resubmit it, since another cluster's lookups would call its job lost."""
        if attempt_clusters:
            last = attempt_clusters[-1]
            if last is None:
                return self.unnamed
            return last if last in self.names else None
        return self.choose(spec_cluster, tenant_default)

    def choose(self, spec_cluster: str | None, tenant_default: str | None = None) -> str:
        """Where a resource with no attempt yet goes."""
        for wanted in (spec_cluster, tenant_default):
            if wanted is not None:
                return wanted if wanted in self.names else self.default
        return self.default

    def refusal(self, spec_cluster: str | None, own: str) -> str | None:
        """The message refusing `spec.cluster` on cluster `own`, or None when it may run
        there."""
        if spec_cluster is None or spec_cluster == own:
            return None
        return (
            f"spec.cluster: {spec_cluster!r} is not a cluster of this operator "
            f"(known: {', '.join(self.names)})"
        )
