"""A Slurm job under the attempt's job id that is not the attempt's job (an id reused, a status
`jobId` written by someone with status write access, a server that lies) is neither folded into
the status nor cancelled: the controller against the in-memory store and Slurm.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.jobview import BaseState, JobSource, SlurmJobView
from slurmjob_operator.core.naming import comment, job_name

from .controller_fakes import Bed, cpu_spec, make_bed
from .test_controller import condition, reconcile, refresh, tracked

MISMATCH = "JobIdentityMismatch"
OTHER_UID = "0b1e55ed-0000-4000-8000-000000000b0b"


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


def stranger(job_id: int, state: str = "COMPLETED", **fields: Any) -> SlurmJobView:
    """Another tenant's job (team-b/secret-project) under `job_id`."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "sluid": f"s{job_id:08d}",
        "name": job_name("team-b", "secret-project", OTHER_UID, 1),
        "comment": comment("team-b", "secret-project", OTHER_UID, 1),
        "raw_state": (state,),
        "base_state": BaseState(state),
    }
    values.update(fields)
    return SlurmJobView(**values)


def mismatches(bed: Bed) -> list[str]:
    return [message for type_, reason, message in bed.store.events if reason == MISMATCH]


def assert_no_leak(text: str) -> None:
    assert "team-b" not in text
    assert "secret-project" not in text
    assert OTHER_UID not in text


# -- fold ---------------------------------------------------------------------------------


async def test_a_foreign_job_under_the_receipts_id_is_not_confirmed(bed: Bed) -> None:
    bed.slurm.impostors[100] = stranger(100, "RUNNING")
    ref = bed.store.create("train", cpu_spec())
    retry = await reconcile(bed, ref)
    assert retry is not None, "confirmed later, once Slurm shows the attempt's own job"
    status = bed.store.status(ref)
    [attempt] = status.attempts
    assert (attempt.job_id, attempt.confirmed, attempt.sluid) == (100, False, None)
    assert status.phase is Phase.QUEUED, "the foreign job's RUNNING is not folded"
    assert not bed.controller.followed()
    [text] = mismatches(bed)
    assert attempt.job_name in text
    assert ref.uid in text
    assert "its job name differs" in text
    assert "another resource" in text
    assert_no_leak(text)
    del bed.slurm.impostors[100]
    assert await reconcile(bed, ref) is None
    assert bed.store.status(ref).attempts[0].confirmed


