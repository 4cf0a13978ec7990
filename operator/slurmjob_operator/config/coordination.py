"""How the operator coordinates with the rest of the Kubernetes cluster in `Settings`: Kueue's
Workloads, and the Lease its replicas elect a leader on."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class CoordinationSettings(BaseSettings):
    """A part of `Settings`, never read alone: Kueue and leader election."""

    kueue: bool = Field(
        default=False,
        description=(
            "Watch Kueue's Workloads (kueue.x-k8s.io/v1beta2): a SlurmJob labelled "
            "kueue.x-k8s.io/queue-name is then reconciled as soon as Kueue admits or evicts "
            "it. Without it, admission is looked for every poll interval and evictions are not "
            "acted on. The chart sets it with kueue.enabled."
        ),
    )
    leader_election: bool = Field(
        default=True,
        description=(
            "Run only while holding a coordination.k8s.io Lease, so that replicas stand by "
            "(`run --no-leader-election` turns it off for one process)."
        ),
    )
    lease_name: str = Field(
        default="slurmjob-operator",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="Name of the Lease the replicas elect a leader on.",
    )
    lease_namespace: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description=(
            "Namespace of the Lease. Unset: the pod's own namespace in a cluster, `default` "
            "outside one."
        ),
    )
    lease_identity: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="This replica's name in the Lease. Unset: the host name and a random suffix.",
    )
    lease_duration: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a Lease not renewed stays its holder's before a standby may take it.",
    )
    lease_renew_deadline: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds the leader goes on without renewing before it stops; shorter than the "
            "lease duration, so it has stopped before anyone may take over."
        ),
    )
    lease_retry_period: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between two attempts to renew (leader) or take (standby) the Lease.",
    )
