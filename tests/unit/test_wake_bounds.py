"""How many reads and Slurm changes an upstream's status writes cost through its dependents:
wakes are bounded per namespace and coalesced, never dropped, and so are the Slurm
dependencies changed for them (docs/security.md, "Reads tenants cannot multiply"). Whoever
writes `slurmjobs/status` chooses how often an upstream changes."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from slurmjob_operator.api import patch
from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.controller.dependencies import CHANGES_PER_INTERVAL, Dependencies
from slurmjob_operator.controller.dependentwakes import WAKES_PER_INTERVAL
from slurmjob_operator.core.wakes import WakeQueue

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as _reconcile

N = 200  # dependents of one upstream
WRITES = 10  # status writes on the upstream


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _deps(bed: Bed) -> Dependencies:
    return bed.controller._dependencies


async def _settle(bed: Bed) -> None:
    await asyncio.sleep(0)
    await _deps(bed).drain()


async def _release_all(bed: Bed, clock: Clock) -> int:
    """Move the clock on an interval at a time until no wake waits; how many intervals."""
    intervals = 0
    while len(_deps(bed)._wakes):
        assert intervals < 50, "wakes that wait are never made"
        clock.now += _deps(bed).interval
        _deps(bed).release()
        await _settle(bed)
        intervals += 1
    return intervals


async def _bed(tmp_path: Path) -> tuple[Bed, Clock, ObjectRef, list[ObjectRef]]:
    """`pre` queued as job 100, and N dependents queued behind it (afterok:100), every one
    delivered by the watch and every wake that asked made."""
    bed = make_bed(tmp_path)
    clock = Clock()
    _deps(bed).clock = clock
    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)
    bed.controller.observe_body(bed.store.body(pre))
    deps = [bed.store.create(f"d{i}", cpu_spec(dependsOn=[{"name": "pre"}])) for i in range(N)]
    for _ in range(3):
        for ref in deps:
            await _reconcile(bed, ref)
    assert all(bed.store.status(ref).attempts for ref in deps)
    for ref in [pre, *deps]:
        bed.controller.observe_body(bed.store.body(ref))
    await _settle(bed)
    await _release_all(bed, clock)
    clock.now += 2 * _deps(bed).interval  # every namespace's buckets full again
    return bed, clock, pre, deps


class Reads:
    """The store's GETs, by name."""

    def __init__(self, bed: Bed) -> None:
        self.names: list[str] = []
        real = bed.store.get

        async def get(namespace: str, name: str) -> dict[str, Any] | None:
            self.names.append(name)
            return await real(namespace, name)

        bed.store.get = get  # type: ignore[method-assign]


async def test_status_writes_on_one_upstream_wake_its_dependents_within_the_namespace_budget(
    tmp_path: Path,
) -> None:
    bed, clock, pre, deps = await _bed(tmp_path)
    reads = Reads(bed)
    for k in range(WRITES):
        body = bed.store.body(pre)
        body["status"] = patch.apply(
            body.get("status") or {}, {"nextAttemptAt": f"2030-01-01T00:00:{k:02d}Z"}
        )
        bed.controller.observe_body(body)
        await _settle(bed)
    # Before: 2,000 GETs (every dependent at every write). Now the namespace's wakes: the
    # first write wakes 64, the others wait, once each however many writes follow.
    assert len(reads.names) == WAKES_PER_INTERVAL == 64
    assert len(_deps(bed)._wakes) == N
    last = len(reads.names)
    # Another namespace's dependents are woken at once.
    other = bed.store.create("pre", cpu_spec(), namespace="team-b")
    await _reconcile(bed, other)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]), namespace="team-b")
    bed.controller.observe_body(bed.store.body(post))
    bed.controller.observe_body(bed.store.body(other))
    await _settle(bed)
    assert bed.store.status(post).attempts
    reads.names.clear()
    # Never dropped: every dependent is woken after the last write, 64 per interval.
    assert await _release_all(bed, clock) == 4
    assert Counter(reads.names) == {ref.name: 1 for ref in deps}
    assert last + len(reads.names) == 264  # before: 2,000


