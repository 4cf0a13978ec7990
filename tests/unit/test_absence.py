"""An unconfirmed submit proven absent (`core.absence`): the decision table, and the
controller against an in-memory Slurm with a fencing window short enough to pass in a test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.absence import Mode, Next, Verdict, Window, mode, next_check, verdict
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.slurm.errors import SlurmTransient

from .controller_fakes import OPERATOR_USER, Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile

WINDOW = Window(rest_timeout=30, message_timeout=10, margin=30)


@pytest.mark.parametrize(
    ("waited", "accounting", "expected"),
    [
        (0.0, True, Next.WAIT),
        (69.9, True, Next.WAIT),  # the window has not passed
        (70.0, True, Next.PROVE),
        (3600.0, True, Next.PROVE),
        (3600.0, False, Next.MANUAL),  # no accounting: a purged job looks like none
        (3600.0, None, Next.MANUAL),  # not known yet: no proof
    ],
)
def test_when_a_proof_is_tried(waited: float, accounting: bool | None, expected: Next) -> None:
    assert next_check(waited, WINDOW, accounting) is expected


@pytest.mark.parametrize(
    ("before", "found", "after", "expected"),
    [
        (0, False, 0, Verdict.PROVEN),
        (0, True, 0, Verdict.FOUND),  # in the controller or in accounting: adopt it
        (5, True, 0, Verdict.FOUND),
        (3, False, 0, Verdict.LAGGING),  # records still on their way to slurmdbd
        (0, False, 1, Verdict.LAGGING),  # and again just before declaring
        (None, False, 0, Verdict.LAGGING),  # the controller did not say
        (0, False, None, Verdict.LAGGING),
    ],
)
def test_what_the_lookup_proves(
    before: int | None, found: bool, after: int | None, expected: Verdict
) -> None:
    assert verdict(before, found, after) is expected


def test_the_window_and_the_modes() -> None:
    assert WINDOW.seconds == 70
    assert mode(True) is Mode.PROOF
    assert mode(False) is Mode.MANUAL
    assert mode(None) is Mode.MANUAL


# -- the controller -------------------------------------------------------------------------


def short(tmp_path: Path, **extra: Any) -> Bed:
    """A fencing window of 20 ms."""
    return make_bed(
        tmp_path, slurm_rest_timeout=0.01, slurm_message_timeout=0.01, absence_margin=0, **extra
    )


async def unconfirmed(bed: Bed) -> Any:
    bed.slurm.faults = ["unsent"]  # the answer lost, and no job created
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    assert await reconcile(bed, ref) is not None  # found nowhere: the clock starts
    await asyncio.sleep(0.05)
    return ref


async def test_found_nowhere_after_the_window_the_next_attempt_goes_out(tmp_path: Path) -> None:
    bed = short(tmp_path)
    ref = await unconfirmed(bed)
    assert await reconcile(bed, ref) is None
    first, second = bed.store.status(ref).attempts
    assert first.proven_absent_at is not None
    assert not first.declared_lost
    assert first.job_id is None
    assert second.number == 2
    assert second.job_id is not None
    assert "ProvenAbsent" in bed.store.reasons()
    assert bed.metrics.sample("slurmjob_operator_proven_absent_total", {}) == 1
    # The queue to slurmdbd was read before and after the lookup.
    calls = bed.slurm.calls
    assert any(
        calls[i : i + 3][0] == "diag"
        and calls[i + 1].startswith("find_by_name")
        and calls[i + 2] == "diag"
        for i in range(len(calls) - 2)
    ), calls


async def test_before_the_window_nothing_is_declared(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)  # the default window: 70 s
    bed.slurm.faults = ["unsent"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    for _ in range(3):
        assert await reconcile(bed, ref) is not None
    [attempt] = bed.store.status(ref).attempts
    assert attempt.proven_absent_at is None
    assert "diag" not in bed.slurm.calls
    message = bed.store.status(ref).message or ""
    assert "proven absent" in message
    assert "70 s" in message


async def test_found_in_accounting_only_is_adopted_not_declared(tmp_path: Path) -> None:
    bed = short(tmp_path)
    bed.slurm.faults = ["lost"]  # created, the answer lost
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    [job_id] = list(bed.slurm.jobs)
    bed.slurm.set_state(job_id, "COMPLETED", 0)
    bed.slurm.purge(job_id)  # gone from the controller, kept in accounting
    await asyncio.sleep(0.05)
    await reconcile(bed, ref)
    [attempt] = bed.store.status(ref).attempts
    assert attempt.job_id == job_id
    assert attempt.proven_absent_at is None
    assert "ProvenAbsent" not in bed.store.reasons()


@pytest.mark.parametrize(
    "queues",
    [
        [SlurmTransient("slurmctld away")],  # the diag call fails: no proof
        [3],  # slurmctld still sends records to slurmdbd
        [0, 2],  # something arrived in the queue during the lookup
        [None],  # the answer does not say
    ],
)
async def test_accounting_lagging_or_down_declares_nothing(
    tmp_path: Path, queues: list[Any]
) -> None:
    bed = short(tmp_path)
    bed.slurm.dbd_queues = list(queues)
    ref = await unconfirmed(bed)
    assert await reconcile(bed, ref) is not None
    [attempt] = bed.store.status(ref).attempts
    assert attempt.proven_absent_at is None
    # Once slurmctld's queue is empty again the proof goes through.
    bed.slurm.dbd_queues = [0]
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).attempts[0].proven_absent_at is not None


async def test_without_accounting_only_a_person_unblocks(tmp_path: Path) -> None:
    bed = short(tmp_path)
    bed.slurm.accounting = False
    ref = await unconfirmed(bed)
    for _ in range(3):
        assert await reconcile(bed, ref) is not None
        await asyncio.sleep(0.03)
    [attempt] = bed.store.status(ref).attempts
    assert attempt.proven_absent_at is None
    assert "diag" not in bed.slurm.calls
    assert "only a person can declare it lost" in (bed.store.status(ref).message or "")
    assert "slurmjob.io/declare-lost=1" in (bed.store.status(ref).message or "")


async def test_a_late_job_of_an_attempt_proven_absent_is_cancelled(tmp_path: Path) -> None:
    bed = short(tmp_path)
    ref = await unconfirmed(bed)
    assert await reconcile(bed, ref) is None
    first, second = bed.store.status(ref).attempts
    # The held request reaches slurmctld after all: a job of attempt 1.
    late = SlurmJobView(
        job_id=555,
        name=first.job_name,
        comment=f"slurmjob.io ns={ref.namespace} name={ref.name} uid={ref.uid} attempt=1",
        user=OPERATOR_USER,
        raw_state=("RUNNING",),
        base_state=BaseState.RUNNING,
    )
    bed.slurm.jobs[555] = late
    [item] = [t for t in bed.controller.followed() if t.ref == ref]
    assert item.job_id == second.job_id
    views = await bed.slurm.get_job(second.job_id)
    await bed.controller.refresh(item, views)
    assert bed.slurm.jobs[555].base_state is BaseState.CANCELLED
    assert bed.slurm.jobs[second.job_id].base_state is not BaseState.CANCELLED
    assert "LateSubmitCancelled" in bed.store.reasons()
    assert bed.metrics.sample("slurmjob_operator_late_submits_cancelled_total", {}) == 1
    text = next(m for _, r, m in bed.store.events if r == "LateSubmitCancelled")
    assert "fencing window of 0 s" in text
    assert "duplicate of attempt 2" in text
    # A job of another resource under the same name is never touched.
    bed.slurm.jobs[556] = late.model_copy(
        update={"job_id": 556, "comment": late.comment.replace(ref.uid, "someone-else")}
    )
    await bed.controller.refresh(item, views)
    assert bed.slurm.jobs[556].base_state is BaseState.RUNNING


def test_late_jobs_are_looked_for_for_a_while_after_the_proof() -> None:
    from datetime import UTC, datetime, timedelta

    from slurmjob_operator.api.status import Attempt
    from slurmjob_operator.core.absence import late_candidates
    from slurmjob_operator.times import rfc3339

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def proven(number: int, ago: timedelta | None) -> Attempt:
        at = rfc3339(now - ago) if ago is not None else None
        return Attempt(number=number, job_name=f"a{number}", proven_absent_at=at)

    attempts = [
        proven(1, timedelta(hours=2)),  # long ago: 20 windows of 70 s = 23 min
        proven(2, timedelta(minutes=5)),
        proven(3, None),  # never proven absent
        proven(4, timedelta(seconds=1)),  # the current attempt itself is never a candidate
    ]
    assert [a.number for a in late_candidates(attempts, now, WINDOW)] == [2]
    tiny = Window(0.01, 0.01, 0)  # the floor: at least 10 minutes
    assert [a.number for a in late_candidates(attempts, now, tiny)] == [2]


def test_late_jobs_are_looked_for_only_just_before_the_current_attempt() -> None:
    from datetime import UTC, datetime, timedelta

    from slurmjob_operator.api.status import Attempt
    from slurmjob_operator.core.absence import MAX_LATE_CANDIDATES, late_candidates
    from slurmjob_operator.times import rfc3339

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    at = rfc3339(now - timedelta(seconds=5))
    # Whatever a status says: 300 attempts all "proven absent" a moment ago.
    attempts = [Attempt(number=n, job_name=f"a{n}", proven_absent_at=at) for n in range(1, 302)]
    chosen = late_candidates(attempts, now, WINDOW)
    assert MAX_LATE_CANDIDATES == 2
    assert [a.number for a in chosen] == [299, 300]


def _fakes(count: int, proven_at: str) -> list[dict[str, Any]]:
    return [
        {"number": 1000 + n, "jobName": f"sj-x-{n}", "provenAbsentAt": proven_at}
        for n in range(count)
    ]


async def test_a_fold_lists_the_controllers_jobs_once_whatever_the_status_says(
    tmp_path: Path,
) -> None:
    from datetime import UTC, datetime

    from slurmjob_operator.api import patch

    from .test_controller import refresh

    bed = make_bed(tmp_path)
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)  # job 100, followed
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = bed.store.body(ref)
    real = body["status"]["attempts"][-1]
    # The status writer's 300 "older attempts proven absent", the real one kept last.
    body["status"] = patch.apply(body["status"], {"attempts": [*_fakes(300, now), real]})
    calls0 = len(bed.slurm.calls)
    bed.slurm.set_state(100, "RUNNING")
    await refresh(bed, ref)  # one fold, as the poller makes on a state change
    made = bed.slurm.calls[calls0:]
    # Before: 300 find_by_name, each a full GET /jobs and a slurmdb query.
    assert not [c for c in made if c.startswith("find_by_name")]
    assert made.count("list_jobs") == 1
    assert bed.store.status(ref).phase is Phase.RUNNING


async def test_late_jobs_of_the_two_attempts_before_share_one_listing(tmp_path: Path) -> None:
    bed = short(tmp_path)
    bed.slurm.faults = ["unsent", "unsent"]  # two submits lost in a row
    ref = bed.store.create("train", cpu_spec())
    for _ in range(2):
        await reconcile(bed, ref)
        assert await reconcile(bed, ref) is not None  # found nowhere: the clock starts
        await asyncio.sleep(0.05)
    assert await reconcile(bed, ref) is None  # attempt 2 proven absent, attempt 3 out
    first, second, third = bed.store.status(ref).attempts
    assert first.proven_absent_at is not None
    assert second.proven_absent_at is not None
    assert third.job_id is not None

    def late(job_id: int, attempt: int, name: str) -> SlurmJobView:
        return SlurmJobView(
            job_id=job_id,
            name=name,
            comment=f"slurmjob.io ns={ref.namespace} name={ref.name} uid={ref.uid} "
            f"attempt={attempt}",
            user=OPERATOR_USER,
            raw_state=("PENDING",),
            base_state=BaseState.PENDING,
        )

    # Both held requests reach slurmctld after all: one listing finds both.
    bed.slurm.jobs[555] = late(555, 1, first.job_name)
    bed.slurm.jobs[556] = late(556, 2, second.job_name)
    [item] = [t for t in bed.controller.followed() if t.ref == ref]
    calls0 = len(bed.slurm.calls)
    await bed.controller.refresh(item, await bed.slurm.get_job(third.job_id))
    made = bed.slurm.calls[calls0:]
    assert made.count("list_jobs") == 1
    assert not [c for c in made if c.startswith("find_by_name")]
    assert bed.slurm.jobs[555].base_state is BaseState.CANCELLED
    assert bed.slurm.jobs[556].base_state is BaseState.CANCELLED
    assert bed.store.reasons().count("LateSubmitCancelled") == 2
