"""The scale bench's allocator sampler (bench/scale/allocstats.py): the run it wraps goes on
unchanged, and each line holds VmRSS and, under jemalloc, jemalloc's own figures; and the lines
drawn of them over a run (bench/scale/allocplot.py; matplotlib itself is the bench's, not the
suite's)."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JEMALLOC = "libjemalloc.so.2"


def _wrapped(tmp_path: Path, env: dict[str, str]) -> list[dict[str, object]]:
    out = tmp_path / "stats"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale.allocstats",
            "timeit",
            "-n",
            "1",
            "-r",
            "1",
            # Until the sampler has written three lines (at most 20 s): a loaded machine
            # cannot make this run end before the sampling has repeated.
            "import glob, os, time",
            "deadline = time.monotonic() + 20",
            "def lines():",
            "    pattern = os.path.join(os.environ['BENCH_ALLOCSTATS'], '*.jsonl')",
            "    return sum(open(f).read().count(chr(10)) for f in glob.glob(pattern))",
            "while lines() < 3 and time.monotonic() < deadline:",
            "    time.sleep(0.02)",
        ],
        cwd=REPO,
        env={
            **os.environ,
            **env,
            "BENCH_ALLOCSTATS": str(out),
            "BENCH_ALLOCSTATS_EVERY": "0.05",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "1 loop" in done.stdout, "the wrapped module ran as its own __main__"
    files = list(out.glob("allocstats-*.jsonl"))
    assert len(files) == 1
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_without_jemalloc_the_lines_hold_rss_only(tmp_path: Path) -> None:
    rows = _wrapped(tmp_path, {"LD_PRELOAD": "", "PYTHONMALLOC": "pymalloc"})
    assert len(rows) >= 3
    assert all(row["rss"] > 0 and "jemalloc" not in row for row in rows)
    assert any(row["python_blocks"] > 0 for row in rows)


def test_under_jemalloc_the_lines_hold_its_figures(tmp_path: Path) -> None:
    if ctypes.util.find_library("jemalloc") is None:
        pytest.skip("libjemalloc2 is not installed (make testbed installs it)")
    rows = _wrapped(tmp_path, {"LD_PRELOAD": JEMALLOC, "PYTHONMALLOC": "malloc"})
    stats = [row["jemalloc"] for row in rows]
    assert len(stats) >= 3
    assert all(isinstance(s, dict) for s in stats)
    for s in stats:
        assert set(s) >= {"allocated", "active", "resident", "mapped", "retained"}
        assert 0 < s["allocated"] <= s["active"] <= s["mapped"]


def test_the_plot_lines_are_megabytes_against_the_runs_own_clock() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.scale import allocplot

    run = {"shape": "live", "n": 12, "marks": {"begin": 1000.0, "steady": 1002.0}}
    samples = [
        {"t": 1001.0, "rss": 200e6, "jemalloc": {"allocated": 100e6, "active": 150e6}},
        {"t": 1003.5, "rss": 210e6},  # no jemalloc figures (another allocator): RSS only
    ]
    assert allocplot.lines(run, samples) == {
        "RSS": [(1.0, 200.0), (3.5, 210.0)],
        "active": [(1.0, 150.0)],
        "allocated": [(1.0, 100.0)],
    }


def test_attach_orders_the_processes_by_start_and_keeps_every_fifth(tmp_path: Path) -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.scale import allocplot

    def write(pid: int, start: float, count: int) -> None:
        lines = [json.dumps({"t": start + i, "rss": i}) for i in range(count)]
        (tmp_path / f"allocstats-{pid}.jsonl").write_text("\n".join(lines) + "\n")

    write(900, 2000.0, 7)  # the restarted process: a lower pid, started later
    write(3100, 1000.0, 11)
    (tmp_path / "allocstats-5.jsonl").write_text("")  # a process killed before its first line
    results: dict[str, object] = {"runs": []}
    allocplot.attach(results, tmp_path)
    stats = results["allocstats"]
    assert isinstance(stats, dict)
    assert list(stats) == ["first process", "restarted process"]
    assert [s["t"] for s in stats["first process"]] == [1000.0, 1005.0, 1010.0]
    assert [s["t"] for s in stats["restarted process"]] == [2000.0, 2005.0]
