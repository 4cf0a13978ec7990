"""The controller against an in-memory store and Slurm: every lifecycle path, in milliseconds.

Each test drives the same `Controller` the operator runs (`reconcile`, `refresh`,
`report_reachability`, `finalize`, `observe_body`) and reads the status and Events it wrote.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator import FINALIZER
from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.controller import Controller, Tracked
from slurmjob_operator.controller.poller import Poller
from slurmjob_operator.core.decisions import tails_outlive_deletion
from slurmjob_operator.core.naming import SCRIPT_FILE
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import DECLARE_LOST_ANNOTATION
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.errors import SlurmAuthError, SlurmTransient

from .controller_fakes import (
    SIF,
    Bed,
    KeepingStore,
    MemorySlurm,
    StubToken,
    cpu_spec,
    make_bed,
)
from .controller_fakes import reconcile_once as reconcile


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


def condition(bed: Bed, ref: Any, type_: str) -> tuple[str, str] | None:
    cond = get_condition(bed.store.status(ref).conditions, type_)
    return (cond.status, cond.reason) if cond is not None else None


def tracked(bed: Bed, ref: Any) -> Tracked:
    [item] = [t for t in bed.controller.followed() if t.ref == ref]
    return item


async def refresh(bed: Bed, ref: Any) -> None:
    item = tracked(bed, ref)
    try:
        views = await bed.slurm.get_job(bed.slurm.lifecycle_ref(item.job_id, item.sluid))
    except Exception:
        views = None
    await bed.controller.refresh(item, views)


def counter(bed: Bed, name: str, **labels: str) -> float:
    return bed.metrics.sample(name, labels) or 0.0


# -- submit ---------------------------------------------------------------------------------


async def test_a_submit_is_recorded_confirmed_and_followed(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    assert await reconcile(bed, ref) is None
    status = bed.store.status(ref)
    [attempt] = status.attempts
    assert status.phase is Phase.QUEUED
    assert attempt.job_id == 100
    assert attempt.confirmed
    assert attempt.sluid == "s00000100"
    assert condition(bed, ref, "Submitted") == ("True", "Accepted")
    assert bed.store.reasons() == ["Submitted"]
    assert bed.slurm.calls == ["submit", "get_job 100"]
    assert attempt.staging_dir is not None
    assert (Path(attempt.staging_dir) / SCRIPT_FILE).is_file()
    assert tracked(bed, ref).job_id == 100
    assert counter(bed, "slurmjob_operator_submissions_total", result="accepted") == 1
    # Nothing more to do on the submission side: a second run sends nothing.
    assert await reconcile(bed, ref) is None
    assert bed.slurm.calls.count("submit") == 1


# One row per failure class: what the resource shows and what happens next.
SUBMIT_FAILURES = [
    # fault, phase, Ready reason, attempts left, retried later, staging kept
    ("auth", Phase.PENDING, "SlurmAuthFailed", 0, True, False),
    ("down", Phase.PENDING, "SubmitFailed", 0, True, False),
    ("rejected", Phase.FAILED, "SubmitRejected", 1, False, False),
    ("rejected-record", Phase.FAILED, "SubmitRejected", 1, False, False),
    ("lost", Phase.SUBMITTING, "SubmissionUnconfirmed", 1, True, True),
]


@pytest.mark.parametrize(
    ("fault", "phase", "reason", "attempts", "retried", "staged"), SUBMIT_FAILURES
)
async def test_each_submit_failure_becomes_its_transition(
    bed: Bed, fault: str, phase: Phase, reason: str, attempts: int, retried: bool, staged: bool
) -> None:
    bed.slurm.faults = [fault]
    ref = bed.store.create("train", cpu_spec())
    retry = await reconcile(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is phase
    assert condition(bed, ref, "Ready") == ("False", reason)
    assert len(status.attempts) == attempts
    assert (retry is not None) is retried
    staging = bed.settings.storage_root / "team-a"
    assert any(staging.rglob(SCRIPT_FILE)) is staged
    if fault == "rejected-record":
        assert bed.slurm.was_cancelled(100), "the record Slurm made anyway is cancelled"
    assert not bed.controller.followed()


@pytest.mark.parametrize("fault", ["auth", "down"])
async def test_a_submit_that_sent_nothing_is_tried_again_under_the_same_number(
    bed: Bed, fault: str
) -> None:
    bed.slurm.faults = [fault]
    ref = bed.store.create("train", cpu_spec())
    assert await reconcile(bed, ref) is not None
    assert await reconcile(bed, ref) is None
    [attempt] = bed.store.status(ref).attempts
    assert attempt.number == 1
    assert attempt.job_id == 100
    assert bed.store.status(ref).phase is Phase.QUEUED


async def test_a_refused_submit_is_final(bed: Bed) -> None:
    bed.slurm.faults = ["rejected"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    assert await reconcile(bed, ref) is None
    assert bed.slurm.calls == ["submit"]
    assert "Invalid partition" in (bed.store.status(ref).message or "")


async def test_a_final_job_says_finished_and_one_ended_under_the_last_release_gets_it(
    bed: Bed,
) -> None:
    """Finished=True with the phase as its reason on the write that makes the job final; a
    final status written by the previous release (no Finished) gets it on its next reconcile,
    once: a status already in step is not written again."""
    bed.slurm.faults = ["rejected"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    assert condition(bed, ref, "Finished") == ("True", "Failed")
    body = bed.store.body(ref)
    body["status"]["conditions"] = [
        c for c in body["status"]["conditions"] if c["type"] != "Finished"
    ]
    patches = bed.store.patches
    await reconcile(bed, ref)
    assert condition(bed, ref, "Finished") == ("True", "Failed")
    assert bed.store.patches == patches + 1
    await reconcile(bed, ref)
    assert bed.store.patches == patches + 1
    # From the watch's copy (a restart's resume): a final job in step costs no read at all.
    gets = bed.store.gets
    await bed.controller.reconcile(ref, copy.deepcopy(bed.store.body(ref)))
    assert (bed.store.gets, bed.store.patches) == (gets, patches + 1)
    assert bed.slurm.calls == ["submit"]


PREPARE_FAILURES = [
    # what is wrong, phase, Ready reason, retried later
    ("spec", Phase.FAILED, "InvalidSpec", False),
    ("runtime", Phase.FAILED, "RuntimeArtifactInvalid", False),
    ("secret", Phase.PENDING, "SecretNotFound", True),
    ("unreachable", Phase.PENDING, "SlurmUnavailable", True),
    ("credentials", Phase.PENDING, "SlurmAuthFailed", True),
]


@pytest.mark.parametrize(("broken", "phase", "reason", "retried"), PREPARE_FAILURES)
async def test_what_stops_a_submit_before_anything_is_recorded(
    bed: Bed, broken: str, phase: Phase, reason: str, retried: bool
) -> None:
    spec = cpu_spec()
    if broken == "spec":
        spec["framework"]["runtimeId"] = "not-in-the-registry"
    if broken == "runtime":
        (bed.settings.storage_root / "runtimes" / "unit.sif").write_bytes(SIF + b"tampered")
    if broken == "secret":
        spec["env"] = [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
        ]
    if broken == "unreachable":
        bed.slurm.connect_error = SlurmTransient("connection refused")
    if broken == "credentials":
        bed.slurm.connect_error = SlurmAuthError("token refused", status=401)
    ref = bed.store.create("train", spec)
    retry = await reconcile(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is phase
    assert condition(bed, ref, "Ready") == ("False", reason)
    assert status.attempts == []
    assert bed.slurm.calls == []
    assert (retry is not None) is retried
    assert reason in bed.store.reasons()


async def test_a_secret_created_later_lets_the_submit_through(bed: Bed) -> None:
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    ref = bed.store.create("train", cpu_spec(env=env))
    assert await reconcile(bed, ref) is not None
    bed.store.secrets[("team-a", "hf")] = {"token": "s3cret-value"}
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).phase is Phase.QUEUED


# -- adoption -------------------------------------------------------------------------------


async def test_a_lost_answer_is_adopted_by_name_never_resubmitted(bed: Bed) -> None:
    bed.slurm.faults = ["lost"]
    ref = bed.store.create("train", cpu_spec())
    retry = await reconcile(bed, ref)
    assert retry is not None
    assert retry.delay == bed.settings.poll_interval
    assert condition(bed, ref, "Submitted") == ("Unknown", "SubmissionUnconfirmed")
    assert await reconcile(bed, ref) is None
    status = bed.store.status(ref)
    [attempt] = status.attempts
    assert attempt.job_id == 100
    assert attempt.confirmed
    assert condition(bed, ref, "Submitted") == ("True", "Adopted")
    assert bed.slurm.calls.count("submit") == 1
    assert counter(bed, "slurmjob_operator_adoptions_total", how="name") == 1


async def test_of_two_jobs_for_one_attempt_the_oldest_is_kept(bed: Bed) -> None:
    bed.slurm.faults = ["twice"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).attempts[0].job_id == 100
    assert bed.slurm.was_cancelled(101)
    assert bed.slurm.jobs[101].base_state == "CANCELLED"
    assert "DuplicateCancelled" in bed.store.reasons()
    assert counter(bed, "slurmjob_operator_duplicates_total") == 1


async def test_a_job_of_another_resource_with_the_same_name_is_not_adopted(bed: Bed) -> None:
    bed.slurm.faults = ["unsent"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    attempt = bed.store.status(ref).attempts[0]
    foreign = bed.slurm.jobs[999] = bed.slurm.jobs.get(999) or _foreign(attempt.job_name)
    assert foreign.name == attempt.job_name
    assert await reconcile(bed, ref) is not None, "still searching"
    assert bed.store.status(ref).attempts[0].job_id is None


def _foreign(name: str) -> Any:
    from slurmjob_operator.core.jobview import BaseState, SlurmJobView

    comment = "slurmjob.io ns=team-b name=train uid=someone-else attempt=1"
    return SlurmJobView(
        job_id=999, name=name, comment=comment, raw_state=("PENDING",), base_state=BaseState.PENDING
    )


async def test_an_unconfirmed_attempt_waits_until_declared_lost(bed: Bed) -> None:
    bed.slurm.faults = ["unsent"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    for _ in range(3):
        assert await reconcile(bed, ref) is not None
    assert bed.slurm.calls.count("submit") == 1, "never a blind resubmit"
    bed.store.update(ref, annotations={DECLARE_LOST_ANNOTATION: "1"})
    assert await reconcile(bed, ref) is None
    first, second = bed.store.status(ref).attempts
    assert first.declared_lost
    assert first.job_id is None
    assert second.number == 2
    assert second.job_id is not None
    assert "DeclaredLost" in bed.store.reasons()


async def test_an_annotation_naming_another_attempt_changes_nothing(bed: Bed) -> None:
    bed.slurm.faults = ["unsent"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.store.update(ref, annotations={DECLARE_LOST_ANNOTATION: "7"})
    assert await reconcile(bed, ref) is not None
    assert len(bed.store.status(ref).attempts) == 1


async def test_an_attempt_interrupted_before_its_staging_finished_is_started_over(
    bed: Bed,
) -> None:
    bed.slurm.faults = ["unsent"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    staging = bed.store.status(ref).attempts[0].staging_dir
    assert staging is not None
    (Path(staging) / SCRIPT_FILE).unlink()  # the crash came before job.sh was written
    assert await reconcile(bed, ref) is None
    [attempt] = bed.store.status(ref).attempts
    assert attempt.number == 1
    assert attempt.job_id is not None
    assert "SubmitInterrupted" in bed.store.reasons()
    assert bed.slurm.calls.count("submit") == 2


async def test_a_receipt_that_cannot_be_confirmed_now_is_confirmed_later(bed: Bed) -> None:
    # The read that would confirm with the id's write fails, and so does the one after the id
    # was written alone.
    bed.slurm.get_faults = 2
    ref = bed.store.create("train", cpu_spec())
    assert await reconcile(bed, ref) is not None
    attempt = bed.store.status(ref).attempts[0]
    assert attempt.job_id == 100
    assert not attempt.confirmed
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).attempts[0].confirmed
    assert bed.slurm.calls.count("submit") == 1


# -- following --------------------------------------------------------------------------------


async def test_states_are_folded_until_final(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "RUNNING")
    await refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.RUNNING
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    (staging / "stdout.log").write_text("epoch 1\nepoch 2\n")
    bed.slurm.set_state(100, "COMPLETED", 0)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.SUCCEEDED
    assert status.logs is not None
    assert status.logs.stdout is not None
    assert status.logs.stdout.tail == "epoch 1\nepoch 2\n"
    assert not bed.controller.followed(), "a final job is no longer polled"
    assert [r for r in bed.store.reasons() if r in ("Running", "Succeeded")] == [
        "Running",
        "Succeeded",
    ]


async def test_the_status_keeps_a_small_tail_and_the_retry_rules_see_the_whole_read(
    bed: Bed,
) -> None:
    rules = {
        "limit": 1,
        "backoffSeconds": 0,
        "rules": [{"action": "Retry", "onLogPattern": "CUDA error: out of memory"}],
    }
    ref = bed.store.create("train", cpu_spec(retry=rules))
    await reconcile(bed, ref)
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    # The pattern's line is 20 KiB from the end: inside the 64 KiB read, outside the status.
    lines = [f"step {i:06d} " + "." * 88 + "\n" for i in range(1000)]
    lines.insert(800, "CUDA error: out of memory\n")
    (staging / "stdout.log").write_text("".join(lines))
    bed.slurm.set_state(100, "FAILED", 1)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.logs is not None
    assert status.logs.stdout is not None
    kept = status.logs.stdout
    assert 0 < len(kept.tail.encode()) <= bed.settings.status_tail_bytes == 8192
    assert kept.truncated
    assert kept.bytes == len("".join(lines).encode())
    assert kept.tail.endswith("step 000999 " + "." * 88 + "\n")
    assert kept.tail.startswith("step "), "whole lines only"
    assert "CUDA" not in kept.tail
    assert status.attempts[0].retry_action == "Retry"


RETRY = {
    "limit": 2,
    "backoffSeconds": 0,
    "rules": [{"action": "Retry", "onExitCodes": {"operator": "In", "values": [3]}}],
}


async def test_a_failure_the_rules_retry_becomes_a_new_attempt(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec(retry=RETRY))
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "FAILED", 3)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    assert status.next_attempt_at is not None
    assert condition(bed, ref, "Ready") == ("False", "RetryScheduled")
    await reconcile(bed, ref)
    first, second = bed.store.status(ref).attempts
    assert first.retry_action == "Retry"
    assert second.retry_of == 1
    assert second.job_id == 101
    await asyncio.sleep(0)  # the background retry task finds nothing left to do


async def test_a_failure_no_rule_retries_is_final(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec(retry=RETRY))
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "FAILED", 1)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    assert status.next_attempt_at is None
    assert await reconcile(bed, ref) is None
    assert bed.slurm.calls.count("submit") == 1


@pytest.mark.parametrize("accounting", [True, False])
async def test_a_job_the_controller_forgot_is_read_from_accounting_else_lost(
    tmp_path: Path, accounting: bool
) -> None:
    bed = make_bed(tmp_path, MemorySlurm(accounting=accounting))
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "COMPLETED", 0)
    bed.slurm.purge(100)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    if accounting:
        assert status.phase is Phase.SUCCEEDED
    else:
        assert status.phase is Phase.UNKNOWN
        assert condition(bed, ref, "Ready") == ("False", "JobLost")
    assert not bed.controller.followed()
    assert await reconcile(bed, ref) is None
    assert bed.slurm.calls.count("submit") == 1, "a lost job is never resubmitted"


async def test_reachability_is_reported_once_per_change(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    for _ in range(2):
        await bed.controller.report_reachability(
            False, Reason.SLURM_AUTH_FAILED, "slurmrestd refused the credentials"
        )
    assert condition(bed, ref, "SlurmReachable") == ("False", "SlurmAuthFailed")
    assert bed.store.reasons().count("SlurmAuthFailed") == 1
    await bed.controller.report_reachability(True, Reason.SLURM_ANSWERING, "slurmrestd answers")
    assert condition(bed, ref, "SlurmReachable") == ("True", "SlurmAnswering")


async def test_after_a_restart_reachability_visits_only_what_it_changes(bed: Bed) -> None:
    refs = [bed.store.create(f"train-{i}", cpu_spec()) for i in range(30)]
    for ref in refs:
        await reconcile(bed, ref)
    await bed.controller.report_reachability(False, Reason.SLURM_UNAVAILABLE, "slurmrestd failed")
    await bed.controller.report_reachability(True, Reason.SLURM_ANSWERING, "slurmrestd answers")
    assert all(condition(bed, r, "SlurmReachable") == ("True", "SlurmAnswering") for r in refs)
    # A new process: the watch delivers every resource, slurmrestd answers the first sweep.
    again = Controller(
        bed.settings,
        bed.store,
        None,
        Metrics(),
        token=StubToken(),
        link=bed.slurm,  # type: ignore[arg-type]
    )
    for ref in refs:
        again.observe_body(bed.store.body(ref))
    gets = bed.store.gets
    await again.report_reachability(True, Reason.SLURM_ANSWERING, "slurmrestd answers")
    assert bed.store.gets == gets, "nothing to change: no resource read"
    await again.report_reachability(False, Reason.SLURM_UNAVAILABLE, "slurmrestd failed")
    assert bed.store.gets == gets + 30
    assert all(condition(bed, r, "SlurmReachable") == ("False", "SlurmUnavailable") for r in refs)


async def test_jobs_without_the_condition_are_not_read_while_slurmrestd_answers(bed: Bed) -> None:
    first = bed.store.create("first", cpu_spec())
    await reconcile(bed, first)
    await bed.controller.report_reachability(False, Reason.SLURM_UNAVAILABLE, "slurmrestd failed")
    await bed.controller.report_reachability(True, Reason.SLURM_ANSWERING, "slurmrestd answers")
    later = [bed.store.create(f"later-{i}", cpu_spec()) for i in range(20)]
    for ref in later:  # submitted after the report: no SlurmReachable condition
        await reconcile(bed, ref)
    again = Controller(
        bed.settings,
        bed.store,
        None,
        Metrics(),
        token=StubToken(),
        link=bed.slurm,  # type: ignore[arg-type]
    )
    for ref in [first, *later]:
        again.observe_body(bed.store.body(ref))
    gets = bed.store.gets
    await again.report_reachability(True, Reason.SLURM_ANSWERING, "slurmrestd answers")
    assert bed.store.gets == gets
    await again.report_reachability(False, Reason.SLURM_UNAVAILABLE, "slurmrestd failed")
    assert bed.store.gets == gets + 21, "a failure is told to every one"


async def test_a_refresh_racing_a_deletion_is_no_error(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)

    async def deleted_meanwhile(ref: Any, patch: Any, resource_version: Any = None) -> None:
        return None  # what the store answers once the object is gone

    bed.store.patch_status = deleted_meanwhile  # type: ignore[method-assign]
    bed.slurm.set_state(100, "RUNNING")
    await Poller(bed.controller).cycle()
    await bed.controller.report_reachability(False, Reason.SLURM_UNAVAILABLE, "slurmrestd failed")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


# -- the watch's copy of the resource --------------------------------------------------------


async def test_a_create_with_the_watchs_body_reads_nothing(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    body = copy.deepcopy(bed.store.body(ref))
    await bed.controller.reconcile(ref, body)
    assert bed.store.status(ref).attempts[0].job_id == 100
    assert bed.store.gets == 0, "the watch's copy, its writes conditioned on its version"
    other = bed.store.create("other", cpu_spec())
    await reconcile(bed, other)  # no body: both steps read
    assert bed.store.gets == 2


async def test_resuming_a_followed_job_from_the_watchs_body_reads_and_asks_nothing(
    bed: Bed,
) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    body = copy.deepcopy(bed.store.body(ref))
    gets, calls = bed.store.gets, len(bed.slurm.calls)
    bed.controller.registry.forget(ref.uid)  # as after a restart
    await bed.controller.reconcile(ref, body)
    assert (bed.store.gets, len(bed.slurm.calls)) == (gets, calls)
    assert [t.ref.uid for t in bed.controller.followed()] == [ref.uid]


async def test_a_stale_body_never_submits_twice(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    stale = copy.deepcopy(bed.store.body(ref))  # before the first submit
    await reconcile(bed, ref)
    await bed.controller.reconcile(ref, stale)
    assert bed.slurm.calls.count("submit") == 1
    assert len(bed.store.status(ref).attempts) == 1


async def test_a_body_that_asks_for_a_write_is_decided_on_a_fresh_read(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec(suspend=True))
    body = copy.deepcopy(bed.store.body(ref))
    await bed.controller.reconcile(ref, body)
    assert condition(bed, ref, "Suspended") == ("True", "Suspended")
    assert "submit" not in bed.slurm.calls
    assert bed.controller.submit_slots.waiting == 0


# -- spec.suspend -----------------------------------------------------------------------------


async def test_suspend_gates_the_submit_until_lifted(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec(suspend=True))
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).phase is Phase.PENDING
    assert condition(bed, ref, "Suspended") == ("True", "Suspended")
    assert bed.slurm.calls == []
    bed.store.update(ref, suspend=False)
    assert await reconcile(bed, ref) is None
    assert condition(bed, ref, "Suspended") == ("False", "Resumed")
    assert bed.store.status(ref).phase is Phase.QUEUED


@pytest.mark.parametrize(
    ("state", "call", "suspended"),
    [("PENDING", "hold 100", ("True", "Held")), ("RUNNING", None, ("False", "NotHeld"))],
)
async def test_suspend_holds_a_queued_job_only(
    bed: Bed, state: str, call: str | None, suspended: tuple[str, str]
) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, state)
    await refresh(bed, ref)
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    assert condition(bed, ref, "Suspended") == suspended
    assert (call in bed.slurm.calls) if call else not any("hold" in c for c in bed.slurm.calls)


async def test_a_held_job_is_released(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    bed.store.update(ref, suspend=False)
    await reconcile(bed, ref)
    assert condition(bed, ref, "Suspended") == ("False", "Released")
    assert bed.slurm.calls[-1] == "release 100"


async def test_an_invalid_spec_that_asks_for_suspend_is_suspended(bed: Bed) -> None:
    ref = bed.store.create("train", {"suspend": True, "command": []})
    assert await reconcile(bed, ref) is None
    assert condition(bed, ref, "Suspended") == ("True", "Suspended")


# -- deletion ---------------------------------------------------------------------------------


async def test_deleting_cancels_waits_and_removes_the_staging(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    assert await asyncio.to_thread(staging.is_dir)
    await bed.controller.finalize(bed.store.body(ref))
    assert "cancel_many s00000100" in bed.slurm.calls, "by SLUID where the version takes it"
    assert bed.slurm.jobs[100].base_state == "CANCELLED"
    assert "Cancelled" in bed.store.reasons()
    assert not staging.parent.exists()
    assert not bed.controller.followed()


async def test_deleting_many_at_once_cancels_them_in_one_request_and_waits_together(
    bed: Bed,
) -> None:
    refs = [bed.store.create(f"train-{i}", cpu_spec()) for i in range(60)]
    for ref in refs:
        await reconcile(bed, ref)
    before = len(bed.slurm.calls)
    await asyncio.gather(*(bed.controller.finalize(bed.store.body(ref)) for ref in refs))
    calls = bed.slurm.calls[before:]
    assert len([c for c in calls if c.startswith("cancel_many")]) == 1
    assert not [c for c in calls if c.startswith("cancel ")]
    # The jobs looked for by name in a listing shared by the moment's deletions (not one
    # read per SlurmJob), and the waits answered by a few sweeps for all of them.
    assert not [c for c in calls if c.startswith("get_job")]
    assert 1 <= calls.count("list_jobs") <= 3
    assert 1 <= calls.count("jobs_state") <= 3
    assert all(job.base_state == "CANCELLED" for job in bed.slurm.jobs.values())
    assert bed.store.reasons().count("Cancelled") >= 60
    assert not bed.controller.followed()


@pytest.mark.parametrize(
    ("finalizers", "seen"),
    [
        ((), False),
        ((FINALIZER,), False),
        ((FINALIZER, FINALIZER), False),
        ((FINALIZER, "foregroundDeletion"), True),
        (("backup.example.com/keep", FINALIZER), True),
        (("backup.example.com/keep",), True),
        # A tenant writes its own SlurmJob's finalizers: names like ours but not ours count
        # as another's (the old behaviour for that object only); nothing else reads them.
        ((FINALIZER + " ",), True),
        (("../../etc/passwd", "$(reboot)"), True),
    ],
)
def test_the_last_tails_outlive_a_deletion_only_while_another_holds_it(
    finalizers: tuple[str, ...], seen: bool
) -> None:
    assert tails_outlive_deletion(finalizers, FINALIZER) is seen


async def test_deleting_writes_the_last_tails_only_where_they_will_be_read(bed: Bed) -> None:
    """Both jobs are cancelled and both Events posted; the last tails go into the status of
    the SlurmJob another finalizer keeps, not into the one that goes as the operator's
    finalizer does (nobody could read them: no read, no log read, no write)."""
    alone = bed.store.create("alone", cpu_spec())
    kept = bed.store.create("kept", cpu_spec())
    for ref in (alone, kept):
        await reconcile(bed, ref)
        staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
        (staging / "stdout.log").write_text("epoch 1\nlast words\n")
    bed.store.body(alone)["metadata"]["finalizers"] = [FINALIZER]
    bed.store.body(kept)["metadata"]["finalizers"] = [FINALIZER, "backup.example.com/keep"]
    gets, patches = bed.store.gets, bed.store.patches
    await bed.controller.finalize(bed.store.body(alone))
    assert (bed.store.gets, bed.store.patches) == (gets + 1, patches), "one read, no write"
    await bed.controller.finalize(bed.store.body(kept))
    left = bed.store.status(alone).logs
    assert left is None or left.stdout is None, "no tails written into a resource going away"
    logs = bed.store.status(kept).logs
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "epoch 1\nlast words\n"
    assert bed.slurm.was_cancelled(100)
    assert bed.slurm.was_cancelled(101)
    assert bed.store.reasons().count("Cancelled") == 2


async def test_a_tenants_own_finalizer_changes_only_its_own_deletion(bed: Bed) -> None:
    """A hostile namespace adds finalizers to its SlurmJob (its own metadata): its deletion
    writes the last tails into that SlurmJob only; another namespace's SlurmJob is neither
    read nor written, nor its job cancelled. Malformed finalizers (not a list of strings)
    count as none."""
    other = bed.store.create("theirs", cpu_spec(), namespace="team-b")
    mine = bed.store.create("mine", cpu_spec(), namespace="team-evil")
    for ref in (other, mine):
        await reconcile(bed, ref)
    staging = Path(bed.store.status(mine).attempts[0].staging_dir or "")
    (staging / "stdout.log").write_text("mine\n")
    version = bed.store.body(other)["metadata"]["resourceVersion"]
    bed.store.body(mine)["metadata"]["finalizers"] = [FINALIZER, "team-b/theirs", "../../x"]
    await bed.controller.finalize(bed.store.body(mine))
    logs = bed.store.status(mine).logs
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "mine\n"
    assert bed.store.body(other)["metadata"]["resourceVersion"] == version
    assert not bed.slurm.was_cancelled(100), "the other namespace's job (submitted first)"
    assert bed.slurm.was_cancelled(101)
    body = {**bed.store.body(mine), "metadata": {"finalizers": "abc"}}
    assert ResourceView.of(body).finalizers == ()
    body = {**bed.store.body(mine), "metadata": {"finalizers": [FINALIZER, 3, None]}}
    assert ResourceView.of(body).finalizers == (FINALIZER,)


async def test_a_store_that_keeps_deleted_resources_gets_their_last_tails(
    tmp_path: Path,
) -> None:
    """The local runner's files stay after a cancel and their final status is printed: the
    last tails are written there with no other finalizer, and a status write keeps the view's
    finalizers (`with_status`)."""
    bed = make_bed(tmp_path, store=KeepingStore())
    ref = bed.store.create("local", cpu_spec())
    await reconcile(bed, ref)
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    (staging / "stdout.log").write_text("last words\n")
    await bed.controller.finalize(bed.store.body(ref))
    logs = bed.store.status(ref).logs
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "last words\n"
    view = ResourceView.of({**bed.store.body(ref), "metadata": {"finalizers": ["a", "b"]}})
    assert view.with_status(view.status, "7").finalizers == ("a", "b")


async def test_deleting_an_unconfirmed_attempt_cancels_what_carries_its_identity(
    bed: Bed,
) -> None:
    bed.slurm.faults = ["lost"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.jobs[999] = _foreign(bed.store.status(ref).attempts[0].job_name)
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.was_cancelled(100)
    assert not bed.slurm.was_cancelled(999), "another resource's job is left alone"


async def test_deleting_a_final_job_cancels_nothing(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "COMPLETED", 0)
    await refresh(bed, ref)
    await bed.controller.finalize(bed.store.body(ref))
    assert not any(c.startswith("cancel") for c in bed.slurm.calls)


# -- the registry and the handlers --------------------------------------------------------------


async def test_watch_events_keep_the_registry(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    body = bed.store.body(ref)
    bed.controller.observe_body(body, deleted=True)
    assert not bed.controller.followed()
    bed.controller.observe_body(body)
    assert tracked(bed, ref).job_id == 100
    assert bed.controller.phase_counts() == {"Queued": 1}


async def test_forgetting_never_drops_a_lock_that_is_held(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    edge = bed.controller._edge
    lock = edge.lock(ref.uid)
    async with lock:
        edge.forget(ref)
        assert edge.lock(ref.uid) is lock, "a second writer would otherwise get a new lock"
    edge.forget(ref)
    assert edge.lock(ref.uid) is not lock


async def test_a_refresh_of_a_deleted_resource_forgets_it(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    item = tracked(bed, ref)
    del bed.store.objects[(ref.namespace, ref.name)]
    await bed.controller.refresh(item, None)
    assert not bed.controller.followed()


def test_the_watch_handler_runs_on_the_event_loop() -> None:
    from slurmjob_operator.handlers import slurmjob

    assert inspect.iscoroutinefunction(slurmjob.watched)


# -- tenants --------------------------------------------------------------------------------


def tenant_bed(root: Path) -> Bed:
    tenants = root / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  - {name: team-a, namespaces: [team-a], accounts: [team-a, team-a-big],\n"
        "     partitions: [debug], qos: [normal], maxTimeLimit: 1h}\n"
    )
    return make_bed(root, tenants_file=tenants)


def nothing_staged(bed: Bed) -> bool:
    return not any(bed.settings.storage_root.rglob(SCRIPT_FILE))


async def test_a_namespace_of_no_tenant_is_refused_with_nothing_submitted(tmp_path: Path) -> None:
    bed = tenant_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec(), namespace="team-x")
    assert await reconcile(bed, ref) is None  # final: retrying cannot change the answer
    status = bed.store.status(ref)
    assert condition(bed, ref, "Ready") == ("False", "TenantUnknown")
    assert condition(bed, ref, "Submitted") == ("False", "TenantUnknown")
    assert status.phase is Phase.FAILED
    assert status.attempts == []
    assert "namespace 'team-x' belongs to no tenant" in (status.message or "")
    assert bed.store.reasons() == ["TenantUnknown"]
    assert bed.slurm.calls == []
    assert nothing_staged(bed)
    assert not bed.controller.followed()


async def test_a_refused_account_leaves_nothing_submitted(tmp_path: Path) -> None:
    bed = tenant_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec(account="team-b"))
    assert await reconcile(bed, ref) is None
    status = bed.store.status(ref)
    assert condition(bed, ref, "Ready") == ("False", "InvalidSpec")
    assert (status.message or "").startswith("spec.account: 'team-b' is not in tenant team-a's")
    assert status.attempts == []
    assert bed.slurm.calls == []
    assert nothing_staged(bed)


async def test_a_tenants_job_is_submitted_with_its_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed = tenant_bed(tmp_path)
    sent: list[Any] = []
    submit = bed.slurm.submit

    async def capture(req: Any) -> Any:
        sent.append(req)
        return await submit(req)

    monkeypatch.setattr(bed.slurm, "submit", capture)
    ref = bed.store.create("train", cpu_spec(timeLimit=None))
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).phase is Phase.QUEUED
    [req] = sent
    assert (req.account, req.partition, req.qos, req.time_limit_minutes) == (
        "team-a",
        "debug",
        "normal",
        60,
    )


async def test_a_spec_this_release_refuses_still_has_its_secrets_hidden(bed: Bed) -> None:
    """A resource accepted by an earlier release whose spec this release refuses (here a
    reserved env name) is followed to its end, its log tails still redacted."""
    env = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ]
    bed.store.secrets[("team-a", "hf")] = {"token": "s3cret-value-1234"}
    ref = bed.store.create("train", cpu_spec(env=env))
    await reconcile(bed, ref)
    # What an older release accepted: a name this release refuses.
    bed.store.body(ref)["spec"]["env"].append({"name": "LD_PRELOAD", "value": "/x.so"})
    bed.controller._edge.forget(ref)  # a restart: nothing cached
    bed.controller.observe_body(bed.store.body(ref))
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    (staging / "stdout.log").write_text("token=s3cret-value-1234\n")
    bed.slurm.set_state(100, "COMPLETED", 0)
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.SUCCEEDED
    assert status.logs is not None
    assert status.logs.stdout is not None
    assert "s3cret-value-1234" not in status.logs.stdout.tail
    assert "***" in status.logs.stdout.tail


async def test_suspend_never_holds_a_job_that_is_not_the_attempts(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    # Job id 100 now names someone else's job (ids are reused; a status is only a claim).
    bed.slurm.jobs[100] = _foreign("sj-team-b-other-00000000-1").model_copy(update={"job_id": 100})
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    assert not any(c.startswith("hold") for c in bed.slurm.calls)
    assert "JobIdentityMismatch" in bed.store.reasons()


async def test_a_namespace_of_no_tenant_has_no_secret_read(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  - name: team-b\n"
        "    namespaces: [team-b]\n"
        "    accounts: [team-b]\n"
        "    partitions: [debug]\n"
        "    mountSources: [datasets/team-b]\n"
    )
    bed = make_bed(tmp_path, tenants_file=tenants)
    reads: list[tuple[str, str]] = []
    original = bed.store.read_secret_value

    async def spy(namespace: str, name: str, key: str) -> str:
        reads.append((namespace, name))
        return await original(namespace, name, key)

    bed.store.read_secret_value = spy  # type: ignore[method-assign]
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    ref = bed.store.create("train", cpu_spec(env=env))  # in team-a: no tenant lists it
    await reconcile(bed, ref)
    assert condition(bed, ref, "Ready") == ("False", "TenantUnknown")
    assert reads == []
    assert bed.slurm.calls == []


# -- bounded, fair submission -------------------------------------------------------------------


async def test_submits_are_bounded_and_a_lonely_namespace_is_not_starved(tmp_path: Path) -> None:
    """50 SlurmJobs in namespace a and then 1 in namespace b reconcile at once, the POST slowed:
    never more than SLURMJOB_SUBMIT_CONCURRENCY (2) submits at once, and b's is not behind
    a's backlog. Round-robin grants b the 4th slot (two taken at once, one more of a, then
    b); its POST may still end after the ones granted just after it, so at most 2 x 2 POSTs
    end before it (a FIFO: 50)."""
    bed = make_bed(tmp_path, submit_concurrency=2)
    bed.slurm.submit_delay = 0.01
    refs = [bed.store.create(f"many-{i}", cpu_spec(), namespace="a") for i in range(50)]
    lonely = bed.store.create("lonely", cpu_spec(), namespace="b")
    slots = bed.controller.submit_slots
    held: list[int] = []
    waiting: list[float] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            held.append(slots.held)
            waiting.append(counter(bed, "slurmjob_operator_waiting_submissions"))
            await asyncio.sleep(0.001)

    watcher = asyncio.create_task(watch())
    everyone = asyncio.gather(*(reconcile(bed, ref) for ref in [*refs, lonely]))
    results = await asyncio.wait_for(everyone, 10)
    stop.set()
    await watcher
    assert results == [None] * 51
    assert bed.slurm.max_submitting == 2
    assert max(held) == 2
    assert len(bed.slurm.submitted) == 51
    position = next(i for i, name in enumerate(bed.slurm.submitted) if "-lonely-" in name)
    assert position <= 4, bed.slurm.submitted[:6]
    assert max(waiting) >= 40, "the backlog waited for a slot, and the gauge said so"
    assert counter(bed, "slurmjob_operator_waiting_submissions") == 0
    assert slots.waiting == slots.held == 0
    assert all(bed.store.status(ref).phase is Phase.QUEUED for ref in [*refs, lonely])


async def test_nothing_but_a_submit_waits_for_a_slot(tmp_path: Path) -> None:
    """Every slot taken: a suspended resource, a followed one and a deletion still go on."""
    bed = make_bed(tmp_path, submit_concurrency=1)
    followed = bed.store.create("followed", cpu_spec())
    await reconcile(bed, followed)
    suspended = bed.store.create("suspended", cpu_spec(suspend=True))
    queued = bed.store.create("queued", cpu_spec())
    async with bed.controller.submit_slots.slot("elsewhere"):
        await asyncio.wait_for(reconcile(bed, suspended), 1)
        assert condition(bed, suspended, "Suspended") == ("True", "Suspended")
        bed.store.update(followed, suspend=True)
        await asyncio.wait_for(reconcile(bed, followed), 1)
        assert "hold 100" in bed.slurm.calls
        waiter = asyncio.create_task(reconcile(bed, queued))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        assert counter(bed, "slurmjob_operator_waiting_submissions") == 1
        # A queued submit holds no lock: its deletion does not wait behind the queue.
        bed.store.body(queued)["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        await asyncio.wait_for(bed.controller.finalize(bed.store.body(queued)), 1)
    assert await asyncio.wait_for(waiter, 1) is None
    assert bed.slurm.calls.count("submit") == 1, "the deleted resource was not submitted"
    assert bed.store.status(queued).attempts == []


async def test_a_submit_suspended_while_it_waits_is_not_sent(tmp_path: Path) -> None:
    """The step after the wait reads the resource again: spec.suspend set meanwhile wins."""
    bed = make_bed(tmp_path, submit_concurrency=1)
    ref = bed.store.create("train", cpu_spec())
    async with bed.controller.submit_slots.slot("elsewhere"):
        waiter = asyncio.create_task(reconcile(bed, ref))
        await asyncio.sleep(0.05)
        bed.store.update(ref, suspend=True)
    assert await asyncio.wait_for(waiter, 1) is None
    assert "submit" not in bed.slurm.calls
    assert condition(bed, ref, "Suspended") == ("True", "Suspended")


@pytest.mark.parametrize("gives_way", ["declared lost", "interrupted"])
async def test_an_adoption_that_gives_way_submits_holding_a_slot(bed: Bed, gives_way: str) -> None:
    """An unconfirmed attempt declared lost, or never sent (its staging unfinished): the new
    attempt is submitted holding a slot, like any other submit."""
    bed.slurm.faults = ["unsent"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    if gives_way == "declared lost":
        bed.store.update(ref, annotations={DECLARE_LOST_ANNOTATION: "1"})
    else:
        (Path(bed.store.status(ref).attempts[0].staging_dir or "") / SCRIPT_FILE).unlink()
    slots = bed.controller.submit_slots
    seen: list[int] = []
    original = bed.slurm.do_submit

    async def spy(req: Any, user: str | None) -> Any:
        seen.append(slots.held)
        return await original(req, user)

    bed.slurm.do_submit = spy  # type: ignore[method-assign]
    assert await reconcile(bed, ref) is None
    assert seen == [1]
    assert slots.held == 0
    assert bed.store.status(ref).phase is Phase.QUEUED
    attempt = bed.store.status(ref).current_attempt
    assert attempt is not None
    assert attempt.job_id is not None


# -- job arrays ---------------------------------------------------------------------------------

ARRAY_RETRY = {
    "limit": 1,
    "backoffSeconds": 0,
    "rules": [{"action": "Retry", "onExitCodes": {"operator": "In", "values": [3]}}],
}


def array_spec(count: int = 20, parallelism: int = 3, **extra: Any) -> dict[str, Any]:
    return cpu_spec(array={"count": count, "parallelism": parallelism}, **extra)


def run_tasks(bed: Bed, array_id: int, outcome: dict[int, tuple[str, int]]) -> None:
    """Start and end every pending task of the array, `outcome[i]` for those given (else
    COMPLETED 0), as Slurm runs them: a few at a time, the last taking the array's record."""
    while pending := bed.slurm.pending_tasks(array_id):
        batch = pending[:3]
        bed.slurm.start_tasks(array_id, batch)
        for index in batch:
            state, code = outcome.get(index, ("COMPLETED", 0))
            bed.slurm.end_task(array_id, index, state, code)


