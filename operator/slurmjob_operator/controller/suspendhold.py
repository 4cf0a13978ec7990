"""spec.suspend of a submitted job: held in Slurm while it is queued and suspend is true,
released when it is false again (a running job cannot be held: the condition says so). Only the
attempt's job, through a handle its identity check made."""

from __future__ import annotations

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.decisions import Hold, hold_action, hold_transition
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.times import utc_now


class SuspendHold:
    def __init__(self, edge: ResourceEdge, identity: JobIdentity) -> None:
        self.edge = edge
        self.identity = identity

    async def sync(self, view: ResourceView) -> None:
        """Hold a queued job while spec.suspend is true; release it when it is false again."""
        action = hold_action(view.status, view.suspend)
        if action is Hold.NOTHING:
            return
        attempt = view.status.current_attempt
        assert attempt is not None
        assert attempt.job_id is not None
        if action is not Hold.CANNOT_HOLD:
            try:
                # The status's job id is only a claim: hold or release only the attempt's job.
                job = await self.identity.read(view, attempt, "not held")
                if job is None:
                    return
                await self.identity.hold(job, action is Hold.HOLD)
            except SlurmError as exc:
                verb = "hold" if action is Hold.HOLD else "release"
                raise RetryLater(f"cannot {verb}: {exc}", 10) from exc
        await self.edge.apply(
            view, hold_transition(view.status, action, view.generation, utc_now())
        )
