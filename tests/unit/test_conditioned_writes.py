"""The poller's and the finalizer's status writes land only on the version they were computed
from (issue 24): status.attempts is written whole by a merge patch, so a write computed from an
older copy would erase a newer write-ahead record, and the attempt it recorded would be
submitted a second time. On the in-memory apiserver, which refuses a stale resourceVersion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.status import Attempt, Phase
from slurmjob_operator.controller.resource import Stale

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile


def _queued(tmp_path: Path) -> tuple[Bed, Any]:
    bed = make_bed(tmp_path)
    return bed, bed.store.create("train", cpu_spec())


def _record_meanwhile(bed: Bed, ref: Any) -> None:
    """Another writer's newer write-ahead record (attempt 2, no job id yet) after a read."""
    body = bed.store.body(ref)
    attempts = body["status"]["attempts"]
    body["status"]["attempts"] = [
        *attempts,
        Attempt(number=2, job_name="sj-next", staging_dir="/s/attempt-2").model_dump(
            by_alias=True, exclude_none=True
        ),
    ]
    bed.store.touch(ref)


async def test_the_pollers_fold_never_erases_a_newer_record(tmp_path: Path) -> None:
    bed, ref = _queued(tmp_path)
    await reconcile(bed, ref)
    assert bed.store.status(ref).phase is Phase.QUEUED
    item = next(t for t in bed.controller.followed() if t.ref == ref)
    bed.slurm.set_state(100, "FAILED", return_code=1)
    real_get = bed.store.get
    reads = 0

    async def raced(namespace: str, name: str) -> dict[str, Any] | None:
        nonlocal reads
        reads += 1
        body = await real_get(namespace, name)
        if reads == 1:
            _record_meanwhile(bed, ref)  # lands between the poller's read and its write
        return body

    bed.store.get = raced  # type: ignore[method-assign]
    await bed.controller.refresh(item, await bed.slurm.get_job(100))
    attempts = bed.store.status(ref).attempts
    assert [a.number for a in attempts] == [1, 2], "the record of attempt 2 is still there"
    assert bed.store.conflicts == 1
    assert reads == 2, "read again once, and then left alone: attempt 2 is not job 100's"


async def test_a_fold_that_conflicts_twice_waits_for_the_next_poll(tmp_path: Path) -> None:
    bed, ref = _queued(tmp_path)
    await reconcile(bed, ref)
    item = next(t for t in bed.controller.followed() if t.ref == ref)
    bed.slurm.set_state(100, "COMPLETED", return_code=0)
    real_get = bed.store.get

    async def always_raced(namespace: str, name: str) -> dict[str, Any] | None:
        body = await real_get(namespace, name)
        bed.store.touch(ref, writer="other")
        return body

    bed.store.get = always_raced  # type: ignore[method-assign]
    with pytest.raises(Stale):  # the poller logs it and reads this job again next cycle
        await bed.controller.refresh(item, await bed.slurm.get_job(100))
    bed.store.get = real_get  # type: ignore[method-assign]
    assert bed.store.status(ref).phase is Phase.QUEUED, "nothing written from a stale copy"
    await bed.controller.refresh(item, await bed.slurm.get_job(100))
    assert bed.store.status(ref).phase is Phase.SUCCEEDED
