"""A retry waits for its due time (status.nextAttemptAt, the retry policy's backoff)."""

from __future__ import annotations

from slurmjob_operator.controller.gates import Go, Outcome, Pending, Wait
from slurmjob_operator.core.reconcile import Step
from slurmjob_operator.times import parse_rfc3339, utc_now


class RetryDueGate:
    async def check(self, pending: Pending) -> Outcome:
        if pending.step is not Step.RETRY:
            return Go()
        due_at = pending.view.status.next_attempt_at
        due = parse_rfc3339(due_at)
        wait = (due - utc_now()).total_seconds() if due else 0.0
        if wait > 0:
            return Wait(None, f"retry due at {due_at}", wait)
        return Go()
