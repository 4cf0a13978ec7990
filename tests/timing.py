"""Each test module's wall time against its budget, printed at the end of every pytest run.

Registered from tests/conftest.py. A module's time is the setup, call and teardown of its
tests, module-scoped fixtures included: from the first of its tests starting to the last one's
teardown ending, in the order pytest runs them. When pytest interleaves modules (parametrized
session fixtures reorder the integration tests), each contiguous stretch counts and the
stretches are added. Session fixtures are charged to the test that sets them up or tears them
down (the first and last test of the run, and the test where a parametrized cluster changes).

The budgets are in tests/budgets.toml. A module over its budget is named in the table, never
failed: the plugin does not change a test's outcome or pytest's exit status, and any error of
its own is printed as one line instead of raised.

``--timings-json PATH`` writes the table as JSON too; ``--timings-budgets PATH`` reads another
budget file.
"""

from __future__ import annotations

import contextlib
import json
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BUDGETS_FILE = Path(__file__).with_name("budgets.toml")
PLUGIN_NAME = "slurmjob-timing"


@dataclass
class ModuleTime:
    module: str
    tests: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Row:
    module: str
    tests: int
    seconds: float
    budget: float | None

    @property
    def over(self) -> bool:
        return self.budget is not None and self.seconds > self.budget


def parse_budgets(text: str) -> dict[str, float]:
    """The ``[budgets]`` table of a budget file: module path -> seconds (a positive number).

    Raises ValueError naming the first bad entry."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"not TOML: {e}") from e
    table = data.get("budgets")
    if not isinstance(table, dict):
        raise ValueError("no [budgets] table")
    budgets: dict[str, float] = {}
    for module, seconds in table.items():
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError(f"{module}: budget {seconds!r} is not a number of seconds")
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"{module}: budget {seconds!r} is not a positive number of seconds")
        budgets[module] = float(seconds)
    return budgets


def load_budgets(path: Path) -> tuple[dict[str, float], str | None]:
    """The budgets of ``path`` and, instead of raising, a one-line problem (missing, unreadable
    or malformed file: no budgets then)."""
    try:
        return parse_budgets(path.read_text(encoding="utf-8")), None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return {}, f"budgets not read from {path}: {e}"


def rows(times: Iterable[ModuleTime], budgets: Mapping[str, float]) -> list[Row]:
    """One row per module that ran, slowest first (then by path)."""
    return sorted(
        (Row(t.module, t.tests, t.seconds, budgets.get(t.module)) for t in times),
        key=lambda r: (-r.seconds, r.module),
    )


def _budget_cell(budget: float | None) -> str:
    if budget is None:
        return "-"
    return f"{budget:g}"


def format_table(table: list[Row]) -> list[str]:
    """The table's lines: module, tests, seconds, budget and a mark; a total; the modules over
    budget named below it."""
    head = ("module", "tests", "seconds", "budget", "")
    cells = [
        (
            r.module,
            str(r.tests),
            f"{r.seconds:.1f}",
            _budget_cell(r.budget),
            f"OVER by {r.seconds - r.budget:.1f} s" if r.over and r.budget is not None else "",
        )
        for r in table
    ]
    total = (
        "total",
        str(sum(r.tests for r in table)),
        f"{sum(r.seconds for r in table):.1f}",
        "",
        "",
    )
    width = [max(len(c[i]) for c in [head, *cells, total]) for i in range(4)]

    def line(c: tuple[str, str, str, str, str]) -> str:
        left = f"{c[0]:<{width[0]}}"
        numbers = "  ".join(f"{c[i]:>{width[i]}}" for i in (1, 2, 3))
        return f"{left}  {numbers}  {c[4]}".rstrip()

    lines = [line(head), *(line(c) for c in cells), line(total)]
    over = [r for r in table if r.over]
    if over:
        lines.append(f"over budget ({len(over)}): " + ", ".join(r.module for r in over))
    else:
        lines.append("over budget: none")
    return lines


def to_json(table: list[Row]) -> dict[str, Any]:
    return {
        "modules": [
            {
                "module": r.module,
                "tests": r.tests,
                "seconds": round(r.seconds, 3),
                "budget": r.budget,
                "over": r.over,
            }
            for r in table
        ],
        "total_seconds": round(sum(r.seconds for r in table), 3),
        "over": [r.module for r in table if r.over],
    }


class Recorder:
    """Adds up contiguous stretches of each module's test reports (setup, call, teardown)."""

    def __init__(self) -> None:
        self.times: dict[str, ModuleTime] = {}
        self._module: str | None = None
        self._start = 0.0
        self._stop = 0.0

    def add(self, nodeid: str, when: str, start: float, stop: float) -> None:
        module = nodeid.split("::", 1)[0]
        entry = self.times.setdefault(module, ModuleTime(module))
        if when == "setup":
            entry.tests += 1
        if module != self._module:
            self._close()
            self._module, self._start = module, start
        self._stop = max(self._stop, stop)

    def _close(self) -> None:
        if self._module is not None:
            self.times[self._module].seconds += max(0.0, self._stop - self._start)
        self._module = None
        self._stop = 0.0

    def finish(self) -> list[ModuleTime]:
        self._close()
        return list(self.times.values())


class TimingPlugin:
    def __init__(self, budgets_path: Path, json_path: Path | None) -> None:
        self.budgets_path = budgets_path
        self.json_path = json_path
        self.recorder = Recorder()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        with contextlib.suppress(Exception):  # never let the measuring break a run
            self.recorder.add(report.nodeid, report.when, report.start, report.stop)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        try:
            self._summary(terminalreporter)
        except Exception as e:  # the table informs, it never fails
            terminalreporter.write_line(f"timings: table not made: {e!r}")

    def _summary(self, tr: pytest.TerminalReporter) -> None:
        times = self.recorder.finish()
        if not times:
            return
        budgets, problem = load_budgets(self.budgets_path)
        table = rows(times, budgets)
        tr.write_sep("-", f"time per module (budgets: {self.budgets_path.name})")
        if problem:
            tr.write_line(f"timings: {problem}")
        for text in format_table(table):
            tr.write_line(text)
        if self.json_path is not None:
            try:
                self.json_path.write_text(json.dumps(to_json(table), indent=1) + "\n")
            except OSError as e:
                tr.write_line(f"timings: {self.json_path} not written: {e}")
            else:
                tr.write_line(f"timings: written to {self.json_path}")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("timings", "per-module wall time against tests/budgets.toml")
    group.addoption(
        "--timings-json",
        metavar="PATH",
        default=None,
        help="also write the per-module time table as JSON to PATH",
    )
    group.addoption(
        "--timings-budgets",
        metavar="PATH",
        default=str(BUDGETS_FILE),
        help="budget file (default: tests/budgets.toml)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller gets its reports
        return
    json_opt = config.getoption("--timings-json")
    plugin = TimingPlugin(
        Path(config.getoption("--timings-budgets")),
        Path(json_opt) if json_opt else None,
    )
    config.pluginmanager.register(plugin, PLUGIN_NAME)
