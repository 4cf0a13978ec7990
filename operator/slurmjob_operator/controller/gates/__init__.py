"""What stands between a SlurmJob and its submit: an ordered chain of gates.

Confirming, adopting and proving absence run first, before any gate (an unconfirmed attempt is
adopted even while suspended or not admitted: `controller.submission`). Then, in this order:
spec.suspend (`suspend`), a refusal settled for this generation (`refusal`), the queue a tenant
requires and Kueue's admission (`queue`), the upstreams of spec.dependsOn (`upstreams`), a retry
not due yet (`retry`). The chain runs again on a fresh read once the submit slot is held; what
follows the slot (tenancy, the spec, the cluster, Kueue's placement, the Secret, rendering,
limits, the runtime, the array and CRD checks) is `controller.sender`'s.

Each gate answers `Go` (and may carry what it found on the `Pending` submit: the admission's
placement, the `afterok` records), `Wait` (what to write, why, when to look again) or `Fail`
(what to write; nothing more for now). A gate may write its own conditions and Events first
(Kueue's QuotaReserved and Admitted, the Suspended condition); the chain writes the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import AttemptDependency
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.kueue import Verdict as Admitted
from slurmjob_operator.core.reconcile import Step
from slurmjob_operator.core.transition import Transition


@dataclass
class Pending:
    """A submit on its way through the chain: the resource as last read or written, its step
    (SUBMIT or RETRY), and what gates found for the submit."""

    view: ResourceView
    step: Step
    upstream: tuple[AttemptDependency, ...] = ()
    admitted: Admitted | None = None


@dataclass(frozen=True)
class Go:
    """Nothing stops the submit here."""


@dataclass(frozen=True)
class Wait:
    """Not now: `write` (if any) is written and the resource looked at again after `delay`."""

    write: Transition | None
    why: str
    delay: float


@dataclass(frozen=True)
class Fail:
    """Not submitted, and nothing to wait for: `write` (if any) says why. An edit of the
    SlurmJob (or the gate's own wake) tries again."""

    write: Transition | None = None


Outcome = Go | Wait | Fail


class Gate(Protocol):
    async def check(self, pending: Pending) -> Outcome: ...


class Chain:
    """The gates in their order, on one ResourceEdge."""

    def __init__(self, edge: ResourceEdge, gates: Sequence[Gate]) -> None:
        self.edge = edge
        self.gates = tuple(gates)

    async def run(self, pending: Pending) -> bool:
        """True when every gate says go; otherwise the first that does not has its say
        written, and a wait raises RetryLater."""
        for gate in self.gates:
            outcome = await gate.check(pending)
            if isinstance(outcome, Go):
                continue
            if outcome.write is not None:
                pending.view = await self.edge.apply(pending.view, outcome.write)
            if isinstance(outcome, Wait):
                raise RetryLater(outcome.why, outcome.delay)
            return False
        return True
