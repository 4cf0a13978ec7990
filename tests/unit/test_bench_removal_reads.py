"""A small run of `bench/removal_reads.py` (issue 42): another tenant's log reads are
answered while every thread of the removals pool is held by a removal (the structure, not a
timing), and the operator's path removes a tree while reads go on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.removal_reads import measure, reads_while_removals_blocked

from slurmjob_operator.storage.executors import close_pools


@pytest.fixture(autouse=True)
def fresh_pools() -> Iterator[None]:
    yield
    close_pools()


def _checkpoints(root: Path) -> list[Path]:
    return list(root.glob("team-a/*/checkpoint"))


async def test_log_reads_never_wait_behind_removals(tmp_path: Path) -> None:
    answered, left = await reads_while_removals_blocked(tmp_path, files=1_000, reads=5)
    # Every read answered while the removal could not start: no log read waits for it.
    assert (answered, left) == (5, 1_000)
    assert not _checkpoints(tmp_path)  # and it ran once let go


async def test_the_operator_s_removal_goes_on_beside_the_reads(tmp_path: Path) -> None:
    figures = await measure(tmp_path, "operator", files=1_000, deletions=2)
    assert figures.reads >= 1
    assert figures.timeouts == 0
    assert figures.max_ms >= figures.p99_ms >= figures.p50_ms > 0
