"""The log archive's shares (issue 42): one namespace's (or tenant's) deletions never empty the
archive of everyone else. An entry over the per-entry cap is archived cut (each file's end)
with a Warning; the sweep evicts by the share rule (`core.shares`), the owner furthest over
its share first; one owner's entry being read and redacted does not hold up another owner's
finalizer. Real files in tmp_path, the in-memory store's Events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from slurmjob_operator.controller import RetryLater, archiving
from slurmjob_operator.controller.archiving import ArchiveSlots
from slurmjob_operator.core import naming
from slurmjob_operator.core.shares import share_owner
from slurmjob_operator.storage.archive import (
    FILE_MODE,
    RECORD_FILE,
    ArchiveRecord,
    read_record,
)
from slurmjob_operator.storage.archivesweep import sweep

from .controller_fakes import Bed, cpu_spec, make_bed
from .test_controller_storage import submit

DAY = 86400.0
MIB = 1024**2


def plant(
    root: Path,
    namespace: str,
    size: int,
    when: float,
    owner: str | None = "",
    name: str = "train",
) -> str:
    """An entry as the operator writes it (record.json, one log of `size` bytes), without
    the copy: `owner` "" records the namespace's, None records none (the previous release)."""
    uid = str(uuid.uuid4())
    where = root / namespace / uid
    (where / "attempt-1").mkdir(parents=True, mode=0o700)
    (where / "attempt-1" / "stdout.log").write_bytes(b"z" * size)
    record = ArchiveRecord(
        namespace=namespace,
        namespace_uid="ns-uid",
        name=name,
        uid=uid,
        archived_at=when,
        owner=share_owner(namespace, None) if owner == "" else owner,
    )
    (where / RECORD_FILE).write_text(record.model_dump_json(by_alias=True, exclude_none=True))
    os.chmod(where / RECORD_FILE, FILE_MODE)
    return uid


def size(root: Path, namespace: str, uid: str) -> int:
    return sum(p.stat().st_size for p in (root / namespace / uid).rglob("*") if p.is_file())


def left(root: Path, namespace: str) -> set[str]:
    where = root / namespace
    return {p.name for p in where.iterdir()} if where.exists() else set()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    archive = tmp_path / "archive"
    archive.mkdir(mode=0o700)
    return archive


def archive_bed(tmp_path: Path, root: Path, **settings: Any) -> Bed:
    values: dict[str, Any] = {
        "archive_root": root,
        "archive_max_bytes": MIB,
        "archive_file_max_bytes": 64 * 1024,
    }
    values.update(settings)
    return make_bed(tmp_path, **values)


async def delete(bed: Bed, ref: Any) -> None:
    await bed.controller.finalize(bed.store.body(ref))
    del bed.store.objects[(ref.namespace, ref.name)]


