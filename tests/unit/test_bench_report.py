"""The scale bench's report (bench/scale/report.py) over repeated runs: medians per figure, the
throughput ratio per repeat and its median, the order of the operators in each repeat."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scale import report  # noqa: E402
from bench.scale.__main__ import order, parse  # noqa: E402


def _run(kind: str, repeat: int, per_second: float, rss: float) -> dict[str, Any]:
    return {
        "operator": kind,
        "shape": "live",
        "n": 1000,
        "repeat": repeat,
        "rss_peak": rss,
        "submit": {"per_second": per_second},
    }


def _results(*runs: dict[str, Any]) -> dict[str, Any]:
    return {"runs": list(runs)}


def test_ratios_pair_the_runs_of_one_repeat() -> None:
    results = _results(
        _run("baseline", 0, 60.0, 100e6),
        _run("operator", 0, 45.0, 200e6),
        _run("operator", 1, 30.0, 210e6),  # the order swapped: the operator first
        _run("baseline", 1, 60.0, 101e6),
        _run("baseline", 2, 50.0, 102e6),
        _run("operator", 2, 40.0, 190e6),
    )
    assert report.submit_ratios(results, 1000, "live") == [0.75, 0.5, 0.8]
    assert report.submit_ratios(results, 1000, "backlog") == []


def test_median_is_a_measured_figure() -> None:
    runs = [_run("operator", i, v, 0) for i, v in enumerate((40.0, 30.0, 45.0, 50.0))]
    # An even count gives the lower middle, one of the runs, not the mean of two.
    assert report._median(runs, ("submit", "per_second")) == 40.0
    assert report._median(runs[:3], ("submit", "per_second")) == 40.0
    assert report._median(runs, ("steady", "rss_median")) is None


def test_table_gives_medians_and_the_median_ratio() -> None:
    results = _results(
        _run("baseline", 0, 60.0, 100e6),
        _run("operator", 0, 45.0, 200e6),
        _run("operator", 1, 30.0, 300e6),
        _run("baseline", 1, 60.0, 101e6),
        _run("baseline", 2, 50.0, 102e6),
        _run("operator", 2, 40.0, 190e6),
    )
    text = report.table(results)
    assert "median of 3 runs each" in text
    assert "| RSS peak | 101.0 MB | 200.0 MB (2.0x more) |" in text
    assert "| apply → Submitted, per s | 60.0/s | 40.0/s (0.67x) |" in text
    assert "0.75 / 0.50 / 0.80; median **0.75x**" in text


def test_one_run_each_reads_as_before() -> None:
    results = _results(_run("baseline", 0, 60.0, 100e6), _run("operator", 0, 45.0, 200e6))
    text = report.table(results)
    assert "median of" not in text
    assert "per run" not in text
    assert "| apply → Submitted, per s | 60.0/s | 45.0/s (0.75x) |" in text


def test_every_second_repeat_swaps_the_order() -> None:
    assert order(["baseline", "operator"], 0) == ["baseline", "operator"]
    assert order(["baseline", "operator"], 1) == ["operator", "baseline"]
    assert order(["baseline", "operator"], 2) == ["baseline", "operator"]


def test_repeats_default_and_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_REPEATS", raising=False)
    assert parse([]).repeats == 3
    monkeypatch.setenv("BENCH_REPEATS", "1")
    assert parse([]).repeats == 1
    with pytest.raises(SystemExit) as refused:
        parse(["--repeats=0"])
    assert refused.value.code == 2
