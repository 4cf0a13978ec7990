"""One "final" predicate for every part (dependencies, Kueue's Finished mark, deletion, the
`Finished` condition), and the `Finished` condition kept in step with it on every write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.retry import RetryAction
from slurmjob_operator.api.scheduling import DependencyCondition
from slurmjob_operator.api.status import Phase, SlurmJobStatus, get_condition
from slurmjob_operator.core import following, reconcile
from slurmjob_operator.core.dependencies import Dependency, Kind, resolve, upstream_of
from slurmjob_operator.core.finality import is_final, with_finished
from slurmjob_operator.core.jobview import BaseState, JobExit, SlurmJobView
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.retries import RetryDecision
from slurmjob_operator.core.states import observe
from slurmjob_operator.core.summary import human_duration, with_summary
from slurmjob_operator.core.transition import with_conditions

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
FRESH = SlurmJobStatus()
RECORDED = reconcile.record_attempt(
    FRESH, number=1, job_name="slurmjob-a-x", staging_dir="/s/a", generation=1, now=NOW
).status
QUEUED = reconcile.submitted(RECORDED, 7, 1, NOW).status


def ended(state: str, rc: int | None = None) -> SlurmJobStatus:
    view = SlurmJobView(
        job_id=7, raw_state=(state,), base_state=BaseState(state), exit=JobExit(return_code=rc)
    )
    return following.observed(QUEUED, observe([view]), 1, NOW).status


def refused(reason: Reason, base: SlurmJobStatus = FRESH) -> SlurmJobStatus:
    return reconcile.invalid_spec(base, ["why"], 1, NOW, reason).status


def unknown_not_lost() -> SlurmJobStatus:
    return with_conditions(QUEUED, [], 1, NOW).model_copy(update={"phase": Phase.UNKNOWN})


RETRY = RetryDecision(RetryAction.RETRY, "rules[0]", "again", 5)

#: (what, status, final, Finished as (status, reason) or None for absent)
CASES = [
    ("new", FRESH, False, None),
    ("recorded", RECORDED, False, None),
    ("queued", QUEUED, False, None),
    ("running", ended("RUNNING"), False, None),
    ("succeeded", ended("COMPLETED", 0), True, ("True", "Succeeded")),
    ("failed", ended("FAILED", 1), True, ("True", "Failed")),
    ("cancelled", ended("CANCELLED"), True, ("True", "Cancelled")),
    ("lost", following.lost(QUEUED, "gone", 1, NOW).status, True, ("True", "Unknown")),
    ("unknown, not lost", unknown_not_lost(), False, None),
    ("retry due", following.retry_scheduled(QUEUED, RETRY, 1, NOW).status, False, None),
    *(
        (f"refused {r}", refused(r), False, ("False", str(r)))
        for r in (Reason.INVALID_SPEC, Reason.LIMIT_EXCEEDED, Reason.DEPENDENCY_FAILED)
    ),
    # Decided again on an edit only while nothing was submitted: a retry refused is final.
    ("retry refused", refused(Reason.INVALID_SPEC, QUEUED), True, ("True", "Failed")),
    ("tenant unknown", refused(Reason.TENANT_UNKNOWN), True, ("True", "Failed")),
]


@pytest.mark.parametrize(
    ("status", "final", "finished"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_final_and_the_finished_condition(
    status: SlurmJobStatus, final: bool, finished: tuple[str, str] | None
) -> None:
    assert is_final(status) is final
    written = with_finished(status, 3, NOW)
    cond = get_condition(written.conditions, "Finished")
    assert (None if cond is None else (cond.status, cond.reason)) == finished
    if cond is not None:
        assert cond.observed_generation == 3
    # Nothing else changes, and writing it again changes nothing.
    assert written.model_copy(update={"conditions": status.conditions}) == status
    assert with_finished(written, 3, NOW + timedelta(hours=1)) == written


def test_a_job_final_then_not_says_so_and_keeps_no_stale_true() -> None:
    final = with_finished(following.lost(QUEUED, "gone", 1, NOW).status, 1, NOW)
    again = following.retry_scheduled(final, RETRY, 1, NOW).status
    cond = get_condition(with_finished(again, 1, NOW).conditions, "Finished")
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", Reason.NOT_FINISHED)


def test_the_transition_time_moves_only_when_finished_flips() -> None:
    first = with_finished(ended("COMPLETED", 0), 1, NOW)
    later = with_finished(
        first.model_copy(update={"message": "another message"}), 1, NOW + timedelta(hours=1)
    )
    a, b = (get_condition(s.conditions, "Finished") for s in (first, later))
    assert a is not None
    assert b is not None
    assert b.message == "another message"
    assert a.last_transition_time == b.last_transition_time


@given(st.sampled_from(CASES), st.sampled_from(list(DependencyCondition)))
def test_a_dependency_is_decided_only_on_a_final_upstream(
    case: tuple[str, SlurmJobStatus, bool, object], condition: DependencyCondition
) -> None:
    """Dependencies ask the same predicate: a refusal an edit may fix, or an Unknown that may
    still be resolved, keeps the dependent waiting; `Finished` is met by any final end, a lost
    job's included."""
    _, status, final, _ = case
    up = upstream_of("pre", "u-pre", status, (), same_cluster=True)
    assert up.final is final
    got = resolve([Dependency(name="pre", condition=condition)], {"pre": up})
    if not final:
        assert got.kind in (Kind.WAIT, Kind.READY)
        assert got.kind is Kind.WAIT or up.job_id is not None
    elif condition is DependencyCondition.FINISHED:
        assert got.kind is Kind.READY
    else:
        assert got.kind in (Kind.READY, Kind.FAIL)


# -- the columns' fields (core.summary) -------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (192, "3m12s"), (3600, "1h"), (7507, "2h5m7s"), (273600, "3d4h")],
)
def test_durations_read_as_kubectl_writes_them(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_every_write_carries_the_attempt_cluster_and_once_ended_the_duration() -> None:
    running = ended("RUNNING").model_copy(update={"start_time": "2026-12-05T12:00:00Z"})
    summary = with_summary(running, 1, NOW)
    assert (summary.attempt, summary.cluster, summary.duration) == (1, None, None)
    done = running.model_copy(
        update={"phase": Phase.SUCCEEDED, "completion_time": "2026-12-05T14:05:07Z"}
    )
    summary = with_summary(done, 1, NOW)
    assert (summary.attempt, summary.duration) == (1, "2h5m7s")
    assert get_condition(summary.conditions, "Finished") is not None
    second = reconcile.record_attempt(
        following.retry_scheduled(QUEUED, RETRY, 1, NOW).status,
        number=2,
        job_name="slurmjob-a-x",
        staging_dir="/s/a2",
        generation=1,
        now=NOW,
        cluster="east",
    ).status
    summary = with_summary(second, 1, NOW)
    assert (summary.attempt, summary.cluster, summary.duration) == (2, "east", None)
    assert with_summary(summary, 1, NOW) == summary
    assert with_summary(FRESH, 1, NOW) == FRESH
