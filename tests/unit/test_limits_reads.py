"""How often the cluster's limits are read when tenants send specs that cannot fit: a refusal
is made on a read no older than the refusal age, one read at most is in flight, and no
number of over-limit SlurmJobs makes more than one read per refusal age (docs/security.md,
"Reads tenants cannot multiply")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.api.status import Phase
from slurmjob_operator.controller.limits import LimitsCache
from slurmjob_operator.core.limits import ReadTimes, Source, limits_source, refusal_age_for
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.slurm.errors import SlurmTransient
from slurmjob_operator.slurm.nodes import PartitionInfo

from .controller_fakes import Bed, cpu_spec, make_bed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _bed(tmp_path: Path, clock: Clock | None = None, ttl: float = 3600) -> Bed:
    bed = make_bed(tmp_path, poll_interval=ttl)
    if clock is not None:
        submission = bed.controller._submission
        submission.limits = LimitsCache(bed.controller.name, bed.controller.slurm, ttl, clock=clock)
    bed.slurm.partition_list = [
        PartitionInfo(name="debug", states=frozenset({"UP"}), max_cpus_per_node=64)
    ]
    return bed


def _big(bed: Bed, count: int, prefix: str = "big") -> list[ObjectRef]:
    pools = [{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 4096, "memoryGb": 1}]
    return [bed.store.create(f"{prefix}{i}", cpu_spec(pools=pools)) for i in range(count)]


def _refused(bed: Bed, ref: ObjectRef) -> bool:
    status = bed.store.status(ref)
    failed = [c for c in status.conditions if c.type == "Failed"]
    return status.phase is Phase.FAILED and failed[0].reason == Reason.LIMIT_EXCEEDED


def _slow_reads(bed: Bed) -> dict[str, int]:
    """Make each read of the partitions take a while; count the reads in flight at once."""
    seen = {"now": 0, "most": 0}
    real = bed.slurm.partitions

    async def slow() -> list[PartitionInfo]:
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        try:
            await asyncio.sleep(0.02)
            return await real()
        finally:
            seen["now"] -= 1

    bed.slurm.partitions = slow  # type: ignore[method-assign]
    return seen


async def test_fifty_over_limit_specs_at_once_cost_one_read(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    seen = _slow_reads(bed)
    refs = _big(bed, 50)
    await asyncio.gather(*(bed.controller.reconcile(ref) for ref in refs))
    assert all(_refused(bed, ref) for ref in refs)
    # Before: 51 full reads (one per spec, each a fresh one, besides the first).
    assert bed.slurm.partition_reads == 1
    assert seen["most"] == 1
    assert bed.slurm.calls == []


async def test_over_limit_specs_arriving_one_by_one_read_once_per_refusal_age(
    tmp_path: Path,
) -> None:
    clock = Clock()
    bed = _bed(tmp_path, clock)
    refs = _big(bed, 50)
    for ref in refs:  # one every half second: 25 s
        await bed.controller.reconcile(ref)
        clock.now += 0.5
    assert all(_refused(bed, ref) for ref in refs)
    age = bed.controller._submission.limits.refusal_age
    assert age == 5.0  # the poll interval, at most 5 s
    # Before: 51.
    assert bed.slurm.partition_reads <= 1 + 25 / age


async def test_reads_that_fail_are_not_retried_by_every_over_limit_spec(tmp_path: Path) -> None:
    clock = Clock()
    bed = _bed(tmp_path, clock)
    first = bed.store.create("first", cpu_spec())
    await bed.controller.reconcile(first)  # the read kept for the poll interval
    bed.slurm.partition_list = SlurmTransient("slurmrestd busy")
    clock.now += 6  # older than the refusal age: a refusal needs a new read
    refs = _big(bed, 50)
    await asyncio.gather(*(bed.controller.reconcile(ref) for ref in refs))
    # Never refused on the kept answer; Slurm's own checks at submit remain.
    assert not any(_refused(bed, ref) for ref in refs)
    # Before: 51 (each spec read anew, each read failed).
    assert bed.slurm.partition_reads == 2


async def test_a_refusal_is_made_only_on_a_read_no_older_than_the_refusal_age(
    tmp_path: Path,
) -> None:
    clock = Clock()
    bed = _bed(tmp_path, clock)
    await bed.controller.reconcile(bed.store.create("first", cpu_spec()))  # only `debug`
    bed.slurm.partition_list = [
        PartitionInfo(name="debug", states=frozenset({"UP"})),
        PartitionInfo(name="fresh", states=frozenset({"UP"})),
    ]
    # A partition made after the kept read, which is younger than the refusal age: refused.
    young = bed.store.create("young", cpu_spec(partition="fresh"))
    await bed.controller.reconcile(young)
    assert _refused(bed, young)
    # Once it is older, a spec it would refuse is judged on a new read.
    clock.now += 5
    ref = bed.store.create("train", cpu_spec(partition="fresh"))
    await bed.controller.reconcile(ref)
    assert bed.store.status(ref).phase is Phase.QUEUED
    assert bed.slurm.partition_reads == 2
    # Not refused on an answer kept from before reads that fail.
    bed.slurm.partition_list = SlurmTransient("down")
    clock.now += 5
    other = bed.store.create("other", cpu_spec(partition="gone"))
    await bed.controller.reconcile(other)
    assert bed.store.status(other).phase is Phase.QUEUED


async def test_the_poll_interval_read_still_comes_once_per_interval(tmp_path: Path) -> None:
    clock = Clock()
    bed = _bed(tmp_path, clock, ttl=30)
    for i in range(12):
        await bed.controller.reconcile(bed.store.create(f"j{i}", cpu_spec()))
        clock.now += 7
    # 77 s: a read at 0, 35 and 70 (each the first submission after the interval).
    assert bed.slurm.partition_reads == 3


@pytest.mark.parametrize(("ttl", "age"), [(0.05, 0.05), (2.0, 2.0), (10.0, 5.0), (3600.0, 5.0)])
def test_the_refusal_age_is_the_poll_interval_at_most_five_seconds(ttl: float, age: float) -> None:
    assert refusal_age_for(ttl) == age


NEVER = ReadTimes()
FAILED_AT_0 = ReadTimes(tried=0.0, good=None)
OK_AT_0 = ReadTimes(tried=0.0, good=0.0)
OK_THEN_FAILED = ReadTimes(tried=8.0, good=0.0)


@pytest.mark.parametrize(
    ("times", "now", "fresh", "source"),
    [
        (NEVER, 0.0, False, Source.READ),
        (NEVER, 0.0, True, Source.READ),
        (OK_AT_0, 9.0, False, Source.KEPT),  # within the poll interval
        (OK_AT_0, 10.0, False, Source.READ),
        (OK_AT_0, 4.9, True, Source.KEPT),  # young enough to refuse on
        (OK_AT_0, 5.0, True, Source.READ),
        (FAILED_AT_0, 4.0, True, Source.NOTHING),  # no read since the one that failed
        (FAILED_AT_0, 4.0, False, Source.KEPT),  # the last answer, or none
        (FAILED_AT_0, 5.0, True, Source.READ),
        (OK_THEN_FAILED, 9.0, True, Source.NOTHING),
        (OK_THEN_FAILED, 13.0, True, Source.READ),
    ],
)
def test_where_a_snapshot_comes_from(
    times: ReadTimes, now: float, fresh: bool, source: Source
) -> None:
    assert limits_source(times, now, fresh=fresh, ttl=10.0, refusal_age=5.0) is source


async def test_a_read_cancelled_midway_gives_its_waiters_nothing_to_refuse_on(
    tmp_path: Path,
) -> None:
    bed = _bed(tmp_path)
    started = asyncio.Event()

    async def hangs() -> Any:
        started.set()
        await asyncio.sleep(3600)

    bed.slurm.partitions = hangs  # type: ignore[method-assign]
    limits = bed.controller._submission.limits
    task = asyncio.create_task(limits.snapshot())
    await started.wait()
    waiter = asyncio.create_task(limits.snapshot(fresh=True))
    await asyncio.sleep(0)
    task.cancel()
    # Not a read of its own (which would hang too): the one it waited for gave nothing.
    assert await asyncio.wait_for(waiter, 5) is None
    assert bed.slurm.partition_reads == 0
