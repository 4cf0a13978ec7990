"""How many apiserver reads dependents cost: upstreams come from what the watch delivered,
and what it has not is read within a budget per namespace (docs/security.md, "Reads
tenants cannot multiply"). The rules themselves are in test_dependencies.py."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.api.status import Phase
from slurmjob_operator.controller import Controller, RetryLater
from slurmjob_operator.controller.dependencies import READS_PER_INTERVAL
from slurmjob_operator.controller.fleet import Fleet
from slurmjob_operator.core.budget import Bucket, take
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.metrics import Metrics

from .controller_fakes import (
    Bed,
    MemorySlurm,
    MemoryStore,
    StubToken,
    cpu_spec,
    make_bed,
    make_settings,
)
from .controller_fakes import reconcile_once as _reconcile


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counted:
    """The store's GETs, by (namespace, name)."""

    def __init__(self, store: MemoryStore) -> None:
        self.reads: list[tuple[str, str]] = []
        real = store.get

        async def get(namespace: str, name: str) -> dict[str, Any] | None:
            self.reads.append((namespace, name))
            return await real(namespace, name)

        store.get = get  # type: ignore[method-assign]

    def of(self, names: set[str]) -> int:
        return sum(1 for _, name in self.reads if name in names)

    def besides(self, names: set[str]) -> int:
        return sum(1 for _, name in self.reads if name not in names)


def _bed(tmp_path: Path) -> tuple[Bed, Clock, Counted]:
    bed = make_bed(tmp_path)
    clock = Clock()
    bed.controller._dependencies.clock = clock
    return bed, clock, Counted(bed.store)


def _notice(bed: Bed, *refs: ObjectRef) -> None:
    for ref in refs:
        bed.controller.observe_body(bed.store.body(ref))


async def _settle(bed: Bed) -> None:
    await asyncio.sleep(0)
    await bed.controller._dependencies.drain()


def _ready(bed: Bed, ref: ObjectRef) -> str:
    ready = next(c for c in bed.store.status(ref).conditions if c.type == "Ready")
    return ready.message or ""


async def test_eighty_waiting_dependents_read_their_upstreams_from_the_watch(
    tmp_path: Path,
) -> None:
    bed, _, counted = _bed(tmp_path)
    # A chain d0 <- d1 <- ... <- d79 <- seed (no such SlurmJob): each resolution walks the
    # chain (64 SlurmJobs at most, the cycle search) and waits.
    refs = [
        bed.store.create(f"d{i}", cpu_spec(dependsOn=[{"name": f"d{i + 1}" if i < 79 else "seed"}]))
        for i in range(80)
    ]
    names = {r.name for r in refs}
    _notice(bed, *refs)  # the watch's first list: each dependent is woken by its upstream
    await _settle(bed)
    assert counted.reads.count(("team-a", "seed")) == 1  # found missing, then remembered
    for _ in range(2):  # each 50 s by default, besides being woken
        counted.reads.clear()
        for ref in refs:
            assert await _reconcile(bed, ref) is not None
        # Each dependent's own read (a write is decided on a fresh one) stays.
        assert counted.of(names) == 80
        # Before: 3,104 reads of upstreams per round (3,184 in all).
        assert counted.besides(names) == 0
        _notice(bed, *refs)
    assert _ready(bed, refs[0]) == "waiting for dependencies: SlurmJob d1 is Pending"
    assert _ready(bed, refs[79]) == "waiting for dependencies: SlurmJob seed does not exist"


