"""spec.suspend before anything is submitted: nothing is (the Suspended condition says so, and a
Workload is kept inactive so that it holds no quota); lifting it says so too."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.controller.gates import Fail, Go, Outcome, Pending
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.core.decisions import gate
from slurmjob_operator.times import utc_now


class SuspendGate:
    def __init__(self, edge: ResourceEdge, inactive: Callable[[ResourceView], Awaitable[None]]):
        """`inactive`: what makes the resource's Workload inactive (Kueue's gate)."""
        self.edge = edge
        self.inactive = inactive

    async def check(self, pending: Pending) -> Outcome:
        view = pending.view
        blocked, transition = gate(view.status, view.suspend, view.generation, utc_now())
        if transition is not None:  # its own condition, written whether blocked or not
            pending.view = await self.edge.apply(view, transition)
        if blocked:
            await self.inactive(pending.view)
            return Fail()
        return Go()
