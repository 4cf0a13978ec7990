"""spec.dependsOn before an attempt is submitted: until one has started, every new attempt (a
first, a retry of one that never ran, one after a lost submit) waits on its upstreams as the
first did; submitted with the Slurm dependencies of the upstream jobs still to end (none when
every upstream is settled already), or failed for good when one can never succeed."""

from __future__ import annotations

from slurmjob_operator.controller.dependencies import Dependencies
from slurmjob_operator.controller.gates import Fail, Go, Outcome, Pending, Wait
from slurmjob_operator.controller.limits import LimitsCache
from slurmjob_operator.core.dependencies import Kind
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import invalid_spec, waiting
from slurmjob_operator.times import utc_now


class UpstreamsGate:
    def __init__(
        self, dependencies: Dependencies | None, limits: LimitsCache, interval: float
    ) -> None:
        """`interval`: how soon a dependent that waits looks again, besides being woken by a
        change of an upstream."""
        self.dependencies = dependencies
        self.limits = limits
        self.interval = interval

    async def check(self, pending: Pending) -> Outcome:
        view = pending.view
        spec = view.spec
        if any(a.started_at is not None for a in view.status.attempts):
            return Go()  # its dependencies were met when an attempt started
        if spec is None or not spec.depends_on or self.dependencies is None:
            return Go()
        limits = await self.limits.snapshot()
        allowed = limits is None or not limits.kills_invalid_dependencies
        resolution, spec_wrong = await self.dependencies.resolve(view, spec, slurm_allowed=allowed)
        now = utc_now()
        if resolution.kind is Kind.READY:
            pending.upstream = resolution.slurm
            return Go()
        if resolution.kind is Kind.FAIL:
            reason = Reason.INVALID_SPEC if spec_wrong else Reason.DEPENDENCY_FAILED
            return Fail(
                invalid_spec(view.status, [resolution.message], view.generation, now, reason)
            )
        text = resolution.message
        wait = waiting(view.status, Reason.WAITING_FOR_DEPENDENCY, text, view.generation, now)
        return Wait(wait, text, self.interval)