async def test_reads_the_watch_has_not_delivered_are_bounded_per_namespace(
    tmp_path: Path,
) -> None:
    bed, clock, counted = _bed(tmp_path)
    # 80 dependents naming 16 SlurmJobs each, none of which exists: nothing to deliver.
    refs = [
        bed.store.create(f"w{i}", cpu_spec(dependsOn=[{"name": f"m{i}-{k}"} for k in range(16)]))
        for i in range(80)
    ]
    names = {r.name for r in refs}
    _notice(bed, *refs)
    await _settle(bed)
    counted.reads.clear()
    for ref in refs:
        await _reconcile(bed, ref)
    # Before: 1,280 reads of upstreams in one round.
    assert counted.besides(names) == READS_PER_INTERVAL
    assert _ready(bed, refs[0]) == (
        "waiting for dependencies: SlurmJob m0-0 does not exist; SlurmJob m0-1 does not exist; "
        "SlurmJob m0-2 does not exist; SlurmJob m0-3 does not exist; SlurmJob m0-4 does not "
        "exist; SlurmJob m0-5 does not exist; SlurmJob m0-6 does not exist; SlurmJob m0-7 does "
        "not exist; SlurmJob m0-8 does not exist; SlurmJob m0-9 does not exist; SlurmJob m0-10 "
        "does not exist; SlurmJob m0-11 does not exist; SlurmJob m0-12 does not exist; "
        "SlurmJob m0-13 does not exist; SlurmJob m0-14 does not exist; SlurmJob m0-15 does "
        "not exist"
    )
    assert "SlurmJob m79-0 is not read yet" in _ready(bed, refs[79])
    # Another namespace has reads of its own.
    pre = bed.store.create("pre", cpu_spec(), namespace="team-b")
    await _reconcile(bed, pre)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]), namespace="team-b")
    await _reconcile(bed, post)
    assert bed.store.status(post).phase is Phase.QUEUED
    # Within the interval, team-a reads nothing more; after it, as many again at most.
    counted.reads.clear()
    for ref in refs:
        await _reconcile(bed, ref)
    assert counted.besides(names) == 0
    clock.now += bed.controller._dependencies.interval
    for ref in refs:
        await _reconcile(bed, ref)
    assert counted.besides(names) == READS_PER_INTERVAL


async def test_an_unread_upstream_the_watch_delivers_wakes_its_dependent(tmp_path: Path) -> None:
    bed, _, counted = _bed(tmp_path)
    spender = bed.store.create(
        "spender", cpu_spec(dependsOn=[{"name": f"m{k}"} for k in range(16)])
    )
    hogs = [
        bed.store.create(f"h{i}", cpu_spec(dependsOn=[{"name": f"x{i}-{k}"} for k in range(16)]))
        for i in range(3)
    ]
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    _notice(bed, spender, *hogs, post)
    await _settle(bed)
    for ref in (spender, *hogs):
        await _reconcile(bed, ref)  # 64 reads: the namespace's reads are spent
    assert await _reconcile(bed, post) is not None
    assert _ready(bed, post) == (
        "waiting for dependencies: SlurmJob pre is not read yet (too many reads in the namespace)"
    )
    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)  # job 100
    counted.reads.clear()
    _notice(bed, pre)
    await _settle(bed)  # post is woken, and reads pre from the watch's copy
    assert ("team-a", "pre") not in counted.reads
    [attempt] = bed.store.status(post).attempts
    assert bed.slurm.dependency[attempt.job_id or 0] == "afterok:100"


async def test_a_watched_upstream_of_another_namespace_is_never_used(tmp_path: Path) -> None:
    bed, _, counted = _bed(tmp_path)
    other = bed.store.create("pre", cpu_spec(), namespace="team-b")
    await _reconcile(bed, other)
    _notice(bed, other)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    counted.reads.clear()
    assert await _reconcile(bed, post) is not None
    assert _ready(bed, post) == "waiting for dependencies: SlurmJob pre does not exist"
    assert ("team-b", "pre") not in counted.reads
    assert ("team-a", "pre") in counted.reads


async def test_a_deleted_upstream_and_one_made_under_its_name_keep_the_uid_check(
    tmp_path: Path,
) -> None:
    bed, _, counted = _bed(tmp_path)
    pre = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, pre)  # job 100
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    await _reconcile(bed, post)  # job 101, afterok:100
    _notice(bed, pre, post)
    old = bed.store.body(pre)
    del bed.store.objects[("team-a", "pre")]
    new = bed.store.create("pre", cpu_spec())
    await _reconcile(bed, new)  # job 102
    # The new one's event before the old one's deletion (two objects' events need not come in
    # order): the late deletion leaves the new one known.
    _notice(bed, new)
    bed.controller.observe_body(old, deleted=True)
    await _settle(bed)
    counted.reads.clear()
    await bed.controller.reconcile(post, bed.store.body(post))
    assert ("team-a", "pre") not in counted.reads  # known from the watch
    # Another SlurmJob under the name (another uid): the dependent's job is not repointed.
    assert bed.slurm.dependency[101] == "afterok:100"
    assert not any("dependency 101" in call for call in bed.slurm.calls)


