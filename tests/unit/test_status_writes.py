"""A submission from the watch's copy (issue 24): no GET, the write-ahead record conditioned on
the copy's resourceVersion, the job id and its confirmation in one write, and exactly-once
kept when the copy is stale or the resource changes during the POST."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.controller import RetryLater

from .controller_fakes import Bed, cpu_spec, make_bed


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


async def from_watch(bed: Bed, ref: Any, body: dict[str, Any]) -> RetryLater | None:
    """What kopf's handler does with the body its event delivered."""
    try:
        await bed.controller.reconcile(ref, copy.deepcopy(body))
    except RetryLater as exc:
        return exc
    return None


async def test_a_creation_costs_no_read_and_two_status_writes(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    assert await from_watch(bed, ref, bed.store.body(ref)) is None
    [attempt] = bed.store.status(ref).attempts
    assert (attempt.job_id, attempt.confirmed) == (100, True)
    assert bed.store.gets == 0
    # The write-ahead record, then the job id with its confirmation.
    assert bed.store.patches == 2
    assert bed.store.reasons().count("Submitted") == 1
    assert bed.slurm.calls.count("submit") == 1


async def test_a_stale_copy_writes_nothing_and_the_job_is_not_submitted_twice(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    stale = copy.deepcopy(bed.store.body(ref))  # as the watch delivered it, before any write
    assert await from_watch(bed, ref, stale) is None
    patches = bed.store.patches
    # An event delivered late (or a second handler) with the copy from before the submit: its
    # write-ahead record is refused (409), the resource is read again and only followed.
    assert await from_watch(bed, ref, stale) is None
    assert bed.store.conflicts == 1
    assert bed.slurm.calls.count("submit") == 1
    assert len(bed.store.status(ref).attempts) == 1
    assert bed.store.patches == patches


async def test_a_label_edit_during_the_post_keeps_the_receipt(bed: Bed) -> None:
    """The id's write is refused (409) after the POST: the id held in memory is written onto
    a fresh copy, and the attempt is not looked for by its name."""
    ref = bed.store.create("train", cpu_spec())
    submit = bed.slurm.do_submit

    async def edited_meanwhile(req: Any, user: str | None) -> Any:
        receipt = await submit(req, user)
        bed.store.touch(ref, team="a")
        return receipt

    bed.slurm.do_submit = edited_meanwhile  # type: ignore[method-assign]
    assert await from_watch(bed, ref, bed.store.body(ref)) is None
    [attempt] = bed.store.status(ref).attempts
    assert (attempt.job_id, attempt.confirmed) == (100, True)
    assert bed.store.conflicts == 1
    assert "find_by_name" not in bed.slurm.calls
    assert bed.slurm.calls.count("submit") == 1
    assert bed.store.reasons().count("Submitted") == 1


async def test_a_failed_confirming_read_writes_the_id_alone_at_once(bed: Bed) -> None:
    bed.slurm.get_faults = 2
    ref = bed.store.create("train", cpu_spec())
    assert await from_watch(bed, ref, bed.store.body(ref)) is not None
    [attempt] = bed.store.status(ref).attempts
    assert (attempt.job_id, attempt.confirmed) == (100, False)
    assert bed.store.reasons().count("Submitted") == 1


async def test_a_resource_deleted_while_waiting_is_not_submitted(bed: Bed) -> None:
    ref = bed.store.create("train", cpu_spec())
    seen = copy.deepcopy(bed.store.body(ref))
    bed.store.body(ref)["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    bed.store.touch(ref)
    assert await from_watch(bed, ref, seen) is None
    assert "submit" not in bed.slurm.calls
    assert bed.store.status(ref).attempts == []


async def test_a_status_changed_at_every_write_leaves_the_job_to_adoption_not_to_a_resubmit(
    bed: Bed,
) -> None:
    """A tenant that rewrites its own resource at every operator write (three 409s on the
    receipt): the id is not written now, the attempt is found again by its name, and Slurm
    holds one job."""
    ref = bed.store.create("train", cpu_spec())
    submit, patch_status = bed.slurm.do_submit, bed.store.patch_status
    posted = False

    async def submitted(req: Any, user: str | None) -> Any:
        nonlocal posted
        receipt = await submit(req, user)
        posted = True
        return receipt

    async def rewritten_each_time(
        target: Any, change: Any, resource_version: str | None = None
    ) -> Any:
        if posted and resource_version is not None:
            bed.store.touch(ref, churn=str(bed.store.conflicts))
        return await patch_status(target, change, resource_version)

    bed.slurm.do_submit = submitted  # type: ignore[method-assign]
    bed.store.patch_status = rewritten_each_time  # type: ignore[method-assign]
    assert await from_watch(bed, ref, bed.store.body(ref)) is not None
    [attempt] = bed.store.status(ref).attempts
    assert attempt.job_id is None
    assert bed.store.conflicts == 3
    # The resource stops changing: the next look adopts the job the POST made.
    bed.store.patch_status = patch_status  # type: ignore[method-assign]
    for _ in range(3):
        await from_watch(bed, ref, bed.store.body(ref))
    [attempt] = bed.store.status(ref).attempts
    assert attempt.job_id == 100
    assert bed.slurm.calls.count("submit") == 1
    assert len(bed.slurm.jobs) == 1