async def test_a_foreign_job_under_a_followed_id_is_not_folded(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    before = bed.store.status(ref)
    bed.slurm.jobs[100] = stranger(100, "COMPLETED")
    await refresh(bed, ref)
    assert bed.store.status(ref) == before, "the status is not changed"
    assert "Succeeded" not in bed.store.reasons()
    assert len(mismatches(bed)) == 1
    assert tracked(bed, ref).job_id == 100


@pytest.mark.parametrize(
    ("fields", "differs"),
    [
        ({"comment": None}, "no slurmjob.io comment"),  # a live job always has ours
        ({"comment": "hello"}, "no slurmjob.io comment"),
        ({"attempt": 2}, "attempt 2 of this resource"),
        ({"name": "sj-team-a-train-other-a1"}, "its job name differs"),
        ({"het_job_id": 50}, "Slurm answered for job 50"),
    ],
)
async def test_each_identity_difference_is_refused(
    bed: Bed, fields: dict[str, Any], differs: str
) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    attempt = bed.store.status(ref).attempts[0]
    update = dict(fields)
    if "attempt" in update:
        number = update.pop("attempt")
        update["comment"] = comment(ref.namespace, ref.name, ref.uid, number)
    bed.slurm.jobs[100] = bed.slurm.jobs[100].model_copy(update=update)
    bed.slurm.set_state(100, "COMPLETED", 0)
    await refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.QUEUED
    [text] = mismatches(bed)
    assert differs in text
    assert attempt.job_name in text


async def test_a_foreign_accounting_record_is_not_folded(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "COMPLETED", 0)
    bed.slurm.purge(100)
    bed.slurm.purged[100] = stranger(100, "FAILED")
    await refresh(bed, ref)
    status = bed.store.status(ref)
    assert status.phase is Phase.QUEUED, "neither the stranger's FAILED nor lost"
    assert len(mismatches(bed)) == 1


async def test_an_accounting_record_without_a_comment_is_taken_on_its_name(bed: Bed) -> None:
    # slurmdbd keeps the comment only with AccountingStoreFlags=job_comment.
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    bed.slurm.set_state(100, "COMPLETED", 0)
    bed.slurm.purge(100)
    bed.slurm.purged[100] = bed.slurm.purged[100].model_copy(update={"comment": None})
    await refresh(bed, ref)
    assert bed.store.status(ref).phase is Phase.SUCCEEDED
    assert not mismatches(bed)


# -- a status jobId is only a claim -------------------------------------------------------


async def two_tenants(bed: Bed) -> tuple[Any, Any]:
    mine = bed.store.create("train", cpu_spec())
    theirs = bed.store.create("secret-project", cpu_spec(), namespace="team-b")
    await reconcile(bed, mine)
    await reconcile(bed, theirs)
    assert [a.job_id for a in bed.store.status(theirs).attempts] == [101]
    return mine, theirs


def claim(bed: Bed, ref: Any, job_id: int, sluid: str | None) -> None:
    """Someone with status write access points the attempt at another job."""
    body = bed.store.body(ref)
    attempt = body["status"]["attempts"][-1]
    attempt["jobId"] = job_id
    attempt["sluid"] = sluid
    bed.controller.observe_body(copy.deepcopy(body))


@pytest.mark.parametrize("sluid", [None, "s00000101"])
async def test_a_status_claiming_another_tenants_job_neither_folds_nor_cancels_it(
    bed: Bed, sluid: str | None
) -> None:
    mine, theirs = await two_tenants(bed)
    staging = Path(bed.store.status(mine).attempts[0].staging_dir or "")
    claim(bed, mine, 101, sluid)
    bed.slurm.set_state(101, "RUNNING")
    await refresh(bed, mine)
    assert bed.store.status(mine).phase is Phase.QUEUED, "their RUNNING is not ours"
    await bed.controller.finalize(bed.store.body(mine))
    # The deletion looks for the resource's own jobs by name, whatever id the status claims:
    # its own job is cancelled, theirs is never looked at.
    assert [c for c in bed.slurm.calls if c.startswith("cancel")] == ["cancel_many s00000100"]
    assert bed.slurm.jobs[101].base_state is BaseState.RUNNING, "their job runs on"
    assert bed.slurm.jobs[100].base_state is BaseState.CANCELLED
    assert len(mismatches(bed)) == 1  # the fold's
    for text in mismatches(bed):
        assert "secret-project" not in text
        assert "team-b" not in text
    assert not staging.parent.exists(), "the deletion itself goes on"
    assert bed.store.status(theirs).attempts[0].job_id == 101


# -- deletion and adoption -----------------------------------------------------------------


async def test_deleting_leaves_a_foreign_job_under_the_attempts_id_alone(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    staging = Path(bed.store.status(ref).attempts[0].staging_dir or "")
    bed.slurm.jobs[100] = stranger(100, "RUNNING")
    before = len(bed.slurm.calls)
    await bed.controller.finalize(bed.store.body(ref))
    assert not any(c.startswith("cancel") for c in bed.slurm.calls)
    assert bed.slurm.jobs[100].base_state is BaseState.RUNNING
    # Looked for by the attempt's name, not its id: the stranger is not even a candidate.
    assert bed.slurm.calls[before:] == ["list_jobs"]
    assert not mismatches(bed)
    assert not staging.parent.exists(), "the deletion itself goes on"
    assert not bed.controller.followed()


async def test_deleting_by_identity_still_cancels_the_attempts_own_job(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    await bed.controller.finalize(bed.store.body(ref))
    assert bed.slurm.calls[-3:-1] == ["list_jobs", "cancel_many s00000100"]
    assert bed.slurm.jobs[100].base_state is BaseState.CANCELLED
    assert not mismatches(bed)


@pytest.mark.parametrize(
    ("source", "adopted"), [(JobSource.CONTROLLER, False), (JobSource.ACCOUNTING, True)]
)
async def test_a_job_with_the_name_but_no_comment_is_adopted_only_from_accounting(
    bed: Bed, source: JobSource, adopted: bool
) -> None:
    bed.slurm.faults = ["unsent"]
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    name = bed.store.status(ref).attempts[0].job_name
    look_alike = SlurmJobView(
        job_id=300,
        name=name,
        source=source,
        raw_state=("COMPLETED",),
        base_state=BaseState.COMPLETED,
    )
    if source is JobSource.ACCOUNTING:
        bed.slurm.purged[300] = look_alike
    else:
        bed.slurm.jobs[300] = look_alike
    await reconcile(bed, ref)
    job_id = bed.store.status(ref).attempts[0].job_id
    assert (job_id == 300) is adopted
    assert condition(bed, ref, "Submitted") == (
        ("True", "Adopted") if adopted else ("Unknown", "SubmissionUnconfirmed")
    )