async def test_a_deleted_upstream_is_missing_without_a_read(tmp_path: Path) -> None:
    bed, _, counted = _bed(tmp_path)
    pre = bed.store.create("pre", cpu_spec())
    _notice(bed, pre)
    body = bed.store.body(pre)
    del bed.store.objects[("team-a", "pre")]
    bed.controller.observe_body(body, deleted=True)
    post = bed.store.create("post", cpu_spec(dependsOn=[{"name": "pre"}]))
    assert await _reconcile(bed, post) is not None
    assert _ready(bed, post) == "waiting for dependencies: SlurmJob pre does not exist"
    assert ("team-a", "pre") not in counted.reads


# -- several clusters: an upstream on another cluster ------------------------------------


async def test_an_upstream_on_another_cluster_is_watched_and_wakes_its_dependent(
    tmp_path: Path,
) -> None:
    clusters = Clusters(("east", "west"))
    store = MemoryStore()
    slurm = {"east": MemorySlurm(), "west": MemorySlurm()}
    slurm["west"].next_id = 500
    members = [
        Controller(
            make_settings(tmp_path / name, cluster_name=name),
            store,
            None,  # type: ignore[arg-type]  # the in-memory Slurm replaces the transport
            Metrics(),
            token=StubToken(),  # type: ignore[arg-type]
            link=slurm[name],  # type: ignore[arg-type]
            clusters=clusters,
        )
        for name in clusters.names
    ]
    fleet = Fleet(members, clusters)
    east, west = members
    counted = Counted(store)

    async def reconcile(ref: ObjectRef) -> None:
        with contextlib.suppress(RetryLater):
            await fleet.reconcile(ref, store.body(ref))

    pre = store.create("pre", {**cpu_spec(), "cluster": "west"})
    await reconcile(pre)
    await reconcile(pre)  # queued on west as job 500
    post = store.create("post", {**cpu_spec(), "dependsOn": [{"name": "pre"}]})
    fleet.observe_body(store.body(post))
    fleet.observe_body(store.body(pre))  # post is woken: it waits
    await asyncio.sleep(0)
    await east._dependencies.drain()
    counted.reads.clear()
    await reconcile(post)  # on east: waits, no Slurm dependency across clusters
    assert ("team-a", "pre") not in counted.reads  # east knows it from the watch
    assert store.status(post).attempts == []
    slurm["west"].set_state(500, "COMPLETED", 0)
    item = next(t for t in west.followed() if t.ref == pre)
    await west.refresh(item, await slurm["west"].get_job(500))
    assert store.status(pre).phase is Phase.SUCCEEDED
    counted.reads.clear()
    fleet.observe_body(store.body(pre))
    await asyncio.sleep(0)
    await east._dependencies.drain()
    # Before: east took the other cluster's SlurmJob for deleted, was not woken by its
    # change, and read it from the apiserver at every look.
    [attempt] = store.status(post).attempts
    assert attempt.cluster == "east"
    assert ("team-a", "pre") not in counted.reads


# -- the budget ------------------------------------------------------------------------------


def test_a_bucket_allows_its_capacity_at_once_and_fills_again_over_the_interval() -> None:
    bucket: Bucket | None = None
    allowed = 0
    for _ in range(100):
        ok, bucket = take(bucket, 0.0, 64, 50.0)
        allowed += ok
    assert allowed == 64
    ok, bucket = take(bucket, 25.0, 64, 50.0)  # half the interval: 32 more
    assert ok
    assert bucket.tokens == pytest.approx(31)
    ok, bucket = take(bucket, 10.0, 64, 50.0)  # a clock that went back fills nothing
    assert ok
    assert bucket.tokens == pytest.approx(30)
    _, full = take(bucket, 1e9, 64, 50.0)
    assert full.tokens == 63
