"""The declared table of conditions and reasons (`core/reasons.py`) is exactly what the
transitions write: every transition is driven with every reason its callers give it, and the
(condition, status, reason) triples it writes are compared with the table both ways."""

from __future__ import annotations

from datetime import UTC, datetime

from slurmjob_operator.api.probestatus import AttemptProbe
from slurmjob_operator.api.retry import RetryAction
from slurmjob_operator.api.segmentstatus import AttemptSegment
from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus
from slurmjob_operator.api.walltime import WalltimeSpec
from slurmjob_operator.core import (
    decisions,
    following,
    following_dependencies,
    following_kueue,
    probe,
    reconcile,
    segments,
)
from slurmjob_operator.core.finality import with_finished
from slurmjob_operator.core.jobview import BaseState, JobExit, SlurmJobView
from slurmjob_operator.core.kueue.admission import Admission, Verdict
from slurmjob_operator.core.probe import ProbeRecord
from slurmjob_operator.core.reasons import (
    CONDITION_MEANINGS,
    FROM_KUEUE,
    FROM_PHASE,
    FROM_SLURM,
    REASON_MEANINGS,
    WRITTEN,
    Reason,
)
from slurmjob_operator.core.retries import RetryDecision
from slurmjob_operator.core.states import observe

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
FRESH = SlurmJobStatus()
RECORDED = reconcile.record_attempt(
    FRESH, number=1, job_name="sj-a", staging_dir="/s/attempt-1", generation=1, now=NOW
).status
QUEUED = reconcile.submitted(RECORDED, 7, 1, NOW).status
UNSENT = RECORDED.model_copy(
    update={"attempts": [Attempt(number=1, job_name="sj-a", staging_dir="/s/attempt-1")]}
)


def _view(state: str, rc: int | None = None) -> SlurmJobView:
    return SlurmJobView(
        job_id=7, raw_state=(state,), base_state=BaseState(state), exit=JobExit(return_code=rc)
    )


