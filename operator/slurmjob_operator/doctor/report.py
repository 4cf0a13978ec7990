"""The doctor's report: one line per check, read by a person or, as JSON, by a script."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Outcome
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    #: A setting or the clusters file is malformed: nothing else was checked (exit code 2,
    #: as for every command, docs/configuration.md).
    invalid: bool = False

    def add(self, name: str, outcome: Outcome, detail: str) -> None:
        self.checks.append(Check(name, outcome, detail))

    @property
    def ok(self) -> bool:
        return all(c.outcome is not Outcome.FAIL for c in self.checks)

    def render(self, *, json_output: bool = False) -> str:
        if json_output:
            return (
                json.dumps({"ok": self.ok, "checks": [asdict(c) for c in self.checks]}, indent=2)
                + "\n"
            )
        width = max((len(c.name) for c in self.checks), default=0)
        lines = [f"[{c.outcome.value:>4}] {c.name:<{width}}  {c.detail}" for c in self.checks]
        failed = sum(c.outcome is Outcome.FAIL for c in self.checks)
        lines.append("site OK" if self.ok else f"{failed} check(s) failed")
        return "\n".join(lines) + "\n"
