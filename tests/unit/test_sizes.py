"""The size bar (tests/sizes.toml): no module over 400 physical lines, no class over 250, in
operator/slurmjob_operator, except the ones listed there with a reason; a listed one may not
grow, and one back under the bar leaves the list."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator/slurmjob_operator"
SIZES = REPO / "tests/sizes.toml"


def measure(package: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Physical lines of each module (as `wc -l` counts them) and of each class (its `class`
    line to its last line, nested classes too), keyed by path and by path:Class."""
    modules: dict[str, int] = {}
    classes: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        text = path.read_text(encoding="utf-8")
        modules[rel] = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                classes[f"{rel}:{node.name}"] = node.end_lineno - node.lineno + 1
    return modules, classes


def over_the_bar(sizes: dict[str, int], limit: int, listed: dict[str, dict[str, Any]]) -> list[str]:
    """What breaks the bar: an unlisted size over the limit, a listed one grown past its
    entry, an entry without a reason, an entry for a size back under the limit (or gone)."""
    problems = []
    for name, lines in sorted(sizes.items()):
        entry = listed.get(name)
        if lines <= limit:
            continue
        if entry is None:
            problems.append(f"{name}: {lines} lines, over {limit} and not listed")
        elif lines > int(entry["lines"]):
            problems.append(f"{name}: grew to {lines} lines (listed at {entry['lines']})")
    for name, entry in sorted(listed.items()):
        if not str(entry.get("why", "")).strip():
            problems.append(f"{name}: listed without a reason")
        if sizes.get(name, 0) <= limit:
            problems.append(f"{name}: no longer over {limit} lines: take it off the list")
    return problems


def _bar() -> dict[str, Any]:
    return tomllib.loads(SIZES.read_text(encoding="utf-8"))


def test_no_module_over_the_bar_unless_listed_and_none_grows() -> None:
    bar = _bar()
    modules, _ = measure(PACKAGE)
    assert over_the_bar(modules, bar["limits"]["module"], bar.get("modules", {})) == []


def test_no_class_over_the_bar_unless_listed_and_none_grows() -> None:
    bar = _bar()
    _, classes = measure(PACKAGE)
    assert over_the_bar(classes, bar["limits"]["class"], bar.get("classes", {})) == []


def test_the_bar_is_the_one_architecture_md_states() -> None:
    assert _bar()["limits"] == {"module": 400, "class": 250}


@pytest.mark.parametrize(
    ("sizes", "listed", "expected"),
    [
        ({"a.py": 401}, {}, ["a.py: 401 lines, over 400 and not listed"]),
        ({"a.py": 400}, {}, []),
        ({"a.py": 450}, {"a.py": {"lines": 450, "why": "x"}}, []),
        (
            {"a.py": 451},
            {"a.py": {"lines": 450, "why": "x"}},
            ["a.py: grew to 451 lines (listed at 450)"],
        ),
        ({"a.py": 420}, {"a.py": {"lines": 450, "why": " "}}, ["a.py: listed without a reason"]),
        (
            {"a.py": 399},
            {"a.py": {"lines": 450, "why": "x"}},
            ["a.py: no longer over 400 lines: take it off the list"],
        ),
        (
            {},
            {"gone.py": {"lines": 450, "why": "x"}},
            ["gone.py: no longer over 400 lines: take it off the list"],
        ),
    ],
)
def test_the_rules_of_the_list(
    sizes: dict[str, int], listed: dict[str, dict[str, Any]], expected: list[str]
) -> None:
    assert over_the_bar(sizes, 400, listed) == expected


def test_measuring_counts_physical_lines_and_whole_classes(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "class A:\n    x = 1\n\n    def f(self) -> None:\n        pass\n\n\ny = 2\n"
    )
    (tmp_path / "n.py").write_text("z = 1")  # no final newline: wc -l says 0, a reader 1
    modules, classes = measure(tmp_path)
    assert modules == {"m.py": 8, "n.py": 1}
    assert classes == {"m.py:A": 5}
