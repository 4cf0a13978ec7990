"""Removing a checkpoint directory in bounded passes (issue 42): what one pass may do and what
follows it (`core.removal`, table and property), the pass on a real tree (no link followed,
bounded, resumed by the next pass: `storage.removal`, `storage.trash`), the finalizer let go
after its capped passes with a `CheckpointNotRemoved` Event and the sweep finishing the rest,
also after a restart (`controller.removals`)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.logs import LogQuery
from slurmjob_operator.controller.following import read_tails
from slurmjob_operator.controller.logaccess import ClusterFiles, LogAccess
from slurmjob_operator.controller.removals import RemovalSweep
from slurmjob_operator.core import naming
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.removal import (
    After,
    PassBounds,
    PassOutcome,
    after_pass,
    pass_goes_on,
)
from slurmjob_operator.storage import removal, trash
from slurmjob_operator.storage.executors import SIZES, Pool, close_pools, executor
from slurmjob_operator.storage.removal import remove_pass

from .controller_fakes import Bed, make_bed
from .controller_fakes import reconcile_once as reconcile
from .test_controller_storage import submit
from .test_segments_controller import chain, checkpoint_dir

BOUNDS = PassBounds(entries=10, seconds=1.0)


# --- the decisions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("looked_at", "removed", "elapsed", "goes_on"),
    [
        (0, 0, 0.0, True),
        (9, 5, 0.5, True),
        (10, 5, 0.5, False),  # the entries bound
        (3, 2, 1.0, False),  # the time bound, once something went
        (3, 0, 5.0, True),  # nothing went yet: only the entries bound stops it
        (10, 0, 5.0, False),
    ],
)
def test_what_one_pass_may_do(looked_at: int, removed: int, elapsed: float, goes_on: bool) -> None:
    assert pass_goes_on(BOUNDS, looked_at, removed, elapsed) is goes_on


def _outcome(removed: int, *, walked_all: bool = False, done: bool = False) -> PassOutcome:
    return PassOutcome(removed=removed, looked_at=10, walked_all=walked_all, done=done)


@pytest.mark.parametrize(
    ("outcome", "passes", "cap", "after"),
    [
        (_outcome(3, walked_all=True, done=True), 1, 2, After.DONE),
        (_outcome(0, done=True), 5, 2, After.DONE),
        (_outcome(10), 1, 2, After.AGAIN),
        (_outcome(10), 2, 2, After.HAND_OVER),
        (_outcome(10), 50, None, After.AGAIN),  # the sweep has no cap
        (_outcome(0), 1, 2, After.STUCK),  # a whole pass of what cannot go
        (PassOutcome(0, 3, walked_all=False, done=False, changed=True), 1, 2, After.AGAIN),
        (_outcome(4, walked_all=True), 1, 2, After.STUCK),  # all seen, something stays
    ],
)
def test_what_follows_a_pass(
    outcome: PassOutcome, passes: int, cap: int | None, after: After
) -> None:
    assert after_pass(outcome, passes, cap) is after


@given(
    removed=st.integers(0, 100),
    walked_all=st.booleans(),
    done=st.booleans(),
    passes=st.integers(1, 100),
    cap=st.none() | st.integers(1, 100),
    changed=st.booleans(),
)
def test_a_finalizer_s_passes_always_end(
    removed: int, walked_all: bool, done: bool, passes: int, cap: int | None, changed: bool
) -> None:
    """Another pass only while the last one made progress (or the tree changed under it)
    and the cap is not reached: the finalizer's loop ends within `cap` passes whatever the
    tree does."""
    outcome = PassOutcome(removed, 10, walked_all=walked_all, done=done, changed=changed)
    after = after_pass(outcome, passes, cap)
    if after is After.AGAIN:
        assert removed > 0 or changed
        assert not done
        assert not walked_all
        assert cap is None or passes < cap
    if done:
        assert after is After.DONE


# --- one pass on a real tree ------------------------------------------------------------------


def _tree(top: Path, files: int, per_dir: int = 10) -> None:
    for i in range(files):
        sub = top / f"d{i // per_dir}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}").write_bytes(b"x")


def _count(top: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(top)) if top.exists() else 0


def _pass(parent: Path, name: str, bounds: PassBounds = BOUNDS, **kw: Any) -> PassOutcome:
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return remove_pass(fd, name, bounds, **kw)
    finally:
        os.close(fd)


def test_a_pass_is_bounded_and_the_next_one_resumes(tmp_path: Path) -> None:
    _tree(tmp_path / "ckpt", 45)  # 45 files in 5 directories
    before = _count(tmp_path / "ckpt")
    passes = []
    while True:
        outcome = _pass(tmp_path, "ckpt")
        passes.append(outcome)
        assert outcome.looked_at <= BOUNDS.entries
        assert not outcome.problems
        if outcome.done:
            break
        assert after_pass(outcome, len(passes), None) is After.AGAIN
        assert _count(tmp_path / "ckpt") == before - sum(p.removed for p in passes)
    assert not (tmp_path / "ckpt").exists()
    assert len(passes) >= (before + 1) // BOUNDS.entries


def test_a_pass_stops_at_its_time_once_something_went(tmp_path: Path) -> None:
    _tree(tmp_path / "ckpt", 30, per_dir=30)
    ticks = iter(range(1000))
    outcome = _pass(
        tmp_path, "ckpt", PassBounds(entries=1000, seconds=5), clock=lambda: float(next(ticks))
    )
    assert not outcome.done
    assert not outcome.walked_all
    assert 0 < outcome.removed <= 6


def test_a_pass_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _tree(outside, 5)
    top = tmp_path / "ckpt"
    top.mkdir()
    (top / "to-dir").symlink_to(outside)
    (top / "to-file").symlink_to(outside / "d0" / "f0")
    (top / "sub").mkdir()
    (top / "sub" / "deep-link").symlink_to(outside / "d0")
    (tmp_path / "ckpt-link").symlink_to(outside)
    assert _pass(tmp_path, "ckpt").done
    assert _pass(tmp_path, "ckpt-link").done  # the top itself a link: the link goes
    assert _count(outside) == 6  # its directory and five files, all there
    assert not os.path.lexists(tmp_path / "ckpt-link")


def test_a_directory_too_deep_for_a_pass_becomes_an_entry_of_the_trash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(removal, "MAX_DEPTH", 3)
    deep = tmp_path / "ckpt" / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    alone = _pass(tmp_path, "ckpt", PassBounds(entries=100))
    assert not alone.done
    assert alone.problems[0].startswith("ckpt/a/b/c: deeper than 3")
    (tmp_path / "trash").mkdir()
    spill = os.open(tmp_path / "trash", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _pass(tmp_path, "ckpt", PassBounds(entries=100), spill=spill).done
    finally:
        os.close(spill)
    [moved] = os.listdir(tmp_path / "trash")
    assert (tmp_path / "trash" / moved / "d" / "e" / "f").exists()


def test_what_cannot_be_removed_is_said_and_the_pass_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path / "ckpt", 5)
    unlink = os.unlink

    def refusing(path: Any, *args: Any, **kwargs: Any) -> None:
        if path == "f3":
            raise PermissionError(13, "Permission denied")
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refusing)
    outcome = _pass(tmp_path, "ckpt", PassBounds(entries=100), shown="/where/checkpoint")
    assert outcome.problems == ("/where/checkpoint/d0/f3: Permission denied",)
    assert after_pass(outcome, 1, None) is After.STUCK
    assert os.listdir(tmp_path / "ckpt" / "d0") == ["f3"]


# --- the finalizer and the sweep ----------------------------------------------------------------


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path)


async def _chain_with_files(bed: Bed, files: int) -> tuple[Any, Path]:
    ref = bed.store.create("train", chain())
    await reconcile(bed, ref)
    where = checkpoint_dir(bed, ref)
    _tree(where, files)
    return ref, where


async def test_the_finalizer_goes_after_its_passes_and_the_sweep_removes_the_rest(
    bed: Bed,
) -> None:
    ref, where = await _chain_with_files(bed, 100)
    root = bed.settings.storage_root
    sweep = RemovalSweep([root], bounds=BOUNDS, finalizer_passes=2)
    bed.controller.sweep_removals_with(sweep)
    await bed.controller.finalize(bed.store.body(ref))  # returns: the finalizer goes
    [message] = [m for _, r, m in bed.store.events if r == "CheckpointNotRemoved"]
    assert "more than 2 removal passes" in message
    assert "in the background" in message
    assert not where.exists()
    assert not where.parent.exists()
    [entry] = trash.entries(root, 10)
    assert 0 < _count(root / trash.TRASH_DIR / entry) < 110  # 10 directories, 100 files
    while await sweep.sweep_once():  # one pass at a time
        pass
    assert trash.entries(root, 10) == []


async def test_without_a_sweep_the_finalizer_removes_all_of_it(bed: Bed) -> None:
    ref, where = await _chain_with_files(bed, 100)
    await bed.controller.finalize(bed.store.body(ref))
    assert "CheckpointNotRemoved" not in bed.store.reasons()
    assert trash.entries(bed.settings.storage_root, 10) == []
    assert not where.parent.exists()


async def test_after_a_restart_the_sweep_finds_what_was_left_by_listing_the_trash(
    bed: Bed,
) -> None:
    ref, _ = await _chain_with_files(bed, 60)
    root = bed.settings.storage_root
    bed.controller.sweep_removals_with(RemovalSweep([root], bounds=BOUNDS, finalizer_passes=1))
    await bed.controller.finalize(bed.store.body(ref))
    assert trash.entries(root, 10)
    # A new process: nothing of the old sweep is kept, the trash is all there is.
    restarted = RemovalSweep([root], bounds=BOUNDS, interval=0.01)
    task = asyncio.create_task(restarted.run())
    try:
        for _ in range(500):
            if not trash.entries(root, 10):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the restarted sweep did not remove what was left")
    finally:
        task.cancel()


async def test_the_sweep_leaves_a_stuck_entry_and_goes_on_with_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trash.opened(tmp_path, make=True):
        pass
    _tree(tmp_path / trash.TRASH_DIR / "a-stuck", 3)
    (tmp_path / trash.TRASH_DIR / "a-stuck" / "d0" / "kept").write_bytes(b"x")
    _tree(tmp_path / trash.TRASH_DIR / "b-fine", 3)
    unlink = os.unlink

    def refusing(path: Any, *args: Any, **kwargs: Any) -> None:
        if path == "kept":
            raise PermissionError(13, "Permission denied")
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refusing)
    sweep = RemovalSweep([tmp_path], bounds=PassBounds(entries=100))
    while await sweep.sweep_once():
        pass
    assert trash.entries(tmp_path, 10) == ["a-stuck"]
    assert sweep.stuck == {(tmp_path, "a-stuck")}


def test_the_trash_is_the_operator_s_own(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / trash.TRASH_DIR).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="symbolic link"):
        trash.entries(tmp_path, 10)


async def test_a_trash_that_is_not_the_operator_s_is_not_used(bed: Bed) -> None:
    """A link planted where the trash goes: nothing is moved through it, the checkpoint
    directory is removed where it is."""
    ref, where = await _chain_with_files(bed, 20)
    elsewhere = bed.settings.storage_root.parent / "elsewhere"
    elsewhere.mkdir()
    (bed.settings.storage_root / trash.TRASH_DIR).symlink_to(elsewhere)
    await bed.controller.finalize(bed.store.body(ref))
    assert not where.parent.exists()
    assert list(elsewhere.iterdir()) == []
    assert "CheckpointNotRemoved" not in bed.store.reasons()


@pytest.fixture
def held() -> Iterator[threading.Event]:
    """Every thread of the removals and archive pools busy until the test lets them go."""
    release = threading.Event()
    kinds = (Pool.REMOVALS, Pool.ARCHIVE)
    futures = [executor(k).submit(release.wait) for k in kinds for _ in range(SIZES[k])]
    yield release
    release.set()
    for future in futures:
        future.result()
    close_pools()


async def test_the_log_api_and_the_status_tails_never_wait_behind_removals_or_archives(
    bed: Bed, held: threading.Event
) -> None:
    ref = await submit(bed)
    base = naming.staging_dir(bed.settings.storage_root, ref.namespace, ref.name, ref.uid, 1)
    (base / "stdout.log").write_text("epoch 1\n")
    files = {"default": ClusterFiles(bed.settings, lambda namespace: None)}
    access = LogAccess(bed.store, files, Clusters(("default",)))
    async with asyncio.timeout(2):  # under READ_TIMEOUT: a queued read would wait it out
        answer = await access.read(ref.namespace, ref.name, LogQuery())
        tails = await read_tails(bed.settings, base, [], None)
    assert answer.text == "epoch 1\n"
    assert tails is not None
    assert tails.stdout is not None
    assert tails.stdout.tail == "epoch 1\n"
    assert not held.is_set()
