"""A refusal settled for this generation (a standing one: a limit, a failed dependency) is final
until the generation changes (an edit of suspend or ttlSecondsAfterFinished, the spec's only
mutable fields): nothing is tried again, and nothing written again."""

from __future__ import annotations

from slurmjob_operator.controller.gates import Fail, Go, Outcome, Pending
from slurmjob_operator.core.decisions import settled_refusal


class SettledRefusalGate:
    async def check(self, pending: Pending) -> Outcome:
        view = pending.view
        return Fail() if settled_refusal(view.status, view.generation) else Go()
