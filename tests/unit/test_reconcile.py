"""The decision core: next steps and status transitions, table- and property-tested."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus, get_condition
from slurmjob_operator.core.following import lost, observed
from slurmjob_operator.core.reconcile import (
    READY,
    SUBMITTED,
    SUCCEEDED,
    Step,
    confirmed,
    invalid_spec,
    next_step,
    not_submitted,
    record_attempt,
    rejected,
    submitted,
    unconfirmed,
    waiting,
)
from slurmjob_operator.core.states import Observation
from slurmjob_operator.core.transition import changed

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def obs(phase: Phase, *, final: bool = False, **kw: object) -> Observation:
    fields: dict[str, object] = {
        "phase": phase,
        "reason": phase.value,
        "message": f"job is {phase.value}",
        "native_state": phase.value.upper(),
        "native_flags": [],
        "final": final,
    }
    fields.update(kw)
    return Observation.model_validate(fields)


def recorded(number: int = 1) -> SlurmJobStatus:
    return record_attempt(
        SlurmJobStatus(),
        number=number,
        job_name=f"sj-ns-name-abcdef12-a{number}",
        staging_dir="/stage/a",
        generation=1,
        now=T0,
    ).status


def running_status() -> SlurmJobStatus:
    status = submitted(recorded(), 42, 1, T0).status
    return confirmed(status, "sABCDEFGHJKMNP")


@pytest.mark.parametrize(
    ("status", "step"),
    [
        (SlurmJobStatus(), Step.SUBMIT),
        (SlurmJobStatus(phase=Phase.FAILED), Step.SUBMIT),  # refused spec: checked again
        (recorded(), Step.ADOPT),
        (submitted(recorded(), 7, 1, T0).status, Step.CONFIRM),
        (running_status(), Step.TRACK),
        (observed(running_status(), obs(Phase.SUCCEEDED, final=True), 1, T0).status, Step.DONE),
        (rejected(recorded(), "bad partition", 1, T0).status, Step.DONE),
    ],
)
def test_next_step(status: SlurmJobStatus, step: Step) -> None:
    assert next_step(status) is step


def test_attempt_is_recorded_before_the_post() -> None:
    status = recorded()
    assert status.phase is Phase.SUBMITTING
    [attempt] = status.attempts
    assert attempt.job_id is None
    assert attempt.job_name == "sj-ns-name-abcdef12-a1"
    assert attempt.submitted_at == "2026-11-29T12:00:00Z"
    cond = get_condition(status.conditions, SUBMITTED)
    assert cond is not None
    assert cond.status == "Unknown"


def test_submitted_then_confirmed_records_job_id_and_sluid() -> None:
    t = submitted(recorded(), 42, 3, T0)
    assert t.status.phase is Phase.QUEUED
    assert t.status.slurm_job_id == 42
    assert t.status.observed_generation == 3
    assert [e.reason for e in t.events] == ["Submitted"]
    status = confirmed(t.status, "sABCDEFGHJKMNP")
    attempt = status.current_attempt
    assert attempt is not None
    assert attempt.confirmed
    assert attempt.sluid == "sABCDEFGHJKMNP"


def test_adoption_is_confirmed_and_says_so() -> None:
    t = submitted(recorded(), 42, 1, T0, sluid="s0000000000001", adopted=True)
    attempt = t.status.current_attempt
    assert attempt is not None
    assert attempt.confirmed
    assert [e.reason for e in t.events] == ["Adopted"]


def test_not_submitted_forgets_the_attempt_so_its_number_is_reused() -> None:
    t = not_submitted(recorded(), "SlurmUnavailable", "connection refused", 1, T0)
    assert t.status.attempts == []
    assert t.status.phase is Phase.PENDING
    assert next_step(t.status) is Step.SUBMIT


def test_unconfirmed_keeps_the_attempt_and_blocks_resubmission() -> None:
    t = unconfirmed(recorded(), "read timeout", 1, T0)
    assert len(t.status.attempts) == 1
    assert next_step(t.status) is Step.ADOPT
    assert t.events[0].reason == "SubmissionUnconfirmed"
    again = unconfirmed(t.status, "read timeout", 1, T0 + timedelta(seconds=5))
    assert again.events == ()  # the same news is not posted twice


def test_invalid_spec_is_final_and_not_repeated() -> None:
    t = invalid_spec(SlurmJobStatus(), ["spec.pools[0].gpuSeries: unknown"], 2, T0, "InvalidSpec")
    assert t.status.phase is Phase.FAILED
    ready = get_condition(t.status.conditions, READY)
    assert ready is not None
    assert ready.status == "False"
    assert ready.reason == "InvalidSpec"
    assert "spec.pools[0].gpuSeries" in ready.message
    assert len(t.events) == 1
    again = invalid_spec(t.status, ["spec.pools[0].gpuSeries: unknown"], 2, T0, "InvalidSpec")
    assert again.events == ()
    assert not changed(t.status, again.status)


def test_rejected_is_failed_with_slurms_words() -> None:
    t = rejected(recorded(), "Invalid partition name specified", 1, T0)
    assert t.status.phase is Phase.FAILED
    assert "Invalid partition name specified" in (t.status.message or "")
    assert t.status.completion_time == "2026-11-29T12:00:00Z"


def test_waiting_is_pending_not_ready() -> None:
    t = waiting(SlurmJobStatus(), "SecretNotFound", "Secret ns/hf does not exist", 1, T0)
    assert t.status.phase is Phase.PENDING
    ready = get_condition(t.status.conditions, READY)
    assert ready is not None
    assert ready.status == "False"


@pytest.mark.parametrize(
    ("phase", "final", "ready", "succeeded"),
    [
        (Phase.QUEUED, False, "True", None),
        (Phase.RUNNING, False, "True", None),
        (Phase.SUCCEEDED, True, "True", "True"),
        (Phase.FAILED, True, "False", "False"),
        (Phase.CANCELLED, True, "False", "False"),
        (Phase.UNKNOWN, False, "False", None),
    ],
)
def test_observed_conditions(phase: Phase, final: bool, ready: str, succeeded: str | None) -> None:
    t = observed(running_status(), obs(phase, final=final), 1, T0)
    assert t.status.phase is phase
    cond = get_condition(t.status.conditions, READY)
    assert cond is not None
    assert cond.status == ready
    done = get_condition(t.status.conditions, SUCCEEDED)
    assert (done.status if done else None) == succeeded
    if phase is not Phase.QUEUED:
        assert [e.reason for e in t.events] == [phase.value]


def test_observed_keeps_times_exit_code_and_nodes() -> None:
    start, end = T0 + timedelta(seconds=3), T0 + timedelta(seconds=9)
    running = observed(
        running_status(), obs(Phase.RUNNING, started_at=start, nodes="n1,n2"), 1, T0
    ).status
    assert running.start_time == "2026-11-29T12:00:03Z"
    assert running.completion_time is None
    done = observed(
        running,
        obs(Phase.FAILED, final=True, exit_code=3, finished_at=end, started_at=start),
        1,
        T0,
    ).status
    attempt = done.current_attempt
    assert attempt is not None
    assert attempt.exit_code == 3
    assert done.completion_time == "2026-11-29T12:00:09Z"
    assert done.nodes == "n1,n2"


def test_completing_is_not_final() -> None:
    t = observed(
        running_status(),
        obs(Phase.RUNNING, reason="Completing", native_flags=["COMPLETING"], final=False),
        1,
        T0,
    )
    assert not t.status.phase.is_terminal  # type: ignore[union-attr]
    assert get_condition(t.status.conditions, SUCCEEDED) is None


def test_lost_job_is_unknown_not_resubmitted() -> None:
    t = lost(running_status(), "gone", 1, T0)
    assert t.status.phase is Phase.UNKNOWN
    assert next_step(t.status) is Step.TRACK


def test_same_observation_twice_changes_nothing() -> None:
    once = observed(running_status(), obs(Phase.RUNNING), 1, T0).status
    twice = observed(once, obs(Phase.RUNNING), 1, T0 + timedelta(minutes=1))
    assert not changed(once, twice.status)
    assert twice.events == ()


PHASES = st.sampled_from(
    [Phase.QUEUED, Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.UNKNOWN]
)


@given(st.lists(PHASES, min_size=1, max_size=8))
def test_any_observation_sequence_keeps_status_consistent(phases: list[Phase]) -> None:
    status = running_status()
    for i, phase in enumerate(phases):
        final = phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)
        status = observed(status, obs(phase, final=final), 1, T0 + timedelta(seconds=i)).status
        assert status.phase is phase
        assert len(status.attempts) == 1
        types = [c.type for c in status.conditions]
        assert len(types) == len(set(types))  # conditions stay keyed by type
        assert (status.completion_time is not None) == final
        SlurmJobStatus.parse(status.dump())  # what we write reads back


def test_attempt_model_round_trip() -> None:
    status = running_status()
    assert SlurmJobStatus.parse(status.dump()) == status
    assert isinstance(status.attempts[0], Attempt)


def test_declared_lost_unblocks_a_new_attempt() -> None:
    from slurmjob_operator.core.reconcile import declared_lost

    t = declared_lost(unconfirmed(recorded(), "reset", 1, T0).status, 1, T0)
    attempt = t.status.current_attempt
    assert attempt is not None
    assert attempt.declared_lost
    assert attempt.job_id is None
    assert next_step(t.status) is Step.SUBMIT
    assert [e.reason for e in t.events] == ["DeclaredLost"]
    second = record_attempt(
        t.status, number=2, job_name="a2", staging_dir="/s/2", generation=1, now=T0
    ).status
    assert [a.number for a in second.attempts] == [1, 2]
    assert second.attempts[1].retry_of is None  # attempt 1 never ran


def test_declared_lost_ignores_a_confirmed_attempt() -> None:
    from slurmjob_operator.core.reconcile import declared_lost

    status = running_status()
    assert declared_lost(status, 1, T0).status == status


def test_suspension_and_reachability_post_only_on_flips() -> None:
    from slurmjob_operator.core.following import reachability, suspension
    from slurmjob_operator.core.reconcile import SLURM_REACHABLE, SUSPENDED

    t = suspension(SlurmJobStatus(), True, "Suspended", "spec.suspend is true", 1, T0)
    assert t.status.phase is Phase.PENDING
    cond = get_condition(t.status.conditions, SUSPENDED)
    assert cond is not None
    assert cond.status == "True"
    assert len(t.events) == 1
    assert suspension(t.status, True, "Suspended", "again", 1, T0).events == ()
    down = reachability(running_status(), False, "SlurmAuthFailed", "HTTP 511", 1, T0)
    assert [e.type for e in down.events] == ["Warning"]
    assert reachability(down.status, False, "SlurmAuthFailed", "HTTP 511", 1, T0).events == ()
    up = reachability(down.status, True, "SlurmAnswering", "ok", 1, T0)
    cond = get_condition(up.status.conditions, SLURM_REACHABLE)
    assert cond is not None
    assert cond.status == "True"
    assert [e.type for e in up.events] == ["Normal"]


def test_a_retry_whose_submit_failed_stays_scheduled() -> None:
    from slurmjob_operator.api.retry import RetrySpec
    from slurmjob_operator.core.following import retry_scheduled
    from slurmjob_operator.core.retries import decide

    node_fail = obs(Phase.FAILED, final=True, native_state="NODE_FAIL")
    first = observed(running_status(), node_fail, 1, T0).status
    decision = decide(RetrySpec(limit=2, backoff_seconds=0), node_fail, "", [])
    scheduled = retry_scheduled(first, decision, 1, T0).status
    second = record_attempt(
        scheduled, number=2, job_name="a2", staging_dir="/s/2", generation=1, now=T0
    ).status
    assert next_step(second) is Step.ADOPT
    failed_post = not_submitted(second, "SubmitFailed", "connection refused", 1, T0).status
    assert [a.number for a in failed_post.attempts] == [1]
    assert next_step(failed_post) is Step.RETRY  # not Track on the old, failed attempt
