"""The decision point after an attempt ends (core/afterattempt): the first rule that answers
decides; with none, the attempt's own ending stands; the retry rules speak of failures only."""

from __future__ import annotations

from datetime import UTC, datetime

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus
from slurmjob_operator.core.afterattempt import RULES, AttemptEnd, after_attempt, retry_rules
from slurmjob_operator.core.states import Observation
from slurmjob_operator.core.transition import Transition

from .controller_fakes import cpu_spec

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def ended(
    phase: Phase, native: str, reason: str, exit_code: int | None, retry: dict[str, object]
) -> AttemptEnd:
    status = SlurmJobStatus(
        phase=phase, attempts=[Attempt(number=1, job_name="a1", job_id=7, confirmed=True)]
    )
    obs = Observation(
        phase=phase,
        reason=reason,
        message=reason,
        native_state=native,
        native_flags=[],
        exit_code=exit_code,
        final=True,
    )
    spec = SlurmJobSpec.model_validate(cpu_spec(retry=retry))
    return AttemptEnd(Transition(status), spec, obs, "", 1, NOW)


def test_a_success_stands_as_it_ended() -> None:
    end = ended(Phase.SUCCEEDED, "COMPLETED", "Completed", 0, {"limit": 3})
    assert retry_rules(end) is None
    assert after_attempt(end) is end.ended


def test_a_failure_the_rules_retry_is_pending_until_due() -> None:
    end = ended(Phase.FAILED, "NODE_FAIL", "NodeFail", None, {"limit": 3, "backoffSeconds": 60})
    written = after_attempt(end)
    assert written.status.phase is Phase.PENDING
    assert written.status.next_attempt_at is not None
    assert written.status.attempts[-1].retry_action == "Retry"


def test_a_failure_the_rules_do_not_retry_says_why_on_the_attempt() -> None:
    end = ended(Phase.FAILED, "FAILED", "NonZeroExitCode", 1, {"limit": 3})
    written = after_attempt(end)
    assert written.status.phase is Phase.FAILED
    assert written.status.attempts[-1].retry_action == "Fail"


def test_the_first_rule_that_answers_wins() -> None:
    end = ended(Phase.FAILED, "NODE_FAIL", "NodeFail", None, {"limit": 3})
    mine = Transition(SlurmJobStatus(message="segment continued"))
    assert after_attempt(end, (lambda e: mine, *RULES)) is mine
    assert after_attempt(end, (lambda e: None, *RULES)) is not mine
    assert after_attempt(end, ()) is end.ended