async def test_an_array_retries_only_its_failed_tasks_and_ends_succeeded(bed: Bed) -> None:
    ref = bed.store.create("sweep", array_spec(retry=ARRAY_RETRY))
    assert await reconcile(bed, ref) is None
    assert bed.slurm.arrays_submitted == ["0-19%3"]
    status = bed.store.status(ref)
    [first] = status.attempts
    assert first.array is not None
    assert first.array.indices == "0-19"
    assert (first.job_id, first.sluid) == (100, None), "an array goes by its numeric id"
    assert status.array is not None
    assert (status.array.total, status.array.pending) == (20, 20)
    staging = Path(first.staging_dir or "")

    # A poll round: three tasks run, each under a job id of its own.
    poller = Poller(bed.controller)
    bed.slurm.start_tasks(100, [0, 1, 2])
    await poller.cycle()
    status = bed.store.status(ref)
    assert status.phase is Phase.RUNNING
    assert status.array is not None
    assert (status.array.running, status.array.pending) == (3, 17)
    # Unchanged: the next round is one sweep and nothing else.
    before = len(bed.slurm.calls)
    await poller.cycle()
    assert bed.slurm.calls[before:] == ["jobs_state"]

    # Tasks 5 and 13 fail; the retry rules see task 5 (its exit code and its log).
    (staging / "stdout-5.log").write_text("task 5 broke\n")
    (staging / "stdout-13.log").write_text("task 13 broke\n")
    for index in (0, 1, 2):
        bed.slurm.end_task(100, index)
    run_tasks(bed, 100, {5: ("FAILED", 3), 13: ("FAILED", 3)})
    await poller.cycle()
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    assert status.next_attempt_at is not None
    assert status.attempts[0].retry_action == "Retry"
    assert status.array is not None
    assert (status.array.succeeded, status.array.failed) == (18, 2)
    assert status.array.failed_indices == "5,13"
    assert status.array.log_index == 5
    assert status.logs is not None
    assert status.logs.stdout is not None
    assert status.logs.stdout.tail == "task 5 broke\n"

    # The retry: exactly the two failed tasks, under their own indices.
    await reconcile(bed, ref)
    assert bed.slurm.arrays_submitted == ["0-19%3", "5,13%3"]
    status = bed.store.status(ref)
    second = status.attempts[1]
    assert second.array is not None
    assert second.array.indices == "5,13"
    assert second.retry_of == 1
    assert status.array is not None
    assert (status.array.succeeded, status.array.pending) == (18, 2)
    array_id = second.job_id
    assert array_id is not None
    run_tasks(bed, array_id, {})
    await poller.cycle()
    status = bed.store.status(ref)
    assert status.phase is Phase.SUCCEEDED
    assert status.array is not None
    counts = status.array
    assert (counts.total, counts.pending, counts.running, counts.succeeded, counts.failed) == (
        20,
        0,
        0,
        20,
        0,
    )
    assert counts.failed_indices == ""
    assert condition(bed, ref, "Succeeded") == ("True", "Completed")
    assert bed.slurm.calls.count("submit") == 2
    await asyncio.sleep(0)


