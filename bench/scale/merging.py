"""Which code a scale run measured, and one set of results from several invocations.

A full `make bench-scale` (three sizes, two shapes, three repeats) takes longer than a quiet
machine is often free. It can be run in parts (one size or shape per invocation) and the parts
merged, provided they measured the same code: each invocation records the git trees of what
decides the figures (the operator's package, its templates, the bench and its baseline), and
whether the checkout had changes there. Parts of different code, or of a checkout with changes,
are never merged.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

#: The paths whose content decides what the bench measures.
MEASURED = ("operator", "templates", "bench")


class MergeRefused(Exception):
    """The results cannot be one run's: they measured different code, or unknown code."""


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def provenance(root: Path) -> dict[str, Any] | None:
    """The commit, the tree of each measured path and whether the checkout changed any of
    them (tracked or not); None outside a git checkout."""
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return None
    trees = {path: _git(root, "rev-parse", f"HEAD:{path}") for path in MEASURED}
    changes = _git(root, "status", "--porcelain", "--", *MEASURED)
    return {"commit": commit, "trees": trees, "dirty": changes is None or bool(changes)}


def _code(results: dict[str, Any], name: str) -> dict[str, Any]:
    source = results.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("trees"), dict):
        raise MergeRefused(f"{name}: no record of the code it measured")
    if source.get("dirty") is not False:
        raise MergeRefused(f"{name}: measured a checkout with changes to {', '.join(MEASURED)}")
    trees: dict[str, Any] = source["trees"]
    if any(not trees.get(path) for path in MEASURED):
        raise MergeRefused(f"{name}: the trees of {', '.join(MEASURED)} are not all recorded")
    return trees


def merge(parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One results document from (name, results) parts of the same code, runs in the parts'
    order. Repeats are numbered again per N and shape so that two parts' first repeats stay
    two repeats (a ratio pairs the runs of one repeat)."""
    if not parts:
        raise MergeRefused("nothing to merge")
    first_name, first = parts[0]
    trees = _code(first, first_name)
    for name, part in parts[1:]:
        if _code(part, name) != trees:
            raise MergeRefused(f"{name} measured other code than {first_name}")
        if (part.get("machine"), part.get("slurm"), part.get("interval")) != (
            first.get("machine"),
            first.get("slurm"),
            first.get("interval"),
        ):
            raise MergeRefused(f"{name}: another machine, Slurm or poll interval than {first_name}")
    runs: list[dict[str, Any]] = []
    seen: dict[tuple[int, str], int] = {}  # (n, shape) -> repeats taken by earlier parts
    for _, part in parts:
        offsets = dict(seen)
        for run in part["runs"]:
            key = (run["n"], run["shape"])
            repeat = offsets.get(key, 0) + run.get("repeat", 0)
            runs.append({**run, "repeat": repeat})
            seen[key] = max(seen.get(key, 0), repeat + 1)
    # What one invocation was asked and what was noted of it stay with that invocation: at the
    # top they would describe the first part as if it were the whole.
    per_part = ("runs", "logtail", "note", "options", "part_records")
    merged = {key: value for key, value in first.items() if key not in per_part}
    commits = list(dict.fromkeys(part["source"].get("commit") for _, part in parts))
    merged["source"] = {"commits": commits, "trees": trees, "dirty": False}
    merged["started"] = " / ".join(part.get("started", "?") for _, part in parts)
    merged["command"] = " ; ".join(part.get("command", "?") for _, part in parts)
    merged["parts"] = [name for name, _ in parts]
    merged["part_records"] = {}
    for name, part in parts:
        # A merged document brings its own parts' records along.
        merged["part_records"].update(
            part.get("part_records")
            or {name: {key: part[key] for key in ("options", "note") if key in part}}
        )
    merged["runs"] = runs
    tails = [part["logtail"] for _, part in parts if part.get("logtail")]
    if tails:
        merged["logtail"] = tails[-1]
    return merged
