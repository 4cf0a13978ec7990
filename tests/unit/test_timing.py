"""The per-module time table (tests/timing.py): budget parsing, the table, the recording, and
whole pytest runs through pytester (the table appears; the exit status never changes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.timing import (
    BUDGETS_FILE,
    ModuleTime,
    Recorder,
    Row,
    format_table,
    load_budgets,
    parse_budgets,
    rows,
    to_json,
)

# --- the budget file --------------------------------------------------------------------------


def test_budgets_are_module_paths_to_seconds() -> None:
    text = '# rule\n[budgets]\n"tests/unit/test_a.py" = 5\n"tests/integration/test_b.py" = 90.5\n'
    assert parse_budgets(text) == {"tests/unit/test_a.py": 5.0, "tests/integration/test_b.py": 90.5}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[budgets]\n'a.py' = 'ten'\n", "a.py"),
        ("[budgets]\n'a.py' = 0\n", "a.py"),
        ("[budgets]\n'a.py' = -3\n", "a.py"),
        ("[budgets]\n'a.py' = true\n", "a.py"),
        ("[budgets]\n'a.py' = nan\n", "a.py"),
        ("[budgets]\n'a.py' = inf\n", "a.py"),
        ("'a.py' = 3\n", "no [budgets] table"),
        ("[budgets\n", "not TOML"),
    ],
)
def test_a_bad_budget_file_is_refused_naming_the_problem(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("[", r"\[")):
        parse_budgets(text)


def test_a_missing_or_bad_file_gives_no_budgets_and_one_line(tmp_path: Path) -> None:
    budgets, problem = load_budgets(tmp_path / "absent.toml")
    assert budgets == {}
    assert problem is not None
    assert "absent.toml" in problem
    bad = tmp_path / "bad.toml"
    bad.write_text("[budgets]\n'a.py' = 'x'\n")
    budgets, problem = load_budgets(bad)
    assert budgets == {}
    assert problem is not None
    assert "a.py" in problem


def test_the_repository_budget_file_parses_and_names_real_modules() -> None:
    budgets, problem = load_budgets(BUDGETS_FILE)
    assert problem is None
    assert budgets
    root = BUDGETS_FILE.parent.parent
    missing = [m for m in budgets if not (root / m).is_file()]
    assert missing == [], "budgets for modules that do not exist"
    text = BUDGETS_FILE.read_text()
    assert "named, not failed" in text, "the file states its rule"


# --- the table --------------------------------------------------------------------------------


def test_rows_are_slowest_first_with_their_budgets() -> None:
    times = [ModuleTime("tests/a.py", 3, 1.0), ModuleTime("tests/b.py", 2, 5.0)]
    table = rows(times, {"tests/a.py": 2.0})
    assert table == [Row("tests/b.py", 2, 5.0, None), Row("tests/a.py", 3, 1.0, 2.0)]


def test_over_budget_is_strictly_more_than_the_budget() -> None:
    assert Row("m", 1, 10.1, 10.0).over
    assert not Row("m", 1, 10.0, 10.0).over
    assert not Row("m", 1, 1000.0, None).over, "no budget is not over budget"


def test_the_table_marks_and_names_modules_over_budget() -> None:
    table = rows(
        [
            ModuleTime("tests/integration/test_slow.py", 4, 130.3),
            ModuleTime("tests/unit/test_fast.py", 40, 1.5),
            ModuleTime("tests/unit/test_new.py", 1, 0.2),
        ],
        {"tests/integration/test_slow.py": 100, "tests/unit/test_fast.py": 5},
    )
    lines = format_table(table)
    assert lines[0].split() == ["module", "tests", "seconds", "budget"]
    slow = ["tests/integration/test_slow.py", "4", "130.3", "100", "OVER", "by", "30.3", "s"]
    assert lines[1].split() == slow
    assert lines[2].split() == ["tests/unit/test_fast.py", "40", "1.5", "5"]
    assert lines[3].split() == ["tests/unit/test_new.py", "1", "0.2", "-"]
    assert lines[4].split() == ["total", "45", "132.0"]
    assert lines[5] == "over budget (1): tests/integration/test_slow.py"
    # The numbers are right-aligned under their heads.
    end = lines[0].index("seconds") + len("seconds")
    for line, cell in zip(lines[1:5], ["130.3", "1.5", "0.2", "132.0"], strict=True):
        assert line.index(f" {cell}") + 1 + len(cell) == end


def test_a_table_with_nothing_over_says_so() -> None:
    lines = format_table(rows([ModuleTime("tests/a.py", 1, 0.5)], {"tests/a.py": 1}))
    assert lines[-1] == "over budget: none"
    assert "OVER" not in "\n".join(lines)


def test_the_json_form_carries_every_row() -> None:
    table = rows([ModuleTime("a.py", 2, 3.14159), ModuleTime("b.py", 1, 1.0)], {"a.py": 3})
    data = to_json(table)
    assert data["modules"][0] == {
        "module": "a.py",
        "tests": 2,
        "seconds": 3.142,
        "budget": 3.0,
        "over": True,
    }
    assert data["modules"][1]["budget"] is None
    assert data["over"] == ["a.py"]
    assert data["total_seconds"] == 4.142
    json.dumps(data)


# --- the recording ----------------------------------------------------------------------------


def test_a_module_runs_from_its_first_setup_to_its_last_teardown() -> None:
    r = Recorder()
    for when, start, stop in [("setup", 10, 12), ("call", 12, 13), ("teardown", 13, 13.5)]:
        r.add("tests/a.py::test_one", when, start, stop)
    for when, start, stop in [("setup", 13.6, 13.7), ("call", 13.7, 14), ("teardown", 14, 20)]:
        r.add("tests/a.py::test_two", when, start, stop)
    r.add("tests/b.py::test_x", "setup", 20, 21)
    r.add("tests/b.py::test_x", "call", 21, 21)
    r.add("tests/b.py::test_x", "teardown", 21, 22)
    times = {t.module: t for t in r.finish()}
    assert times["tests/a.py"] == ModuleTime("tests/a.py", 2, 10.0)
    assert times["tests/b.py"] == ModuleTime("tests/b.py", 1, 2.0)


def test_interleaved_modules_add_their_stretches() -> None:
    r = Recorder()
    r.add("tests/a.py::t[x]", "setup", 0, 5)
    r.add("tests/a.py::t[x]", "teardown", 5, 6)
    r.add("tests/b.py::t", "setup", 6, 7)
    r.add("tests/b.py::t", "teardown", 7, 10)
    r.add("tests/a.py::t[y]", "setup", 10, 11)
    r.add("tests/a.py::t[y]", "teardown", 11, 12)
    times = {t.module: t for t in r.finish()}
    assert times["tests/a.py"] == ModuleTime("tests/a.py", 2, 8.0)
    assert times["tests/b.py"] == ModuleTime("tests/b.py", 1, 4.0)


def test_a_test_skipped_at_setup_counts_once() -> None:
    r = Recorder()
    r.add("tests/a.py::t", "setup", 0, 0.1)
    r.add("tests/a.py::t", "teardown", 0.1, 0.2)
    assert r.finish() == [ModuleTime("tests/a.py", 1, pytest.approx(0.2))]


# --- whole runs -------------------------------------------------------------------------------

_SUITE = {
    "test_fast": "def test_ok():\n    pass\n",
    "test_slow": (
        "import time\nimport pytest\n\n"
        "@pytest.fixture(scope='module')\n"
        "def slow():\n    yield\n    time.sleep(0.3)\n\n"
        "def test_one(slow):\n    pass\n\n"
        "def test_two(slow):\n    pass\n"
    ),
}


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An inner run with the plugin alone of the project's conftest (pytester's own directory)."""
    return pytester.runpytest(
        "-p", "tests.timing", "-o", "asyncio_default_fixture_loop_scope=function", *args
    )