async def test_an_array_without_retries_left_fails_with_its_failed_tasks(bed: Bed) -> None:
    ref = bed.store.create("sweep", array_spec(count=4))
    await reconcile(bed, ref)
    run_tasks(bed, 100, {1: ("FAILED", 2), 3: ("TIMEOUT", 0)})
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    assert status.array is not None
    assert status.array.failed_indices == "1,3"
    assert status.attempts[0].exit_code == 2, "the first failed task's"
    assert status.attempts[0].retry_action == "Fail"
    assert not bed.controller.followed()


async def test_a_task_the_controller_forgot_is_read_from_accounting(bed: Bed) -> None:
    ref = bed.store.create("sweep", array_spec(count=4))
    await reconcile(bed, ref)
    run_tasks(bed, 100, {0: ("FAILED", 3)})
    bed.slurm.purge(bed.slurm.task(100, 0).job_id)  # MinJobAge: gone before it was seen
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    assert status.array is not None
    assert status.array.failed_indices == "0"
    assert status.attempts[0].exit_code == 3
    assert "accounting 100" in bed.slurm.calls


async def test_an_arrays_lost_answer_is_adopted_whole(bed: Bed) -> None:
    bed.slurm.faults = ["lost"]
    ref = bed.store.create("sweep", array_spec(count=6, parallelism=2))
    assert await reconcile(bed, ref) is not None
    bed.slurm.start_tasks(100, [0, 1])  # its tasks started meanwhile: records 101, 102
    assert await reconcile(bed, ref) is None
    status = bed.store.status(ref)
    [attempt] = status.attempts
    assert (attempt.job_id, attempt.confirmed, attempt.sluid) == (100, True, None)
    assert condition(bed, ref, "Submitted") == ("True", "Adopted")
    assert not [c for c in bed.slurm.calls if c.startswith("cancel")], "tasks are no duplicates"
    assert status.phase is Phase.RUNNING
    assert status.array is not None
    assert (status.array.running, status.array.pending) == (2, 4)
    assert bed.slurm.calls.count("submit") == 1


