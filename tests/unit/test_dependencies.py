"""spec.dependsOn: the rules (tables and a property) and the controller (a chain, a retried
upstream repointed, an upstream failed for good, cycles, a missing upstream)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.errors import SpecError, parse_spec
from slurmjob_operator.api.spec import Dependency, DependencyCondition
from slurmjob_operator.api.status import AttemptDependency, Phase
from slurmjob_operator.core.dependencies import (
    Action,
    Kind,
    Upstream,
    find_cycle,
    repoint,
    resolve,
    satisfied,
    slurm_dependency,
)

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as _reconcile

S, F, X = DependencyCondition.SUCCEEDED, DependencyCondition.FAILED, DependencyCondition.FINISHED


def up(
    name: str = "pre",
    phase: Phase | None = Phase.RUNNING,
    *,
    final: bool | None = None,
    attempt: int = 1,
    job_id: int | None = 7,
    same_cluster: bool = True,
    uid: str = "u-pre",
) -> Upstream:
    final = phase is not None and phase.is_terminal if final is None else final
    active = phase in (Phase.QUEUED, Phase.RUNNING)
    return Upstream(name, uid, phase, final, attempt, job_id if active else None, same_cluster)


def dep(name: str = "pre", condition: DependencyCondition = S) -> Dependency:
    return Dependency(name=name, condition=condition)


# -- the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "phase", "ok"),
    [
        (S, Phase.SUCCEEDED, True),
        (S, Phase.FAILED, False),
        (S, Phase.CANCELLED, False),
        (F, Phase.FAILED, True),
        (F, Phase.CANCELLED, True),
        (F, Phase.SUCCEEDED, False),
        (X, Phase.SUCCEEDED, True),
        (X, Phase.FAILED, True),
        (X, Phase.CANCELLED, True),
    ],
)
def test_a_final_upstream_satisfies_or_fails_the_condition(
    condition: DependencyCondition, phase: Phase, ok: bool
) -> None:
    assert satisfied(condition, phase) is ok
    resolution = resolve([dep(condition=condition)], {"pre": up(phase=phase)})
    assert resolution.kind is (Kind.READY if ok else Kind.FAIL)
    assert resolution.slurm == ()  # never `afterok` on a job that already ended
    if not ok:
        assert resolution.message == (
            f"SlurmJob pre ended {phase.value} (after its retries); this job needed it "
            f"{condition.value}"
        )


def test_succeeded_on_a_running_upstream_is_given_to_slurm_as_afterok() -> None:
    resolution = resolve([dep(), dep("b")], {"pre": up(), "b": up("b", Phase.QUEUED, job_id=9)})
    assert resolution.kind is Kind.READY
    assert slurm_dependency(resolution.slurm) == "afterok:7,afterok:9"
    assert resolution.slurm[0].attempt == 1


@pytest.mark.parametrize(
    ("upstream", "condition", "why"),
    [
        (None, S, "SlurmJob pre does not exist"),
        (up(phase=Phase.PENDING), S, "SlurmJob pre is Pending"),
        (up(phase=Phase.SUBMITTING), S, "SlurmJob pre is Submitting"),
        (up(phase=Phase.FAILED, final=False), S, "SlurmJob pre is Failed"),  # retry scheduled
        (up(same_cluster=False), S, "SlurmJob pre is Running"),
        # afternotok/afterany would start it as soon as a first attempt failed.
        (up(), F, "SlurmJob pre is Running"),
        (up(), X, "SlurmJob pre is Running"),
    ],
)
def test_what_cannot_be_decided_or_given_to_slurm_waits(
    upstream: Upstream | None, condition: DependencyCondition, why: str
) -> None:
    resolution = resolve([dep(condition=condition)], {"pre": upstream})
    assert resolution.kind is Kind.WAIT
    assert resolution.message == f"waiting for dependencies: {why}"


def test_one_dependency_that_can_never_be_met_fails_the_rest() -> None:
    resolution = resolve([dep("a"), dep("b")], {"a": None, "b": up("b", Phase.FAILED)})
    assert resolution.kind is Kind.FAIL


def _record(attempt: int = 1, job_id: int = 7) -> AttemptDependency:
    return AttemptDependency(
        name="pre", uid="u-pre", attempt=attempt, job_id=job_id, type="afterok"
    )


def test_a_retried_upstream_repoints_the_dependent_to_its_new_job() -> None:
    plan = repoint([_record()], {"pre": up(attempt=2, job_id=12)})
    assert plan.action is Action.UPDATE
    assert slurm_dependency(plan.records) == "afterok:12"
    assert plan.message == "now depends on pre attempt 2 (Slurm job 12)"
    # Retry scheduled, no new job yet: nothing to point at.
    waiting = up(phase=Phase.PENDING, final=False, attempt=1)
    assert repoint([_record()], {"pre": waiting}).action is Action.NOTHING
    # The same attempt still running: Slurm has it right.
    assert repoint([_record()], {"pre": up()}).action is Action.NOTHING


def test_an_upstream_failed_for_good_fails_the_dependent() -> None:
    plan = repoint([_record()], {"pre": up(phase=Phase.FAILED, attempt=3)})
    assert plan.action is Action.FAIL
    assert "SlurmJob pre ended Failed (after its retries)" in plan.message


def test_an_upstream_that_succeeded_in_a_later_attempt_is_dropped_from_slurms_view() -> None:
    plan = repoint([_record()], {"pre": up(phase=Phase.SUCCEEDED, attempt=2)})
    assert plan.action is Action.UPDATE
    assert plan.records == ()
    assert slurm_dependency(plan.records) is None
    # It succeeded in the very attempt Slurm waits on: Slurm starts the dependent itself.
    assert repoint([_record()], {"pre": up(phase=Phase.SUCCEEDED)}).action is Action.NOTHING


def test_an_upstream_gone_or_replaced_changes_nothing() -> None:
    assert repoint([_record()], {"pre": None}).action is Action.NOTHING
    other = up(attempt=5, job_id=99, uid="u-other")
    assert repoint([_record()], {"pre": other}).action is Action.NOTHING


def test_cycles_are_found_and_chains_are_not() -> None:
    assert find_cycle("a", {"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle("a", {"a": ["b", "c"], "b": ["c"], "c": []}) is None
    assert find_cycle("a", {"a": ["b"], "b": ["b"]}) is None  # b's own cycle is b's to refuse


@given(
    phases=st.lists(st.sampled_from(list(Phase)), min_size=1, max_size=5),
    conditions=st.lists(st.sampled_from(list(DependencyCondition)), min_size=5, max_size=5),
)
def test_ready_only_when_every_upstream_is_satisfied_or_handed_to_slurm_as_afterok(
    phases: list[Phase], conditions: list[DependencyCondition]
) -> None:
    deps = [dep(f"u{i}", conditions[i]) for i in range(len(phases))]
    ups = {f"u{i}": up(f"u{i}", phase, job_id=100 + i) for i, phase in enumerate(phases)}
    resolution = resolve(deps, ups)
    handed = {r.name for r in resolution.slurm}
    for d in deps:
        u = ups[d.name]
        if resolution.kind is Kind.READY:
            assert (u.final and satisfied(d.condition, u.phase)) or (
                d.name in handed and d.condition is S and u.job_id is not None
            )
        if resolution.kind is Kind.FAIL:
            assert any(
                ups[x.name].final and not satisfied(x.condition, ups[x.name].phase) for x in deps
            )


def test_dependency_names_are_unique_and_names() -> None:
    with pytest.raises(SpecError, match="dependsOn names must be unique"):
        parse_spec(cpu_spec(dependsOn=[{"name": "a"}, {"name": "a"}]))
    with pytest.raises(SpecError, match="dependsOn"):
        parse_spec(cpu_spec(dependsOn=[{"name": "../other-namespace"}]))
    with pytest.raises(SpecError, match="dependsOn"):
        parse_spec(cpu_spec(dependsOn=[{"name": f"j{i}"} for i in range(17)]))


# -- the controller -------------------------------------------------------------------------


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


async def _fold(bed: Bed, ref: Any) -> None:
    item = next(t for t in bed.controller.followed() if t.ref == ref)
    await bed.controller.refresh(item, await bed.slurm.get_job(item.job_id))


def _notice(bed: Bed, ref: Any) -> None:
    """The watch event of a status change, as kopf delivers it."""
    bed.controller.observe_body(bed.store.body(ref))


async def _settle(bed: Bed) -> None:
    """The dependents the events woke have been reconciled."""
    await asyncio.sleep(0)
    await bed.controller._dependencies.drain()


RETRY_ONCE = {
    "limit": 1,
    "backoffSeconds": 0,
    "rules": [{"action": "Retry", "onExitCodes": {"operator": "In", "values": [3]}}],
}


async def test_a_missing_upstream_waits_then_a_queued_one_is_given_to_slurm(bed: Bed) -> None:
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    retry = await _reconcile(bed, post)
    assert retry is not None
    status = bed.store.status(post)
    assert status.phase is Phase.PENDING
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.reason, ready.message) == (
        "WaitingForDependency",
        "waiting for dependencies: SlurmJob pre does not exist",
    )
    assert bed.slurm.calls == []
    _notice(bed, post)  # the dependent's own event: it is indexed
    pre = bed.store.create("pre", cpu_spec(retry=RETRY_ONCE))
    await _reconcile(bed, pre)  # pre queued as job 100
    _notice(bed, pre)
    await _settle(bed)  # the dependent is woken by pre's event
    [attempt] = bed.store.status(post).attempts
    assert attempt.job_id == 101
    assert bed.slurm.dependency[101] == "afterok:100"
    assert [d.job_id for d in attempt.dependencies or []] == [100]


async def test_a_retried_upstream_repoints_the_pending_dependent(bed: Bed) -> None:
    pre = bed.store.create("pre", cpu_spec(retry=RETRY_ONCE))
    await _reconcile(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await _reconcile(bed, post)
    _notice(bed, post)
    assert bed.slurm.dependency[101] == "afterok:100"
    bed.slurm.set_state(100, "FAILED", 3)  # the rules retry it
    await _fold(bed, pre)
    _notice(bed, pre)
    await _settle(bed)
    assert bed.slurm.dependency[101] == "afterok:100", "no new job to point at yet"
    await _reconcile(bed, pre)  # attempt 2: job 102
    assert bed.store.status(pre).attempts[-1].job_id == 102
    _notice(bed, pre)
    await _settle(bed)
    assert bed.slurm.dependency[101] == "afterok:102"
    assert "dependency 101 afterok:102" in bed.slurm.calls
    [attempt] = bed.store.status(post).attempts
    assert [(d.attempt, d.job_id) for d in attempt.dependencies or []] == [(2, 102)]
    assert "DependencyRepointed" in bed.store.reasons()


async def test_an_upstream_failed_for_good_cancels_the_dependent(bed: Bed) -> None:
    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await _reconcile(bed, post)
    _notice(bed, post)
    bed.slurm.set_state(100, "FAILED", 1)  # no retry rule
    await _fold(bed, pre)
    _notice(bed, pre)
    await _settle(bed)
    status = bed.store.status(post)
    assert status.phase is Phase.FAILED
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == "DependencyFailed"
    assert bed.slurm.was_cancelled(101)
    assert not [t for t in bed.controller.followed() if t.ref == post]


async def test_a_finished_upstream_is_resolved_by_the_operator(bed: Bed) -> None:
    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)
    bed.slurm.set_state(100, "COMPLETED", 0)
    await _fold(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    assert await _reconcile(bed, post) is None
    assert 101 not in bed.slurm.dependency  # no afterok on a job that has ended
    other = bed.store.create("other", cpu_spec(dependsOn=[{"name": "pre", "condition": "Failed"}]))
    await _reconcile(bed, other)
    failed = next(c for c in bed.store.status(other).conditions if c.type == "Failed")
    assert failed.reason == "DependencyFailed"
    assert bed.slurm.calls.count("submit") == 2


async def test_cycles_and_self_dependencies_are_refused(bed: Bed) -> None:
    bed.store.create("a", cpu_spec(dependsOn=[{"name": "b"}]))
    b = bed.store.create("b", cpu_spec(dependsOn=[{"name": "a"}]))
    await _reconcile(bed, b)
    failed = next(c for c in bed.store.status(b).conditions if c.type == "Failed")
    assert (failed.reason, failed.message) == (
        "InvalidSpec",
        "spec.dependsOn: a dependency cycle: b -> a -> b",
    )
    me = bed.store.create("me", cpu_spec(dependsOn=[{"name": "me"}]))
    await _reconcile(bed, me)
    failed = next(c for c in bed.store.status(me).conditions if c.type == "Failed")
    assert failed.message == "spec.dependsOn: me cannot depend on itself"
    assert bed.slurm.calls == []


async def test_an_upstream_of_another_namespace_is_never_read(bed: Bed) -> None:
    bed.store.create("pre", cpu_spec(), namespace="team-b")
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    assert await _reconcile(bed, post) is not None
    ready = next(c for c in bed.store.status(post).conditions if c.type == "Ready")
    assert ready.message == "waiting for dependencies: SlurmJob pre does not exist"


# -- the paths kopf takes: bodies, restarts, lost submits ----------------------------------


async def _queued_behind_pre(bed: Bed, pre_spec: dict[str, Any]) -> tuple[Any, Any]:
    pre = bed.store.create("pre", pre_spec)
    await _reconcile(bed, pre)  # job 100
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await _reconcile(bed, post)  # job 101, afterok:100
    assert bed.slurm.dependency[101] == "afterok:100"
    return pre, post


async def test_a_resume_with_the_body_repoints_what_was_missed(bed: Bed) -> None:
    pre, post = await _queued_behind_pre(bed, cpu_spec(retry=RETRY_ONCE))
    # pre retried while nobody looked at post (no watch event reached it).
    bed.slurm.set_state(100, "FAILED", 3)
    await _fold(bed, pre)
    await _reconcile(bed, pre)  # attempt 2: job 102
    # The resume handler, with the body the watch delivered (the path kopf takes).
    await bed.controller.reconcile(post, bed.store.body(post))
    assert bed.slurm.dependency[101] == "afterok:102"


async def test_a_restarts_list_in_any_order_cancels_a_dependent_left_behind(bed: Bed) -> None:
    pre, post = await _queued_behind_pre(bed, cpu_spec())
    bed.slurm.set_state(100, "FAILED", 1)
    await _fold(bed, pre)  # pre failed for good while post's operator was away
    _notice(bed, pre)  # the first list: pre first, nobody indexed yet
    _notice(bed, post)
    await _settle(bed)
    failed = next(c for c in bed.store.status(post).conditions if c.type == "Failed")
    assert failed.reason == "DependencyFailed"
    assert bed.slurm.was_cancelled(101)


async def test_a_cancel_that_fails_writes_nothing_final_and_is_tried_again(bed: Bed) -> None:
    from slurmjob_operator.slurm.errors import SlurmTransient

    pre, post = await _queued_behind_pre(bed, cpu_spec())
    real = bed.slurm.do_cancel
    failures = [SlurmTransient("slurmctld busy")]

    async def flaky(ref: int | str, user: str | None) -> None:
        if failures:
            raise failures.pop()
        await real(ref, user)

    bed.slurm.do_cancel = flaky  # type: ignore[method-assign]
    bed.slurm.set_state(100, "FAILED", 1)
    await _fold(bed, pre)
    retry = await _reconcile(bed, post)
    assert retry is not None
    assert bed.store.status(post).phase is Phase.QUEUED, "not Failed while still queued"
    await _reconcile(bed, post)
    assert bed.store.status(post).phase is Phase.FAILED
    assert bed.slurm.was_cancelled(101)


async def test_an_attempt_after_a_lost_submit_waits_on_the_upstream_too(bed: Bed) -> None:
    from slurmjob_operator.core.reconcile import DECLARE_LOST_ANNOTATION

    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)  # job 100, queued
    bed.slurm.faults = ["unsent"]
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await _reconcile(bed, post)  # attempt 1: the answer lost, no job made
    bed.store.update(post, annotations={DECLARE_LOST_ANNOTATION: "1"})
    await _reconcile(bed, post)
    first, second = bed.store.status(post).attempts
    assert first.declared_lost
    assert second.job_id is not None
    assert bed.slurm.dependency[second.job_id] == "afterok:100"
    assert [d.job_id for d in second.dependencies or []] == [100]


async def test_a_dependency_failure_stands_until_the_generation_changes(bed: Bed) -> None:
    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)
    bed.slurm.set_state(100, "FAILED", 1)
    await _fold(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await _reconcile(bed, post)
    assert bed.store.status(post).phase is Phase.FAILED
    # pre deleted and made anew: a restart's resume must not bring post back to life.
    del bed.store.objects[("team-a", "pre")]
    bed.store.create("pre", cpu_spec())
    await bed.controller.reconcile(post, bed.store.body(post))
    await _reconcile(bed, post)
    assert bed.store.status(post).phase is Phase.FAILED
    assert bed.slurm.calls.count("submit") == 1
    # A new generation is judged anew: the spec is immutable but for suspend and the TTL.
    bed.store.update(post, ttlSecondsAfterFinished=600)
    assert await _reconcile(bed, post) is not None  # the new pre is not queued yet
    assert bed.store.status(post).phase is Phase.PENDING


async def test_kill_invalid_depend_keeps_the_dependent_in_the_operator(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    bed.slurm.dependency_parameters = frozenset({"kill_invalid_depend"})
    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    assert await _reconcile(bed, post) is not None  # waits: Slurm would kill it on a retry
    assert bed.store.status(post).attempts == []
    bed.slurm.set_state(100, "COMPLETED", 0)
    await _fold(bed, pre)
    await _reconcile(bed, post)
    assert bed.store.status(post).phase is Phase.QUEUED
    assert 101 not in bed.slurm.dependency
