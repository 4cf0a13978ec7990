"""Retry rules: infrastructure failures are retried up to the limit, program failures never."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.retry import RetryAction, RetrySpec
from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus
from slurmjob_operator.core.following import retry_scheduled
from slurmjob_operator.core.reconcile import Step, confirmed, next_step, record_attempt, submitted
from slurmjob_operator.core.retries import MAX_BACKOFF_SECONDS, MAX_IGNORED, decide
from slurmjob_operator.core.states import Observation

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def failed(
    state: str = "FAILED",
    *,
    flags: tuple[str, ...] = (),
    exit_code: int | None = 1,
    reason: str = "NonZeroExitCode",
    slurm_reason: str | None = None,
) -> Observation:
    return Observation(
        phase=Phase.FAILED,
        reason=reason,
        message="failed",
        native_state=state,
        native_flags=list(flags),
        slurm_reason=slurm_reason,
        exit_code=exit_code,
        final=True,
    )


def spent(action: RetryAction, n: int) -> list[Attempt]:
    return [
        Attempt(number=i + 1, job_name=f"a{i}", job_id=i + 1, retry_action=action.value)
        for i in range(n)
    ]


NCCL = (
    "[rank3]: NCCL WARN Call to ibv_poll_cq timed out; Watchdog caught collective operation timeout"
)


@pytest.mark.parametrize(
    ("obs", "logs", "action", "rule"),
    [
        (
            failed("NODE_FAIL", reason="NodeFail", exit_code=None),
            "",
            RetryAction.RETRY,
            "default: node failure",
        ),
        (
            failed("BOOT_FAIL", reason="BootFail", exit_code=None),
            "",
            RetryAction.RETRY,
            "default: node failure",
        ),
        (
            failed(flags=("LAUNCH_FAILED",), reason="LaunchFailed"),
            "",
            RetryAction.RETRY,
            "default: launch failure",
        ),
        (failed(), NCCL, RetryAction.RETRY, "default: NCCL timeout"),
        (
            failed(),
            "RuntimeError: CUDA error: initialization error",
            RetryAction.RETRY,
            "default: CUDA driver initialisation failure",
        ),
        (
            failed(),
            "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            RetryAction.RETRY,
            "default: Xid error",
        ),
        (
            failed(),
            "mlx5_0: Link is down",
            RetryAction.RETRY,
            "default: GPU or InfiniBand link down",
        ),
        (
            failed(),
            "kernel: oom_reaper: reaped process 4242 (python)",
            RetryAction.RETRY,
            "default: OOM-killer node reaping",
        ),
        (failed(), "Traceback ... ValueError: bad config", RetryAction.FAIL, "no rule matched"),
        (failed("OUT_OF_MEMORY", reason="OutOfMemory"), "", RetryAction.FAIL, "no rule matched"),
        (
            failed("TIMEOUT", reason="Timeout", exit_code=None),
            "",
            RetryAction.FAIL,
            "no rule matched",
        ),
    ],
)
def test_default_rules(obs: Observation, logs: str, action: RetryAction, rule: str) -> None:
    decision = decide(RetrySpec(limit=2), obs, logs, [])
    assert decision.action is action
    assert decision.rule == rule


@pytest.mark.timeout(120)  # Python's re took hours on the default rule, forever on (a+)+$
@pytest.mark.parametrize(
    ("logs", "rule"),
    [
        ("ib" * 32_768, "no rule matched"),
        ("ib" * 32_768 + " Link is down", "default: GPU or InfiniBand link down"),
        ("a" * 100_000 + "!", "no rule matched"),
        ("!" + "a" * 100_000, "rules[0]"),
    ],
)
def test_pathological_logs_and_patterns_are_decided(logs: str, rule: str) -> None:
    spec = RetrySpec.model_validate(
        {"limit": 2, "rules": [{"action": "Retry", "onLogPattern": "(a+)+$"}]}
    )
    assert decide(spec, failed(), logs, []).rule == rule


def test_plain_exit_1_fails_at_once_without_spending_the_budget() -> None:
    decision = decide(RetrySpec(limit=5), failed(exit_code=1), "boom", [])
    assert decision.action is RetryAction.FAIL
    assert "not retried" in decision.message


def test_limit_is_spent_by_retries_only() -> None:
    spec = RetrySpec(limit=2, backoff_seconds=10)
    node_fail = failed("NODE_FAIL", exit_code=None)
    assert decide(spec, node_fail, "", spent(RetryAction.RETRY, 1)).action is RetryAction.RETRY
    last = decide(spec, node_fail, "", spent(RetryAction.RETRY, 2))
    assert last.action is RetryAction.FAIL
    assert "limit (2) is spent" in last.message
    # Ignored attempts do not count.
    assert decide(spec, node_fail, "", spent(RetryAction.IGNORE, 5)).action is RetryAction.RETRY


def test_no_retry_with_limit_zero() -> None:
    assert decide(RetrySpec(), failed("NODE_FAIL"), "", []).action is RetryAction.FAIL


def test_user_rules_come_first_and_match_on_every_criterion() -> None:
    spec = RetrySpec.model_validate(
        {
            "limit": 3,
            "rules": [
                {"action": "Fail", "onStates": ["NODE_FAIL"], "onReasons": ["NodeDown"]},
                {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}},
                {
                    "action": "Retry",
                    "onExitCodes": {"operator": "NotIn", "values": [0, 1]},
                    "onLogPattern": "flaky",
                },
            ],
        }
    )
    assert decide(spec, failed("NODE_FAIL", slurm_reason="NodeDown"), "", []).action is (
        RetryAction.FAIL
    )
    # NODE_FAIL without that reason: rule 0 does not match, the default retries it.
    assert decide(spec, failed("NODE_FAIL", slurm_reason="Other"), "", []).rule == (
        "default: node failure"
    )
    assert decide(spec, failed(exit_code=42), "", []).action is RetryAction.IGNORE
    assert decide(spec, failed(exit_code=7), "a flaky test", []).rule == "rules[2]"
    assert decide(spec, failed(exit_code=7), "solid", []).action is RetryAction.FAIL


def test_default_rules_can_be_switched_off() -> None:
    spec = RetrySpec(limit=3, default_rules=False)
    assert decide(spec, failed("NODE_FAIL"), "", []).action is RetryAction.FAIL


def test_ignore_is_bounded() -> None:
    spec = RetrySpec.model_validate(
        {"limit": 0, "rules": [{"action": "Ignore", "onStates": ["FAILED"]}]}
    )
    assert decide(spec, failed(), "", spent(RetryAction.IGNORE, MAX_IGNORED - 1)).retries
    assert not decide(spec, failed(), "", spent(RetryAction.IGNORE, MAX_IGNORED)).retries


@given(st.integers(0, 3600), st.integers(0, 19))
def test_backoff_doubles_and_is_capped(backoff: int, done: int) -> None:
    spec = RetrySpec(limit=20, backoff_seconds=backoff)
    decision = decide(spec, failed("NODE_FAIL"), "", spent(RetryAction.RETRY, done))
    assert decision.delay_seconds == min(backoff * 2**done, MAX_BACKOFF_SECONDS)


def test_only_failed_attempts_are_retried() -> None:
    ok = Observation(
        phase=Phase.CANCELLED,
        reason="Cancelled",
        message="",
        native_state="CANCELLED",
        native_flags=[],
        final=True,
    )
    assert not decide(RetrySpec(limit=3), ok, NCCL, []).retries


def test_invalid_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one of"):
        RetrySpec.model_validate({"rules": [{"action": "Retry"}]})
    with pytest.raises(ValueError, match="regular expression"):
        RetrySpec.model_validate({"rules": [{"action": "Retry", "onLogPattern": "("}]})
    with pytest.raises(ValueError, match="RE2 regular expression"):
        RetrySpec.model_validate({"rules": [{"action": "Retry", "onLogPattern": "(?=a)"}]})


def test_retry_scheduled_then_a_new_attempt() -> None:
    status = record_attempt(
        SlurmJobStatus(), number=1, job_name="a1", staging_dir="/s/1", generation=1, now=T0
    ).status
    status = confirmed(submitted(status, 7, 1, T0).status, None)
    decision = decide(RetrySpec(limit=1, backoff_seconds=30), failed("NODE_FAIL"), "", [])
    t = retry_scheduled(status, decision, 1, T0)
    assert t.status.phase is Phase.PENDING
    assert t.status.next_attempt_at == "2026-11-29T12:00:30Z"
    assert t.status.attempts[0].retry_action == "Retry"
    assert next_step(t.status) is Step.RETRY
    second = record_attempt(
        t.status, number=2, job_name="a2", staging_dir="/s/2", generation=1, now=T0
    ).status
    assert second.next_attempt_at is None
    assert second.attempts[1].retry_of == 1
    assert next_step(second) is Step.ADOPT  # recorded, POST not yet answered