async def test_deleting_an_array_cancels_every_task_and_waits_for_them(bed: Bed) -> None:
    ref = bed.store.create("sweep", array_spec(count=6, parallelism=2))
    await reconcile(bed, ref)
    bed.slurm.start_tasks(100, [0, 1])
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    await bed.controller.finalize(bed.store.body(ref))
    assert "cancel_many 100" in bed.slurm.calls, "by the array's id, which names every task"
    assert all(j.base_state == "CANCELLED" for j in bed.slurm.array_records(100))
    assert len(bed.slurm.array_records(100)) == 3
    assert not staging.parent.exists()


async def test_an_array_with_several_pools_is_refused_with_nothing_sent(bed: Bed) -> None:
    spec = array_spec(count=4)
    spec["pools"] = [
        {"name": "a", "gpusPerNode": 1, "gpuSeries": "h100", "cpus": 1, "memoryGb": 1},
        {"name": "b", "gpusPerNode": 1, "gpuSeries": "h100", "cpus": 1, "memoryGb": 1},
    ]
    ref = bed.store.create("sweep", spec)
    await reconcile(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    assert condition(bed, ref, "Ready") == ("False", "InvalidSpec")
    assert "spec.array" in (status.message or "")
    assert "submit" not in bed.slurm.calls
    assert not status.attempts


async def test_an_array_of_1000_tasks_costs_what_one_job_costs(bed: Bed) -> None:
    plain = bed.store.create("plain", cpu_spec())
    await reconcile(bed, plain)
    ref = bed.store.create("sweep", array_spec(count=1000, parallelism=400))
    await reconcile(bed, ref)
    array_id = bed.store.status(ref).attempts[0].job_id
    assert array_id == 101
    poller = Poller(bed.controller)
    bed.slurm.start_tasks(array_id, range(400))
    await poller.cycle()  # the array moved: one read of its records, its tasks' ids learnt
    before = len(bed.slurm.calls)
    await poller.cycle()
    assert bed.slurm.calls[before:] == ["jobs_state"], "one filtered sweep for both"
    # A task ends: the sweep shows it under its own id, attributed to the array.
    bed.slurm.end_task(array_id, 7)
    before = len(bed.slurm.calls)
    await poller.cycle()
    assert bed.slurm.calls[before:] == ["jobs_state", f"get_job {array_id}"]
    status = bed.store.status(ref)
    assert status.array is not None
    assert (status.array.running, status.array.succeeded, status.array.pending) == (399, 1, 600)
    before = len(bed.slurm.calls)
    await poller.cycle()
    assert bed.slurm.calls[before:] == ["jobs_state"]


async def test_a_queued_array_is_held_and_released_by_its_id(bed: Bed) -> None:
    ref = bed.store.create("sweep", array_spec(count=4))
    await reconcile(bed, ref)
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    assert condition(bed, ref, "Suspended") == ("True", "Held")
    assert "hold 100" in bed.slurm.calls
    bed.store.update(ref, suspend=False)
    await reconcile(bed, ref)
    assert condition(bed, ref, "Suspended") == ("False", "Released")
    assert "release 100" in bed.slurm.calls


async def test_an_array_whose_tasks_started_is_not_held(bed: Bed) -> None:
    ref = bed.store.create("sweep", array_spec(count=4))
    await reconcile(bed, ref)
    bed.slurm.start_tasks(100, [0])
    await refresh(bed, ref)
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    assert condition(bed, ref, "Suspended") == ("False", "NotHeld")
    assert not [c for c in bed.slurm.calls if c.startswith("hold")]


async def test_suspend_holds_every_component_of_a_heterogeneous_job(bed: Bed) -> None:
    """slurmrestd holds only the leader's component when given the leader's id: the other
    components, still eligible, would keep nodes reserved in the backfill plan."""
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    leader = bed.slurm.jobs[100].model_copy(update={"het_job_id": 100, "het_job_offset": 0})
    bed.slurm.jobs[100] = leader
    bed.slurm.jobs[101] = leader.model_copy(update={"job_id": 101, "het_job_offset": 1})
    get_job = bed.slurm.get_job

    async def components(ref_: int | str) -> list[Any]:
        found = await get_job(ref_)
        return [*found, bed.slurm.jobs[101]] if found and found[0].job_id == 100 else found

    bed.slurm.get_job = components  # type: ignore[method-assign]
    bed.store.update(ref, suspend=True)
    await reconcile(bed, ref)
    assert condition(bed, ref, "Suspended") == ("True", "Held")
    assert [c for c in bed.slurm.calls if c.startswith("hold")] == ["hold 101", "hold 100"]
    bed.store.update(ref, suspend=False)
    await reconcile(bed, ref)
    assert [c for c in bed.slurm.calls if c.startswith("release")] == [
        "release 101",
        "release 100",
    ]