async def test_one_deletion_the_size_of_the_archive_leaves_every_other_namespaces_entries(
    tmp_path: Path, root: Path
) -> None:
    """The flood: a job array of 20 tasks printing the file cap each (1.3 MiB, the whole
    archive's 1 MiB and more). Before, it was archived whole and the sweep removed every
    older entry of every namespace; now it is cut to the per-entry cap (1 MiB / 16), each
    file keeping its end, a Warning names the cap, and nobody else's entry goes."""
    bed = archive_bed(tmp_path, root)
    now = time.time()
    others = {
        ns: {plant(root, ns, 20_000, now - DAY + i) for i in range(3)}
        for ns in ("team-b", "team-c", "team-d", "team-e")
    }
    ref = await submit(bed)
    bed.slurm.set_state(100, "RUNNING")
    base = naming.staging_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid, 1)
    for task in range(20):
        lines = b"".join(b"task %02d line %06d\n" % (task, i) for i in range(3500))
        (base / f"stdout-{task}.log").write_bytes(lines)
    await delete(bed, ref)
    await bed.controller.archiver.sweep()
    for namespace, uids in others.items():
        assert left(root, namespace) == uids, f"{namespace} lost entries to the flood"
    record = read_record(root, ref.namespace, ref.uid)
    assert record is not None
    assert record.entry_cap == MIB // 16
    assert record.owner == "namespace:team-a"
    kept = root / ref.namespace / ref.uid / "attempt-1"
    assert sum(p.stat().st_size for p in kept.iterdir()) <= MIB // 16
    for task in range(20):  # every task's tail, not the first tasks whole and the rest none
        assert (
            (kept / f"stdout-{task}.log").read_bytes().endswith(b"task %02d line 003499\n" % task)
        )
    [warning] = [m for t, r, m in bed.store.events if r == "LogsArchiveTruncated"]
    assert ("Warning", "LogsArchiveTruncated", warning) in bed.store.events
    assert str(MIB // 16) in warning
    assert "SLURMJOB_ARCHIVE_ENTRY_MAX_BYTES" in warning


def test_a_namespace_archiving_many_entries_evicts_only_its_own(root: Path) -> None:
    now = time.time()
    quiet = {ns: {plant(root, ns, 50_000, now - 2 * DAY)} for ns in ("team-b", "team-c")}
    flood = [plant(root, "team-a", 60_000, now - DAY + i) for i in range(40)]  # 2.4 MB, newer
    swept = sweep(root, now, 30 * DAY, MIB, floor=MIB // 16)
    for namespace, uids in quiet.items():
        assert left(root, namespace) == uids
    kept = left(root, "team-a")
    assert kept == set(flood[len(flood) - len(kept) :]), "the flooder's oldest go first"
    assert swept.removed == len(flood) - len(kept)
    assert swept.kept_bytes <= MIB


def test_a_tenants_namespaces_share_one_share(root: Path) -> None:
    """Two namespaces of tenant `lab` flood; `other`'s namespace is left whole. Each of
    `lab`'s namespaces alone is under an even share by namespace (three namespaces), so only
    counting them as one owner makes the lab pay."""
    now = time.time()
    lab = "tenant:lab"
    mine = [plant(root, ns, 30_000, now - DAY + i, lab) for i in range(12) for ns in ("a", "b")]
    theirs = {plant(root, "c", 30_000, now - 3 * DAY + i, "tenant:other") for i in range(14)}
    sweep(root, now, 30 * DAY, MIB)
    assert left(root, "c") == theirs
    assert len(left(root, "a") | left(root, "b")) < len(mine)


def test_an_entry_of_the_previous_release_is_swept_as_its_namespaces_owner(root: Path) -> None:
    """team-a's entries record no owner (the previous release); the tenants file says team-a
    is lab's now, as team-x is. So lab (520 KB) is over its share and loses its oldest, the
    unrecorded ones first; by namespace, team-b (240 KB) would have been furthest over."""
    now = float(int(time.time()))
    theirs = {plant(root, "team-b", 40_000, now - 4 * DAY + i, "tenant:other") for i in range(6)}
    for i in range(5):
        plant(root, "team-a", 40_000, now - 3 * DAY + i, owner=None)
    labs = [plant(root, "team-x", 40_000, now - DAY + i, "tenant:lab") for i in range(8)]
    lab = {"team-a": "lab", "team-x": "lab"}
    sweep(root, now, 30 * DAY, 500_000, owner_of=lambda ns: share_owner(ns, lab.get(ns)))
    assert left(root, "team-b") == theirs
    assert left(root, "team-a") == set(), "lab's oldest are its unrecorded entries"
    assert labs[-1] in left(root, "team-x")
    unrecorded = plant(root, "team-a", 10, now, owner=None)
    record = read_record(root, "team-a", unrecorded)
    assert record is not None
    assert record.owner is None


def test_a_thousand_owners_and_one_flood(root: Path) -> None:
    """1,000 namespaces with one entry of about 1,200 bytes each, one with 200: a share of
    capacity / 1,001 each; only the flooder's oldest go. Then everyone is down to one entry
    and still over: a new owner's entry evicts the oldest entry of the largest owner."""
    now = float(int(time.time()))
    ones = {f"ns-{i:04d}": plant(root, f"ns-{i:04d}", 1000, now - DAY + i) for i in range(1000)}
    flood = [plant(root, "flood", 1000, now - DAY + 2000 + i) for i in range(200)]
    held = sum(size(root, ns, uid) for ns, uid in ones.items())
    capacity = held + sum(size(root, "flood", uid) for uid in flood[-40:])
    swept = sweep(root, now, 30 * DAY, capacity, floor=100_000)
    assert all(left(root, ns) == {uid} for ns, uid in ones.items())
    assert left(root, "flood") == set(flood[-40:])
    assert swept.removed == 160
    assert swept.kept_bytes == capacity
    for uid in flood[-40:]:
        _remove(root / "flood" / uid)
    # Everyone at one entry, ns-0007's the largest by one byte; a newcomer needs room.
    big = root / "ns-0007" / ones["ns-0007"] / "attempt-1" / "stdout.log"
    big.write_bytes(b"z" * 1001)
    newcomer = plant(root, "new", 1000, now)
    sweep(root, now, 30 * DAY, held + 1, floor=100_000)
    assert left(root, "new") == {newcomer}
    assert left(root, "ns-0007") == set()
    assert sum(len(left(root, ns)) for ns in ones) == 999


def _remove(path: Path) -> None:
    for child in sorted(path.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()


async def test_a_namespaces_finalizer_does_not_wait_for_anothers_archive(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """team-a's entry is being read and redacted (held here); team-b's deletion archives and
    ends meanwhile. Before, one semaphore for everyone made it wait for team-a's."""
    bed = archive_bed(tmp_path, root)
    release = threading.Event()
    real = archiving.write_entry

    def held(root_: Path, record: ArchiveRecord, *args: Any, **kwargs: Any) -> Any:
        if record.namespace == "team-a":
            release.wait(10)
        return real(root_, record, *args, **kwargs)

    monkeypatch.setattr(archiving, "write_entry", held)
    a = await submit(bed)
    b = bed.store.create("train", cpu_spec(), namespace="team-b")
    with contextlib.suppress(RetryLater):
        await bed.controller.reconcile(b)
    slow = asyncio.create_task(delete(bed, a))
    await asyncio.sleep(0.1)
    try:
        await asyncio.wait_for(delete(bed, b), 5)
        assert not slow.done()
        assert read_record(root, "team-b", b.uid) is not None
    finally:
        release.set()
        await slow
    assert read_record(root, "team-a", a.uid) is not None


async def test_one_owner_writes_one_entry_at_a_time_and_few_owners_at_once() -> None:
    slots = ArchiveSlots(writers=2)
    inside: list[str] = []
    gate = asyncio.Event()

    async def write(owner: str) -> None:
        async with slots.slot(owner):
            inside.append(owner)
            await gate.wait()
            inside.remove(owner)

    tasks = [asyncio.create_task(write(o)) for o in ("a", "a", "b", "c")]
    await asyncio.sleep(0.05)
    assert sorted(inside) == ["a", "b"], "a's second waits on a, c on the two writers"
    gate.set()
    await asyncio.gather(*tasks)
    assert slots.idle


async def test_an_entry_records_its_namespaces_tenant_as_its_owner(
    tmp_path: Path, root: Path
) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n  - {name: lab, namespaces: [team-a, team-b], accounts: [lab],\n"
        "     partitions: [debug]}\n"
    )
    bed = archive_bed(tmp_path, root, tenants_file=tenants)
    ref = await submit(bed)
    await delete(bed, ref)
    record = read_record(root, ref.namespace, ref.uid)
    assert record is not None
    assert record.owner == "tenant:lab"
    assert record.entry_cap is None
    assert "LogsArchiveTruncated" not in bed.store.reasons()
