"""Submits parked while every slot is taken (`FairLimiter.park`): the watch's handler returns
at once and the submit waits as the uid and the watch's copy, no task and no kopf handler;
granted a slot, it runs as a wake. What must hold: each SlurmJob is sent once, the slots and
round-robin still bound and order the burst, no GET is made for a parked create, and whatever
changed while it waited (suspended, deleted, the service closed) wins."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.core.kueue.workload import QUEUE_LABEL

from .controller_fakes import Bed, cpu_spec, make_bed


def watched(bed: Bed, ref: object) -> dict[str, object]:
    """The resource as the watch delivers it to a handler."""
    return copy.deepcopy(bed.store.body(ref))  # type: ignore[arg-type]


async def test_a_burst_of_watched_creates_parks_and_each_is_sent_once(tmp_path: Path) -> None:
    """30 SlurmJobs of namespace a, then one of b, each delivered by the watch with the POST
    slowed and 2 slots: the handlers return without waiting for a slot, at most 2 submits run
    at once, b's is not behind a's backlog, every one is sent once, and no GET is made."""
    bed = make_bed(tmp_path, submit_concurrency=2)
    bed.slurm.submit_delay = 0.01
    refs = [bed.store.create(f"many-{i}", cpu_spec(), namespace="a") for i in range(30)]
    lonely = bed.store.create("lonely", cpu_spec(), namespace="b")
    slots = bed.controller.submit_slots
    gets = bed.store.gets
    handlers = asyncio.gather(
        *(bed.controller.reconcile(ref, watched(bed, ref)) for ref in [*refs, lonely])
    )
    await asyncio.wait_for(handlers, 5)
    assert slots.waiting >= 20, "the handlers returned while their submits still waited"
    await asyncio.wait_for(bed.controller.wakes.drain(), 10)
    assert bed.slurm.max_submitting == 2
    assert sorted(bed.slurm.submitted) == sorted(set(bed.slurm.submitted))
    assert len(bed.slurm.submitted) == 31
    position = next(i for i, name in enumerate(bed.slurm.submitted) if "-lonely-" in name)
    assert position <= 4, bed.slurm.submitted[:6]
    assert bed.store.gets == gets, "a parked create is submitted from the watch's copy"
    assert slots.waiting == slots.held == 0
    assert all(bed.store.status(ref).phase is Phase.QUEUED for ref in [*refs, lonely])


async def test_what_changed_while_parked_wins(tmp_path: Path) -> None:
    """Parked behind a held slot: one SlurmJob suspended, one deleted (its finalizer does not
    wait behind the queue), one parked twice with a newer copy: only the last is sent, once."""
    bed = make_bed(tmp_path, submit_concurrency=1)
    suspended = bed.store.create("suspended", cpu_spec())
    deleted = bed.store.create("deleted", cpu_spec())
    twice = bed.store.create("twice", cpu_spec())
    slots = bed.controller.submit_slots
    async with slots.slot("elsewhere"):
        for ref in (suspended, deleted, twice):
            await asyncio.wait_for(bed.controller.reconcile(ref, watched(bed, ref)), 1)
        bed.store.touch(twice, team="x")  # a user's label edit: a newer copy
        await asyncio.wait_for(bed.controller.reconcile(twice, watched(bed, twice)), 1)
        assert slots.waiting == 3
        bed.store.update(suspended, suspend=True)
        version = bed.store.body(deleted)["metadata"]["resourceVersion"]
        assert await bed.store.delete_slurmjob(deleted, version)
        await asyncio.wait_for(bed.controller.finalize(bed.store.body(deleted)), 1)
    await asyncio.wait_for(bed.controller.wakes.drain(), 5)
    assert len(bed.slurm.submitted) == 1
    assert "-twice-" in bed.slurm.submitted[0]
    condition = get_condition(bed.store.status(suspended).conditions, "Suspended")
    assert condition is not None
    assert condition.reason == "Suspended"
    assert bed.store.status(deleted).attempts == []
    assert slots.waiting == slots.held == 0


async def test_a_closed_service_drops_its_parked_submits_and_frees_the_slots(
    tmp_path: Path,
) -> None:
    """Leadership lost or a stop: the wakes close, the parked submits are never sent, and no
    slot stays taken for them (the next holder is served at once)."""
    bed = make_bed(tmp_path, submit_concurrency=1)
    refs = [bed.store.create(f"parked-{i}", cpu_spec()) for i in range(3)]
    slots = bed.controller.submit_slots
    async with slots.slot("elsewhere"):
        for ref in refs:
            await bed.controller.reconcile(ref, watched(bed, ref))
        assert slots.waiting == 3
        await bed.controller.wakes.close()
    assert (slots.waiting, slots.held) == (0, 0)
    assert bed.slurm.submitted == []
    assert all(bed.store.status(ref).attempts == [] for ref in refs)


async def test_a_handler_whose_submit_needs_a_fresh_read_parks_too(tmp_path: Path) -> None:
    """A SlurmJob the watch's copy cannot settle (a Kueue queue label: decided on a fresh
    read) waits parked as well when every slot is taken: its handler returns at once, and the
    submit is made once, from a fresh read, when the slot frees."""
    bed = make_bed(tmp_path, submit_concurrency=1)
    ref = bed.store.create("queued", cpu_spec())
    bed.store.touch(ref, **{QUEUE_LABEL: "team-queue"})
    slots = bed.controller.submit_slots
    async with slots.slot("elsewhere"):
        await asyncio.wait_for(bed.controller.reconcile(ref, watched(bed, ref)), 1)
        assert slots.waiting == 1
        assert bed.slurm.submitted == []
    await asyncio.wait_for(bed.controller.wakes.drain(), 5)
    assert len(bed.slurm.submitted) == 1
    assert bed.store.status(ref).phase is Phase.QUEUED
    assert slots.waiting == slots.held == 0
