"""The counting proxy's log, read back: slurmrestd requests cut into windows and cycles."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Request:
    t: float
    method: str
    path: str  # template: ids replaced by {id}
    status: int
    size: int  # response body bytes
    ref: str | None  # the job id or SLUID in the path

    @property
    def kind(self) -> str:
        """`GET jobs/state`: the template without its `/slurm/<version>/` prefix."""
        rest = self.path.split("/", 3)[-1] if self.path.count("/") >= 3 else self.path
        return f"{self.method} {rest}"


class RequestLog:
    """Incrementally re-read: the proxy appends while the bench runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.items: list[Request] = []

    def refresh(self) -> list[Request]:
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next read
        self._offset += end
        for line in data[:end].splitlines():
            r = json.loads(line)
            self.items.append(
                Request(r["t"], r["m"], r["p"], r.get("s", 0), r.get("b", 0), r.get("i"))
            )
        return self.items

    def between(self, t0: float, t1: float) -> list[Request]:
        return [r for r in self.refresh() if t0 <= r.t < t1]


def summary(requests: list[Request], intervals: float = 1.0) -> dict[str, object]:
    """Requests and body bytes (per interval when `intervals` > 1), and counts per kind."""
    kinds = Counter(r.kind for r in requests)
    return {
        "requests": len(requests) / intervals,
        "bytes": sum(r.size for r in requests) / intervals,
        "by_kind": {k: v / intervals for k, v in sorted(kinds.items())},
    }


def is_detail(r: Request) -> bool:
    return r.method == "GET" and r.path.endswith("/job/{id}")


def is_sweep(r: Request) -> bool:
    return r.method == "GET" and (r.path.endswith("/jobs/state") or r.path.endswith("/jobs"))


def first_steady_cycle(requests: list[Request], gap: float = 1.0) -> float | None:
    """Start of the first sweep (a burst of /jobs/state or /jobs requests) after which no
    per-job detail request was made before the next sweep: the operator is steady again.
    None when no such cycle was seen (the last sweep has no successor to close it)."""
    starts: list[float] = []
    last = float("-inf")
    for r in requests:
        if is_sweep(r):
            if r.t - last > gap:
                starts.append(r.t)
            last = r.t
    for begin, end in itertools.pairwise(starts):
        if not any(is_detail(r) for r in requests if begin <= r.t < end):
            return begin
    return None


def full_round(requests: list[Request], jobs: int) -> float | None:
    """When `jobs` distinct jobs had a detail GET (the baseline's one round of timers)."""
    refs: set[str] = set()
    for r in requests:
        if is_detail(r) and r.ref:
            refs.add(r.ref)
            if len(refs) >= jobs:
                return r.t
    return None