def _statuses() -> list[tuple[SlurmJobStatus, bool]]:
    """Every transition's result; True where the reason comes from Slurm's state."""
    out: list[tuple[SlurmJobStatus, bool]] = [
        (RECORDED, False),
        (
            reconcile.record_attempt(
                FRESH,
                number=1,
                job_name="sj-a",
                staging_dir="/s/attempt-1",
                generation=1,
                now=NOW,
                image="r.io/a/b:1@sha256:" + "ab" * 32,
            ).status,
            False,
        ),
        (
            # A registry artifact verified once by a job of the cache user (imagecache).
            reconcile.record_attempt(
                FRESH,
                number=1,
                job_name="sj-a",
                staging_dir="/s/attempt-1",
                generation=1,
                now=NOW,
                image="runtime pytorch-sqsh, sha256 ab verified by slurmjob-verify-0-1",
                image_reason=Reason.ARTIFACT_VERIFIED,
            ).status,
            False,
        ),
        (QUEUED, False),
        (reconcile.submitted(RECORDED, 7, 1, NOW, adopted=True).status, False),
        (reconcile.declared_lost(UNSENT, 1, NOW).status, False),
        (reconcile.proven_absent(UNSENT, 70.0, 1, NOW).status, False),
        (following.lost(QUEUED, "gone", 1, NOW).status, False),
        (
            reconcile.not_submitted(RECORDED, Reason.SUBMIT_INTERRUPTED, "again", 1, NOW).status,
            False,
        ),
    ]
    for failure in decisions.Failure:
        base = (
            RECORDED
            if failure in decisions.FAILURES
            and failure.name.startswith(("REJECTED", "AMBIGUOUS", "SEND_"))
            else FRESH
        )
        transition, _ = decisions.failed_step(base, failure, ["why"], 1, NOW)
        out.append((transition.status, False))
    decision = RetryDecision(RetryAction.RETRY, "rules[0]", "again", 5)
    out.append((following.retry_scheduled(QUEUED, decision, 1, NOW).status, False))
    for wanted in (True, False):
        _, gated = decisions.gate(
            following.suspension(FRESH, True, Reason.SUSPENDED, "x", 1, NOW).status, wanted, 1, NOW
        )
        assert gated is not None
        out.append((gated.status, False))
    for action in (decisions.Hold.HOLD, decisions.Hold.RELEASE, decisions.Hold.CANNOT_HOLD):
        out.append((decisions.hold_transition(QUEUED, action, 1, NOW).status, False))
    # What the poller reports (controller/poller.py).
    for reachable, reason in (
        (True, Reason.SLURM_ANSWERING),
        (False, Reason.SLURM_AUTH_FAILED),
        (False, Reason.SLURM_UNAVAILABLE),
    ):
        out.append((following.reachability(QUEUED, reachable, reason, "x", 1, NOW).status, False))
    for state, rc in (("PENDING", None), ("RUNNING", None), ("COMPLETED", 0), ("FAILED", 1)):
        out.append((following.observed(QUEUED, observe([_view(state, rc)]), 1, NOW).status, True))
    # A job whose output could not be opened (controller/following.py).
    target = following.OutputTarget("/s/attempt-1/stdout.log", "u", 1, "/s/attempt-1", None)
    unwritable = following.output_unwritable(observe([_view("FAILED", 1)]), target)
    out.append((following.observed(QUEUED, unwritable, 1, NOW).status, False))
    # spec.dependsOn (controller/gates/upstreams.py).
    out.append((reconcile.waiting(FRESH, Reason.WAITING_FOR_DEPENDENCY, "w", 1, NOW).status, False))
    # Kueue (controller/gates/queue.py).
    out.append((reconcile.waiting(FRESH, Reason.WAITING_FOR_ADMISSION, "k", 1, NOW).status, False))
    out.append(
        (following_kueue.evicted(QUEUED, "Preempted", "by a higher priority", 1, NOW).status, False)
    )
    out.append(
        (reconcile.invalid_spec(FRESH, ["x"], 1, NOW, Reason.DEPENDENCY_FAILED).status, False)
    )
    out.append((following_dependencies.dependency_failed(QUEUED, "x", 1, NOW).status, False))
    # Kueue's own conditions (controller/gates/queue.py, controller/evictions.py): waiting,
    # reserved, admitted, evicted, admitted again.
    status = FRESH
    for found in (
        Verdict(Admission.WAITING, "Inadmissible", "no LocalQueue"),
        Verdict(Admission.WAITING, "Pending", "checks", reserved=True),
        Verdict(Admission.ADMITTED, "Admitted"),
        Verdict(Admission.EVICTED, "Preempted", "by a higher priority"),
        Verdict(Admission.ADMITTED, "Admitted"),
    ):
        status = following_kueue.admission_conditions(status, found, 1, NOW).status
        out.append((status, False))
    # The collective probe (core/probe.py): passed, skipped from the cache, failed everywhere
    # with a node blamed (a new attempt) and without one (Failed).
    planned = AttemptProbe(key="probe-" + "0" * 40, avoid="avoid-" + "0" * 40, ladder=2)
    probing = QUEUED.model_copy(
        update={"attempts": [a.model_copy(update={"probe": planned}) for a in QUEUED.attempts]}
    )
    for record in (ProbeRecord("Passed", 0, 40.0), ProbeRecord("Skipped", 1)):
        out.append((probe.with_probe(probing, record, 1, NOW).status, False))
    for blamed in (("n1",), ()):
        failed = probe.with_probe(probing, ProbeRecord("Failed", blamed=blamed), 1, NOW).status
        out.append((failed, False))
        out.append((probe.after_failed_probe(failed, 2, 1, NOW).status, False))
    # Walltime segments (core/segments.py): the next one due, the total time spent, and two
    # segments in a row without progress.
    chain = WalltimeSpec(total_time="10m", segment_time=3, warning_seconds=60)
    first = QUEUED.model_copy(
        update={
            "attempts": [
                a.model_copy(
                    update={
                        "segment": AttemptSegment(index=0, limit_minutes=3),
                        "started_at": "2026-12-01T11:00:00Z",
                        "finished_at": "2026-12-01T11:03:00Z",
                    }
                )
                for a in QUEUED.attempts
            ]
        }
    )
    out.append((segments.after_segment(first, chain, "Timeout", None, 1, NOW).status, False))
    spent = chain.model_copy(update={"total_time": "2m"})
    out.append((segments.after_segment(first, spent, "Timeout", None, 1, NOW).status, False))
    idle = AttemptSegment(index=1, limit_minutes=3, checkpoint=segments.EMPTY_CHECKPOINT)
    stalled = first.model_copy(
        update={
            "attempts": [
                first.attempts[0].model_copy(
                    update={"segment": idle.model_copy(update={"index": 0, "progress": False})}
                ),
                first.attempts[0].model_copy(update={"number": 2, "segment": idle}),
            ]
        }
    )
    empty = segments.EMPTY_CHECKPOINT
    out.append((segments.after_segment(stalled, chain, "Timeout", empty, 1, NOW).status, False))
    return out