def _budgets(pytester: pytest.Pytester, text: str) -> Path:
    path = pytester.path / "budgets.toml"
    path.write_text(text)
    return path


def test_a_run_prints_the_table_and_names_the_module_over_budget(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(**_SUITE)
    budgets = _budgets(pytester, "[budgets]\n'test_slow.py' = 0.1\n'test_fast.py' = 60\n")
    out = pytester.path / "timings.json"
    result = _run(pytester, f"--timings-budgets={budgets}", f"--timings-json={out}")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*time per module (budgets: budgets.toml)*",
            "module*tests*seconds*budget",
            "test_slow.py*2*0.1*OVER by*",
            "test_fast.py*1*60",
            "total*3*",
            "over budget (1): test_slow.py",
        ]
    )
    data = json.loads(out.read_text())
    slow = next(m for m in data["modules"] if m["module"] == "test_slow.py")
    assert slow["tests"] == 2
    assert slow["seconds"] >= 0.3, "the module fixture's teardown is the module's time"
    assert data["over"] == ["test_slow.py"]


def test_a_failing_run_keeps_its_exit_status(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad="def test_no():\n    assert False\n")
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*time per module*", "test_bad.py*1*"])


def test_a_run_collecting_nothing_still_exits_5(pytester: pytest.Pytester) -> None:
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.no_fnmatch_line("*time per module*")


def test_a_bad_budget_file_or_json_path_never_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**_SUITE)
    budgets = _budgets(pytester, "[budgets]\n'test_slow.py' = 'soon'\n")
    out = pytester.path / "no-such-dir" / "timings.json"
    result = _run(pytester, f"--timings-budgets={budgets}", f"--timings-json={out}")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "timings: budgets not read from *budgets.toml: test_slow.py*",
            "test_slow.py*2*-",
            "over budget: none",
            f"timings: {out} not written*",
        ]
    )
