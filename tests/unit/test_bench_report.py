"""The scale bench's report (bench/scale/report.py) over repeated runs: medians per figure, the
throughput ratio per repeat and its median, the order of the operators in each repeat; and the
merge of several invocations' results (bench/scale/merging.py), only of the same code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scale import merging, report  # noqa: E402
from bench.scale.__main__ import order, parse  # noqa: E402
from bench.scale.scenario import _own_live, holds_cpus  # noqa: E402

from slurmjob_operator.core.jobview import SlurmJobView, normalise_state  # noqa: E402


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


def test_ratio_rows_by_size_live_first() -> None:
    results = _results(
        {**_run("baseline", 0, 50.0, 1), "n": 5000},
        {**_run("operator", 0, 40.0, 1), "n": 5000},
        {**_run("baseline", 0, 60.0, 1), "shape": "backlog"},
        {**_run("operator", 0, 30.0, 1), "shape": "backlog"},
        _run("baseline", 0, 60.0, 1),
        _run("operator", 0, 45.0, 1),
        {**_run("operator", 0, 45.0, 1), "n": 10000},  # no baseline: no ratio
    )
    assert report.ratio_rows(results) == [
        ("1,000 live", [0.75]),
        ("1,000 backlog", [0.5]),
        ("5,000 live", [0.8]),
    ]


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


TREES = {"operator": "a1", "templates": "b2", "bench": "c3"}


def _part(*runs: dict[str, Any], trees: dict[str, str] = TREES, dirty: bool = False) -> Any:
    return {
        "started": "2026-12-06 02:33 UTC",
        "command": "python -m bench.scale",
        "machine": "2 CPUs",
        "slurm": "26.05.5",
        "interval": 10.0,
        "source": {"commit": "f00", "trees": dict(trees), "dirty": dirty},
        "runs": list(runs),
    }


def test_merge_numbers_the_repeats_again() -> None:
    one = _part(_run("baseline", 0, 60.0, 1), _run("operator", 0, 45.0, 1))
    one |= {"note": "part one; part two to come", "options": {"sizes": [1000]}}
    two = _part(_run("operator", 0, 30.0, 1), _run("baseline", 0, 60.0, 1))
    merged = merging.merge([("one", one), ("two", two)])
    assert [(r["operator"], r["repeat"]) for r in merged["runs"]] == [
        ("baseline", 0),
        ("operator", 0),
        ("operator", 1),
        ("baseline", 1),
    ]
    assert report.submit_ratios(merged, 1000, "live") == [0.75, 0.5]
    assert merged["parts"] == ["one", "two"]
    assert merged["source"] == {"commits": ["f00"], "trees": TREES, "dirty": False}
    # The first part's note and options are its own, not the merged document's.
    assert "note" not in merged
    assert "options" not in merged
    assert merged["part_records"] == {
        "one": {"note": "part one; part two to come", "options": {"sizes": [1000]}},
        "two": {},
    }
    # A merged document merges again with a part of the same code.
    again = merging.merge([("merged", merged), ("three", one)])
    assert [r["repeat"] for r in again["runs"]][-2:] == [2, 2]
    assert list(again["part_records"]) == ["one", "two", "three"]


def test_merge_refuses_other_or_unknown_code() -> None:
    ours = _part(_run("operator", 0, 45.0, 1))
    cases = {
        "other code": _part(trees={**TREES, "operator": "zz"}),
        "with changes": _part(dirty=True),
        "no record": {k: v for k, v in ours.items() if k != "source"},
        "a tree missing": _part(trees={"operator": "a1", "templates": "b2"}),
        "another machine": {**ours, "machine": "64 CPUs"},
    }
    for case, part in cases.items():
        with pytest.raises(merging.MergeRefused):
            merging.merge([("ours", ours), (case, part)])
    with pytest.raises(merging.MergeRefused):
        merging.merge([])


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_provenance_records_trees_and_changes(tmp_path: Path) -> None:
    assert merging.provenance(tmp_path) is None  # not a checkout
    for path in ("operator/x.py", "templates/t.j2", "bench/b.py", "README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "c")
    clean = merging.provenance(tmp_path)
    assert clean is not None
    assert clean["dirty"] is False
    assert all(clean["trees"][path] for path in merging.MEASURED)
    (tmp_path / "README.md").write_text("2\n")  # not a measured path
    assert merging.provenance(tmp_path) == clean
    (tmp_path / "bench" / "new.py").write_text("untracked\n")
    assert merging.provenance(tmp_path)["dirty"] is True  # type: ignore[index]
    (tmp_path / "bench" / "new.py").unlink()
    (tmp_path / "operator" / "x.py").write_text("2\n")
    changed = merging.provenance(tmp_path)
    assert changed is not None
    assert changed["dirty"] is True
    assert changed["trees"] == clean["trees"]  # HEAD's trees: the change is what dirty says


@pytest.mark.parametrize(
    ("state", "holds"),
    [
        (["PENDING"], False),
        (["RUNNING"], True),
        (["SUSPENDED"], True),
        (["CANCELLED", "COMPLETING"], True),
        (["COMPLETED", "COMPLETING"], True),
        (["CANCELLED"], False),
        (["COMPLETED"], False),
    ],
)
def test_the_clean_up_waits_for_every_job_that_holds_cpus(state: list[str], holds: bool) -> None:
    """A job cancelled but still COMPLETING holds its nodes though its base state is final:
    the bench's clean-up waits for it too (it reads other users' jobs, never cancels them)."""
    base, flags = normalise_state(state)
    job = SlurmJobView(job_id=7, raw_state=tuple(state), base_state=base, flags=flags)
    assert holds_cpus(job) is holds


@pytest.mark.parametrize(
    ("name", "user", "state", "own"),
    [
        ("sj-bench-scale-op-live-00001", "bench", ["RUNNING"], True),
        ("sj-bench-scale-op-live-00001", "bench", ["PENDING"], True),
        ("sj-bench-scale-op-live-00001", "bench", ["COMPLETED"], False),
        # Another user's job that borrows the bench's name is never cancelled by it.
        ("sj-bench-scale-op-live-00001", "alice", ["RUNNING"], False),
        ("sj-bench-scale-op-live-00001", None, ["RUNNING"], False),
        ("sj-team-a-train", "bench", ["RUNNING"], False),
        ("xsj-bench-scale-1", "bench", ["RUNNING"], False),
    ],
)
def test_the_bench_cancels_only_its_own_users_live_bench_jobs(
    name: str, user: str | None, state: list[str], own: bool
) -> None:
    """What the clean-up and the cancels act on (`own_live_jobs`): its own user's live jobs
    named sj-bench-scale-*; a name alone, as anyone can give a job, is not enough."""
    base, flags = normalise_state(state)
    job = SlurmJobView(
        job_id=7, raw_state=tuple(state), base_state=base, flags=flags, name=name, user=user
    )
    ctx = SimpleNamespace(slurm_user="bench")
    assert _own_live(ctx, job) is own  # type: ignore[arg-type]


def test_rss_panels_split_the_operators_and_keep_one_colour_per_size_and_shape() -> None:
    def run(kind: str, n: int, shape: str, repeat: int = 0) -> dict[str, Any]:
        return {
            "operator": kind,
            "shape": shape,
            "n": n,
            "repeat": repeat,
            "rss_series": [[0.0, 100e6], [1.0, 2e9 if kind == "baseline" else 300e6]],
        }

    results = _results(
        run("operator", 1000, "backlog"),  # in another order than the baseline's
        run("baseline", 1000, "live"),
        run("baseline", 1000, "backlog"),
        run("operator", 1000, "live"),
        run("operator", 1000, "live", repeat=1),  # a later repeat: not drawn
        run("baseline", 5000, "live"),
        {**run("operator", 5000, "live"), "rss_series": []},  # nothing sampled: no line
    )
    panels = report.rss_panels(results)
    assert [label for label, *_ in panels["baseline"]] == [
        "live N=1,000",
        "backlog N=1,000",
        "live N=5,000",
    ]
    assert [label for label, *_ in panels["operator"]] == ["backlog N=1,000", "live N=1,000"]
    assert max(max(ys) for *_, ys in panels["operator"]) == 300.0  # MB, the operator's own
    colours = {kind: {label: c for label, c, *_ in lines} for kind, lines in panels.items()}
    for label, colour in colours["operator"].items():
        assert colours["baseline"][label] == colour
    assert len(set(colours["baseline"].values())) == 3