def _written() -> set[tuple[str, str, str]]:
    """What the transitions write, with `Finished` kept in step as every write does
    (`controller.resource.ResourceEdge.apply`), and a final job that becomes not final."""
    found: set[tuple[str, str, str]] = set()
    statuses = [(with_finished(status, 1, NOW), slurm) for status, slurm in _statuses()]
    final = with_finished(following.lost(QUEUED, "gone", 1, NOW).status, 1, NOW)
    decision = RetryDecision(RetryAction.RETRY, "rules[0]", "again", 5)
    again = following.retry_scheduled(final, decision, 1, NOW).status
    statuses.append((with_finished(again, 1, NOW), False))
    for status, from_slurm in statuses:
        for cond in status.conditions:
            reason = cond.reason
            if cond.type == "Finished" and cond.status == "True":
                reason = FROM_PHASE
            if from_slurm and cond.type in ("Running", "Ready", "Succeeded", "Failed"):
                reason = FROM_SLURM
            if cond.type in ("QuotaReserved", "Admitted", "Evicted"):
                reason = FROM_KUEUE
            found.add((str(cond.type), cond.status, str(reason)))
    return found


def test_the_transitions_write_exactly_the_declared_table() -> None:
    written = _written()
    declared = {(str(c), s, str(r)) for c, s, r in WRITTEN}
    assert written - declared == set(), "written but not declared in core/reasons.py"
    assert declared - written == set(), "declared but no transition writes it"


def test_every_reason_and_condition_has_a_meaning() -> None:
    assert set(REASON_MEANINGS) == set(Reason)
    assert {c for c, _, _ in WRITTEN} == set(CONDITION_MEANINGS)
    assert {r for _, _, r in WRITTEN} == {*Reason, FROM_SLURM, FROM_KUEUE, FROM_PHASE}


def test_a_queued_phase_still_counts_as_a_slurm_reason() -> None:
    status = following.observed(QUEUED, observe([_view("PENDING")]), 1, NOW).status
    assert status.phase is Phase.QUEUED


def test_an_unknown_tenant_is_refused_like_an_invalid_spec_under_its_own_reason() -> None:
    transition, plan = decisions.failed_step(
        FRESH, decisions.Failure.TENANT_UNKNOWN, ["metadata.namespace: no tenant"], 1, NOW
    )
    assert plan.reason is Reason.TENANT_UNKNOWN
    assert plan.retry is decisions.Retry.NEVER
    assert not plan.discard_attempt
    written = {(str(c.type), c.status, str(c.reason)) for c in transition.status.conditions}
    assert written == {
        ("Ready", "False", "TenantUnknown"),
        ("Submitted", "False", "TenantUnknown"),
        ("Failed", "True", "TenantUnknown"),
    }
    assert transition.status.phase is Phase.FAILED
    assert transition.status.attempts == []
