"""No two modules of the package import each other, directly or round a loop: each layer of the
import-linter contract is a tree inside too. Module-level imports count, `TYPE_CHECKING` ones
included (a type-only import back is still a loop a reader has to untangle); an import inside
a function does not (it runs late, on purpose)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "operator"
ROOT = "slurmjob_operator"


def module_names(source: Path) -> dict[str, Path]:
    names = {}
    for path in (source / ROOT).rglob("*.py"):
        parts = path.relative_to(source).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _module_level(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        yield node
        yield from _module_level(node)


def import_graph(source: Path) -> dict[str, set[str]]:
    """Each module -> the package's modules it imports (`from a import b` is a.b when that is
    a module, else a)."""
    names = module_names(source)
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps: set[str] = set()
        for node in _module_level(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    deps.add(whole if whole in names else node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in names and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph(SOURCE)) == []


def test_a_loop_is_found_however_long_and_a_tree_is_not() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_a_type_only_import_back_counts_and_a_late_one_does_not(tmp_path: Path) -> None:
    pkg = tmp_path / ROOT
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from slurmjob_operator.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from slurmjob_operator import a\n"
    )
    assert cycles(import_graph(tmp_path)) == [[f"{ROOT}.a", f"{ROOT}.b"]]
    (pkg / "b.py").write_text("def f() -> None:\n    from slurmjob_operator import a\n")
    assert cycles(import_graph(tmp_path)) == []