async def test_attempt_bumps_on_one_upstream_change_dependencies_within_the_namespace_budget(
    tmp_path: Path,
) -> None:
    bed, clock, pre, deps = await _bed(tmp_path)
    calls0 = len(bed.slurm.calls)
    attempt0 = bed.store.status(pre).attempts[-1].model_dump(by_alias=True, exclude_none=True)
    last = 1 + WRITES
    for k in range(2, last + 1):
        # A "new attempt" of the writer's own, its job id as before.
        body = bed.store.body(pre)
        fake = {**attempt0, "number": k, "jobName": f"x-{k}", "jobId": 100, "confirmed": True}
        body["status"] = {**(body.get("status") or {}), "phase": "Queued", "attempts": [fake]}
        bed.controller.observe_body(body)
        await _settle(bed)
    made = Counter(c.split()[0] for c in bed.slurm.calls[calls0:])
    # Before: 2,000 get_job and 2,000 dependency POSTs. Now 64 dependents are woken and 32
    # of them looked at; the other 32 wait an interval, the rest wait for a wake. Each look
    # reads the dependent's job and the upstream job the writer names, which is not its
    # attempt's (issue 42: another name, another attempt): no dependency is changed.
    assert made == {"get_job": 2 * CHANGES_PER_INTERVAL}
    assert CHANGES_PER_INTERVAL == 32
    await _release_all(bed, clock)
    made = Counter(c.split()[0] for c in bed.slurm.calls[calls0:])
    # Each dependent looked at once more for the last write (the first 32 twice): 232 of
    # each read, none repointed to a job its upstream's attempt does not own.
    assert made == {"get_job": 2 * (32 + N)}
    for ref in deps:
        [record] = bed.store.status(ref).attempts[-1].dependencies or []
        assert record.attempt == 1
    assert last == 1 + WRITES
    assert not len(_deps(bed)._wakes)


async def test_a_dependent_that_waits_is_still_woken_by_its_upstreams_real_change(
    tmp_path: Path,
) -> None:
    bed, clock, pre, deps = await _bed(tmp_path)
    # The namespace's wakes spent by other writes; then pre really ends.
    for k in range(3):
        body = bed.store.body(pre)
        body["status"] = patch.apply(body["status"], {"nextAttemptAt": f"2030-01-01T00:0{k}Z"})
        bed.controller.observe_body(body)
        await _settle(bed)
    # As the operator's fold writes it.
    body = bed.store.body(pre)
    body["status"] = patch.apply(body["status"], {"nextAttemptAt": None, "phase": "Succeeded"})
    reads = Reads(bed)
    bed.controller.observe_body(bed.store.body(pre))
    await _settle(bed)
    await _release_all(bed, clock)
    # Every dependent looked at pre once after it ended, whether its wake waited or not.
    assert Counter(reads.names) == {ref.name: 1 for ref in deps}
    assert not len(_deps(bed)._wakes)


# -- the queue itself ------------------------------------------------------------------------


def test_wakes_are_spent_per_namespace_coalesced_and_given_out_later() -> None:
    queue: WakeQueue[str] = WakeQueue(2, 10.0)
    assert queue.ask("a", "1", "one", 0.0)
    assert queue.ask("a", "2", "two", 0.0)
    assert not queue.ask("a", "3", "three", 0.0)  # spent: it waits
    assert not queue.ask("a", "3", "three", 0.0)  # once
    assert not queue.ask("a", "4", "four", 0.0)
    assert queue.ask("b", "5", "five", 0.0)  # another namespace has its own
    assert len(queue) == 2
    assert queue.due(0.0) == []
    assert queue.next_at(0.0) == 5.0  # one wake more every 5 s
    assert queue.due(5.0) == ["three"]  # oldest first
    assert queue.due(15.0) == ["four"]
    assert len(queue) == 0
    assert queue.next_at(15.0) is None


def test_a_wake_asked_for_later_waits_until_then_and_one_not_wanted_is_dropped() -> None:
    queue: WakeQueue[str] = WakeQueue(64, 10.0)
    assert not queue.ask("a", "1", "one", 0.0, not_before=10.0)
    assert not queue.ask("a", "2", "two", 0.0, not_before=10.0)
    assert queue.next_at(0.0) == 10.0
    assert queue.due(9.0) == []
    assert not queue.ask("a", "1", "one", 9.0)  # asked for now: the earlier time is kept
    assert queue.due(9.0, keep=lambda key: key != "2") == ["one"]
    assert len(queue) == 0
    queue.ask("a", "3", "three", 0.0, not_before=1.0)
    queue.drop("3")
    assert not queue.waiting("3")
