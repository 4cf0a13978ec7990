"""A status is a claim everywhere (issue 42): the values the operator decides on are taken
from a status only through `core.claims`, which recomputes or clamps them. Each controller
test here rewrites a status as someone with `slurmjobs/status` write access could, and fails
on the code before `core.claims` existed."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.segmentstatus import AttemptSegment
from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus, get_condition
from slurmjob_operator.api.walltime import WalltimeSpec
from slurmjob_operator.core import claims, naming
from slurmjob_operator.core.claims import ChainLimit, Placement
from slurmjob_operator.core.jobview import BaseState
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.storage import ledger
from slurmjob_operator.storage.nofollow import UnsafePath
from slurmjob_operator.times import rfc3339

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def attempts(*numbers: int, segment: bool = False) -> list[Attempt]:
    return [
        Attempt(
            number=n,
            job_name=f"sj-a{n}",
            job_id=100 + n,
            started_at=rfc3339(NOW),
            native_state="TIMEOUT",
            segment=AttemptSegment(index=i, limit_minutes=60) if segment else None,
        )
        for i, n in enumerate(numbers)
    ]


# -- the pure rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("numbers", "made", "expected"),
    [
        ((), 0, 1),
        ((1, 2), 2, 3),
        ((1, 2), 0, 3),  # directories not made yet (or unreadable): the status's count
        ((), 5, 6),  # a status emptied by hand: past what the storage shows was made
        ((1,), 7, 8),  # a status shortened by hand
        ((9,), 3, 10),  # a higher claim only spends the resource's own numbers sooner
    ],
)
def test_the_next_attempt_is_past_the_status_and_the_storage(
    numbers: tuple[int, ...], made: int, expected: int
) -> None:
    status = SlurmJobStatus(attempts=attempts(*numbers))
    assert claims.next_attempt(status, made) == expected


def test_the_cap_adds_up_every_budget() -> None:
    walltime = WalltimeSpec(total_time="10h", segment_time=60, max_segments=5)
    cap = claims.attempt_cap(3, 2, None)
    assert cap == 1 + 3 + claims.MAX_IGNORED + 2 + claims.NEVER_RAN_ALLOWANCE
    assert claims.attempt_cap(3, 2, walltime) == cap + 5
    assert claims.attempt_cap(3, 2, None, queued=True) == cap + claims.EVICTION_ALLOWANCE
    assert claims.over_cap(cap, cap) is None
    refusal = claims.over_cap(cap + 1, cap)
    assert refusal is not None
    assert f"{cap} attempts" in refusal


LIMIT = ChainLimit(600, "the site's maximum (SLURMJOB_MAX_TOTAL_TIME)")


@pytest.mark.parametrize(
    ("claimed", "number", "full", "max_segments", "room"),
    [
        ((), 1, 60, 100, 600),  # nothing made: the whole maximum
        ((1, 2), 3, 60, 100, 480),  # two made, each counted at its full 60 minutes
        ((), 3, 60, 100, 480),  # the same with the status emptied: the storage's count
        ((1,), 11, 60, 100, "may have run 600 minutes"),  # ten made: the maximum is spent
        ((1,), 6, 30, 5, "maxSegments (5)"),  # five made: maxSegments is spent
        ((1, 2, 3, 4, 5), 6, 30, 5, "maxSegments (5)"),
    ],
)
def test_a_chain_is_counted_from_the_attempts_made_each_at_its_full_time(
    claimed: tuple[int, ...], number: int, full: int, max_segments: int, room: int | str
) -> None:
    walltime = WalltimeSpec(total_time="10h", segment_time=full, max_segments=max_segments)
    got = claims.chain_room(walltime, attempts(*claimed, segment=True), number, full, LIMIT)
    if isinstance(room, int):
        assert got == room
    else:
        assert isinstance(got, str)
        assert room in got


def test_a_chain_claiming_never_ran_attempts_wins_at_most_the_allowance() -> None:
    walltime = WalltimeSpec(total_time="100h", segment_time=60, max_segments=1000)
    lost = [
        Attempt(number=n, job_name=f"sj-a{n}", segment=AttemptSegment(index=0, limit_minutes=60))
        for n in range(1, 41)
    ]
    limit = ChainLimit(6000, "x")
    room = claims.chain_room(walltime, lost, 41, 60, limit)
    assert room == 6000 - (40 - claims.NEVER_RAN_ALLOWANCE) * 60


def final(finished: str | None) -> SlurmJobStatus:
    conditions = (
        []
        if finished is None
        else [
            {
                "type": "Finished",
                "status": "True",
                "reason": "Failed",
                "message": "",
                "lastTransitionTime": finished,
            }
        ]
    )
    return SlurmJobStatus.model_validate({"phase": "Failed", "conditions": conditions})


@pytest.mark.parametrize(
    ("finished", "first_seen", "expected"),
    [
        (rfc3339(NOW - timedelta(hours=1)), None, NOW - timedelta(hours=1)),
        (rfc3339(NOW - timedelta(hours=1)), NOW, NOW - timedelta(hours=1)),
        (rfc3339(NOW + timedelta(days=3650)), None, NOW),  # ten years ahead: now
        (rfc3339(NOW + timedelta(days=3650)), NOW - timedelta(hours=2), NOW - timedelta(hours=2)),
        ("not a time", NOW - timedelta(hours=2), NOW - timedelta(hours=2)),
        (None, NOW - timedelta(minutes=5), NOW - timedelta(minutes=5)),
    ],
)
def test_the_ttl_clock_starts_no_later_than_the_operator_saw_it_final(
    finished: str | None, first_seen: datetime | None, expected: datetime
) -> None:
    assert claims.finished_at(final(finished), first_seen, NOW) == expected


def test_no_clock_for_a_status_that_is_not_final() -> None:
    status = SlurmJobStatus.model_validate({"phase": "Running"})
    assert claims.finished_at(status, NOW, NOW) is None


TWO = Clusters(("east", "west"))


@pytest.mark.parametrize(
    ("spec", "default", "tenant_clusters", "claimed", "followed", "looked"),
    [
        (None, None, None, "<none>", "east", ("east",)),
        ("west", None, None, "west", "west", ("west",)),
        ("west", None, None, "east", None, ("west", "east")),  # a claim against the spec
        (None, "west", None, "east", None, ("west", "east")),  # against the tenant
        (None, None, ("west",), "west", "west", ("west",)),  # a tenant kept off east
        (None, None, None, "west", None, ("east", "west")),  # a named claim: nobody follows
        (None, None, None, "retired", None, ("east",)),  # a cluster not served
    ],
)
def test_routing_is_recomputed_and_a_disagreeing_claim_is_followed_by_none(
    spec: str | None,
    default: str | None,
    tenant_clusters: tuple[str, ...] | None,
    claimed: str,
    followed: str | None,
    looked: tuple[str, ...],
) -> None:
    status = SlurmJobStatus(
        attempts=[]
        if claimed == "<none>"
        else [Attempt(number=1, job_name="sj-a1", job_id=5, cluster=claimed)]
    )
    where = claims.placed(TWO, status, spec, default, tenant_clusters)
    assert where.followed_on == followed
    assert where.looked_on == looked


def test_an_unnamed_attempt_of_a_one_cluster_release_keeps_its_cluster() -> None:
    status = SlurmJobStatus(attempts=[Attempt(number=1, job_name="sj-a1", job_id=5)])
    legacy = Clusters(("east", "west"), legacy="west")
    assert claims.placed(legacy, status, None, None).followed_on == "west"
    # Where the spec says otherwise, the unnamed attempt is followed by none.
    assert claims.placed(legacy, status, "east", None).followed_on is None
    assert Placement("east", True, None, True).followed_on is None


# -- through the controller, on the in-memory apiserver and Slurm ----------------------------


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


def rewrite(bed: Bed, ref: Any, status: dict[str, Any]) -> None:
    """Someone with status write access replaces the status."""
    body = bed.store.body(ref)
    body["status"] = status
    bed.controller.observe_body(copy.deepcopy(body))


def plant_attempts(bed: Bed, ref: Any, count: int) -> None:
    """The attempt directories the operator made for `count` attempts."""
    for n in range(1, count + 1):
        where = naming.staging_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid, n)
        where.mkdir(parents=True, exist_ok=True)


async def test_an_emptied_status_neither_reuses_a_number_nor_a_job_name(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    assert [a.number for a in bed.store.status(ref).attempts] == [1]
    bed.slurm.set_state(100, "FAILED", 1)
    rewrite(bed, ref, {})
    await reconcile(bed, ref)
    [attempt] = bed.store.status(ref).attempts
    assert attempt.number == 2
    assert attempt.job_name == naming.job_name(ref.namespace, ref.name, ref.uid, 2)


async def test_a_rewritten_status_makes_no_more_attempts_than_the_budgets_allow(
    bed: Bed,
) -> None:
    ref = bed.store.create("train", cpu_spec())
    cap = claims.attempt_cap(0, bed.settings.probe_attempts, None)
    plant_attempts(bed, ref, cap)
    await reconcile(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    failed = get_condition(status.conditions, "Failed")
    assert failed is not None
    assert failed.reason == "AttemptsExhausted"
    assert not bed.slurm.requests, "nothing was sent"


def chain(**walltime: Any) -> dict[str, Any]:
    spec = cpu_spec(walltime={"totalTime": "1h", "segmentTime": 20, **walltime})
    del spec["timeLimit"]
    return spec


@pytest.mark.parametrize(
    ("walltime", "made", "settings", "words"),
    [
        ({"maxSegments": 3}, 3, {}, "maxSegments (3)"),
        ({}, 3, {"max_total_time": 60}, "may have run 60 minutes"),
    ],
)
async def test_a_chain_whose_status_was_rolled_back_is_spent_by_what_was_made(
    tmp_path: Path, walltime: dict[str, Any], made: int, settings: dict[str, Any], words: str
) -> None:
    bed = make_bed(tmp_path, **settings)
    ref = bed.store.create("chain", chain(**walltime))
    plant_attempts(bed, ref, made)
    await reconcile(bed, ref)
    status = bed.store.status(ref)
    failed = get_condition(status.conditions, "Failed")
    assert failed is not None
    assert (status.phase, failed.reason) == (Phase.FAILED, "WalltimeExhausted")
    assert words in (failed.message or "")
    assert not bed.slurm.requests, "nothing was sent"


async def test_a_finished_time_ten_years_ahead_keeps_nothing_past_its_ttl(bed: Bed) -> None:
    bed.slurm.faults = ["rejected"]
    ref = bed.store.create("train", cpu_spec(ttlSecondsAfterFinished=60))
    await reconcile(bed, ref)  # refused by Slurm: Failed, final
    body = bed.store.body(ref)
    for cond in body["status"]["conditions"]:
        if cond["type"] == "Finished":
            cond["lastTransitionTime"] = rfc3339(datetime.now(tz=UTC) + timedelta(days=3650))
    bed.controller.observe_body(copy.deepcopy(body))
    due = bed.controller.wakes.due_in(ref.uid)
    assert due is not None
    assert due <= 60


async def test_a_status_claiming_final_does_not_keep_the_job_running(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "RUNNING")
    status = copy.deepcopy(bed.store.body(ref)["status"])
    status["phase"] = "Succeeded"
    status["conditions"] = [
        {
            "type": "Finished",
            "status": "True",
            "reason": "Succeeded",
            "message": "",
            "lastTransitionTime": rfc3339(datetime.now(tz=UTC)),
        }
    ]
    rewrite(bed, ref, status)
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.jobs[100].base_state is BaseState.CANCELLED


async def test_a_status_emptied_before_deletion_still_has_its_jobs_cancelled(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    rewrite(bed, ref, {})
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.jobs[100].base_state is BaseState.CANCELLED


async def test_a_job_with_the_resources_name_but_another_identity_is_left_alone(
    bed: Bed,
) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "RUNNING")
    # Another user's job carrying this attempt's name (names are anyone's to choose).
    bed.slurm.jobs[100] = bed.slurm.jobs[100].model_copy(update={"comment": "mine"})
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.jobs[100].base_state is BaseState.RUNNING
    assert not [c for c in bed.slurm.calls if c.startswith("cancel")]
    assert "JobIdentityMismatch" in bed.store.reasons()


async def test_an_upstream_status_naming_another_tenants_job_is_no_dependency(
    bed: Bed,
) -> None:
    theirs = bed.store.create("secret", cpu_spec(), namespace="team-b")
    await reconcile(bed, theirs)
    [their_attempt] = bed.store.status(theirs).attempts
    bed.slurm.set_state(100, "RUNNING")
    pre = bed.store.create("pre", cpu_spec())
    await reconcile(bed, pre)  # job 101
    body = bed.store.body(pre)
    body["status"]["attempts"][-1]["jobId"] = their_attempt.job_id
    bed.controller.observe_body(copy.deepcopy(body))
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await reconcile(bed, post)
    assert all(dep != "afterok:100" for dep in bed.slurm.dependency.values())
    assert not bed.store.status(post).attempts, "nothing sent with another's job as upstream"
    assert "JobIdentityMismatch" in bed.store.reasons()


# -- what a job can plant in its own resource directory -------------------------------------


def test_the_numbers_a_deletion_looks_for_are_bounded_whatever_is_claimed() -> None:
    status = SlurmJobStatus(attempts=attempts(1_000_000_000))
    assert claims.made_numbers(status, 0) == range(1, claims.ATTEMPT_NUMBER_MAX + 1)
    assert claims.made_numbers(SlurmJobStatus(), 999_999_999)[-1] == claims.ATTEMPT_NUMBER_MAX
    assert claims.made_numbers(SlurmJobStatus(attempts=attempts(1, 2)), 0) == range(1, 3)
    walltime = WalltimeSpec(total_time="1000h", segment_time=60, max_segments=1000)
    assert claims.attempt_cap(20, 10, walltime, queued=True) <= claims.ATTEMPT_NUMBER_MAX


async def test_a_planted_huge_attempt_directory_neither_stalls_a_deletion_nor_a_submit(
    bed: Bed,
) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    where = naming.resource_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid)
    (where / "attempt-999999999").mkdir()  # what a job owning its resource directory can do
    assert ledger.attempts_made(bed.settings, ref.namespace, ref.name, ref.uid) == 999_999_999
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.jobs[100].base_state is BaseState.CANCELLED


def test_the_ledger_refuses_a_linked_or_flooded_resource_directory(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)
    ns, name, uid = "team-a", "train", "0123456789abcdef0123"
    where = naming.resource_dir(bed.settings.storage_root, ns, name, uid)
    where.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "attempt-7").mkdir(parents=True)
    where.symlink_to(elsewhere)
    with pytest.raises(UnsafePath):
        ledger.attempts_made(bed.settings, ns, name, uid)
    where.unlink()
    where.mkdir()
    for i in range(ledger.MAX_ENTRIES + 1):
        (where / f"f{i}").touch()
    with pytest.raises(ledger.LedgerUnreadable):
        ledger.attempts_made(bed.settings, ns, name, uid)
    assert ledger.attempts_made(bed.settings, ns, "other", uid) == 0  # none made yet
