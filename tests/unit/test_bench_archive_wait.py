"""The archive-wait bench (bench/archive_wait.py) at a small size: in the design before, one
slot for everyone, no deletion of namespace B ends while A's entry is written; in the design
now, B's deletion that starts with A's entry ends before it."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.archive_wait import bench  # noqa: E402


async def test_b_overtakes_a_only_with_one_writer_per_owner(tmp_path: Path) -> None:
    result = await bench(entry_mib=16, rounds=1, per_round=3, workdir=tmp_path)
    before, after = result["before"], result["after"]
    assert len(before["b_waits"]) == len(after["b_waits"]) == 3
    assert before["b_overtook"] == 0, "one slot for everyone: B waits for all of A's entry"
    assert after["b_overtook"] >= 1, "the B that started with A's entry ends first"
    assert after["b_p99"] < after["a_median"]
    assert result["entry_bytes"] == 16 * 1024**2
