"""Which Slurm cluster a SlurmJob belongs to, when the operator serves several.

A resource goes where its attempts went: once an attempt is recorded, its cluster is where
the job is adopted, followed, held and cancelled, whatever the spec or the tenants file say
now (an attempt recorded by a one-cluster release names no cluster: it is the first's, the
cluster that release had). Before any attempt, `spec.cluster` decides, then the tenant's
default, then the first cluster. A name that is no cluster's goes to the first, whose
submission refuses it (`refusal`) with the known names: the user learns what to write, and
nothing is sent anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Clusters:
    """The names of the clusters, the default (first) one first."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("at least one cluster")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"cluster names must be unique: {', '.join(self.names)}")

    @property
    def default(self) -> str:
        return self.names[0]

    def place(
        self,
        spec_cluster: str | None,
        attempt_clusters: Sequence[str | None],
        tenant_default: str | None = None,
    ) -> str:
        """The cluster that owns the resource; `attempt_clusters`: the cluster of each
        recorded attempt, oldest first."""
        if attempt_clusters:
            last = attempt_clusters[-1]
            # An attempt of a cluster no longer configured stays with the default, whose
            # lookups will not find it: it is reported, never resubmitted elsewhere.
            return last if last in self.names else self.default
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
