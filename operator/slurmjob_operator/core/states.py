"""Slurm job state -> platform phase: a pure, table-driven mapping.

`observe(views)` turns the normalised views of one Slurm job (one view for a plain job, one per
component of a heterogeneous job) into an `Observation`: the platform `Phase`, a CamelCase
`reason` in the Kubernetes condition style, a human `message` that carries the native sub-state,
and the facts the status keeps (native state and flags, exit code, nodes, times).

The rules live in two tables (`core/state_rules.py`, re-exported here) that `docs/states.md`
documents and the tests check against that document:

* `BASE_STATE_RULES`: one rule per Slurm base state.
* `FLAG_RULES`: the state flags that change the outcome, each for the base states it applies
  to; `FLAG_PRECEDENCE` says which one wins when several are set.

Finality is never decided here: a job is final exactly when `SlurmJobView.is_final` says so for
every component, and the phase is terminal (Succeeded, Failed, Cancelled) exactly when the job
is final. COMPLETING, STAGE_OUT and CONFIGURING therefore keep a job that has a final base state
in phase Running until they clear: it still occupies its nodes. The operator-owned phases
Pending and Submitting never come out of this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict

from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.core.state_rules import (
    BASE_STATE_RULES,
    FLAG_PRECEDENCE,
    FLAG_RULES,
    BaseRule,
    FlagRule,
)

B = BaseState

__all__ = [
    "BASE_STATE_RULES",
    "FLAG_PRECEDENCE",
    "FLAG_RULES",
    "BaseRule",
    "FlagRule",
    "Observation",
    "observe",
    "reason_from_slurm",
]

_FINISHING_FLAGS = frozenset({"COMPLETING", "STAGE_OUT", "CONFIGURING"})


class Observation(BaseModel):
    """What the operator concludes from Slurm's view of one job (all its components)."""

    model_config = ConfigDict(frozen=True)

    phase: Phase
    """Queued, Running, Succeeded, Failed, Cancelled or Unknown; never Pending/Submitting."""
    reason: str
    """CamelCase, Kubernetes condition style: Resources, Running, Timeout, Completing, ..."""
    message: str
    """Human text with the native sub-state, Slurm's state reason and description."""
    native_state: str
    """The leader's base state, e.g. RUNNING; the raw string when it is not a base state."""
    native_flags: list[str]
    """Every component's state flags, sorted."""
    slurm_reason: str | None = None
    """Slurm's own state_reason of the component that decided, when it gave a real one."""
    exit_code: int | None = None
    signal: int | None = None
    final: bool = False
    """Every component has ended and no longer occupies resources."""
    infrastructure: bool = False
    """The job Failed because of the cluster (NODE_FAIL, BOOT_FAIL, LAUNCH_FAILED)."""
    nodes: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


_WORD_RE = re.compile(r"[A-Za-z0-9]+")
_MAX_REASON = 128


def reason_from_slurm(text: str | None, default: str) -> str:
    """Slurm's state_reason as a CamelCase condition reason, or `default` when it has none.

    Only the part before the first "," or ":" counts ("ReqNodeNotAvail, UnavailableNodes:n1"
    gives ReqNodeNotAvail); words are joined with their first letter upper-cased
    ("launch failed requeued held" gives LaunchFailedRequeuedHeld), inner capitals are kept.
    """
    if not text:
        return default
    head = re.split(r"[,:]", text, maxsplit=1)[0]
    words = _WORD_RE.findall(head)
    camel = "".join(w[:1].upper() + w[1:] for w in words)
    camel = camel.lstrip("0123456789")[:_MAX_REASON]
    camel = camel[:1].upper() + camel[1:]
    if not camel or camel == "None":
        return default
    return camel


def _real_reason(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text if text and text != "None" else None


@dataclass(frozen=True)
class _Part:
    """The classification of one component."""

    view: SlurmJobView
    phase: Phase
    reason: str
    message: str
    infrastructure: bool


def _exit_text(view: SlurmJobView) -> str:
    if view.exit.signal is not None:
        return f" (signal {view.exit.signal})"
    if view.exit.return_code is not None:
        return f" (exit code {view.exit.return_code})"
    return ""


# Flags that decide nothing on their base state but deserve words in the message.
_FLAG_NOTES: Mapping[str, str] = MappingProxyType(
    {
        "COMPLETING": "the previous allocation is still completing",
        "STAGE_OUT": "the previous allocation is still staging out",
        "LAUNCH_FAILED": "the batch script failed to launch",
    }
)


def _details(view: SlurmJobView, used: set[str]) -> str:
    """The tail of a message: Slurm's reason and description, flags no rule explained."""
    parts: list[str] = []
    reason = _real_reason(view.reason)
    if reason is not None:
        parts.append(f"reason: {reason}")
    if view.description:
        parts.append(view.description.strip())
    other = view.flags - used
    parts += [_FLAG_NOTES[f] for f in sorted(other & _FLAG_NOTES.keys())]
    unexplained = sorted(other - _FLAG_NOTES.keys())
    if unexplained:
        parts.append("flags: " + ", ".join(unexplained))
    return "".join(f"; {p}" for p in parts if p)


def _classify(view: SlurmJobView) -> _Part:
    base = view.base_state
    if base is None:
        raw = "+".join(view.raw_state) or "(none)"
        return _Part(
            view,
            Phase.UNKNOWN,
            "UnknownState",
            f"Slurm reported a job state this operator does not know: {raw}"
            + _details(view, set(view.flags)),
            False,
        )
    for flag in FLAG_PRECEDENCE:
        rule = FLAG_RULES[flag]
        if flag in view.flags and base in rule.applies_to:
            return _from_flag(view, base, flag, rule)
    base_rule = BASE_STATE_RULES[base]
    reason = base_rule.reason
    if base is B.PENDING:
        reason = reason_from_slurm(view.reason, base_rule.reason)
    text = f"Slurm job {base_rule.text}"
    if base_rule.phase.is_terminal:
        text += _exit_text(view)
    elif base is B.RUNNING and view.nodes:
        text += f" on {view.nodes}"
    return _Part(
        view, base_rule.phase, reason, text + _details(view, set()), base_rule.infrastructure
    )


def _from_flag(view: SlurmJobView, base: BaseState, flag: str, rule: FlagRule) -> _Part:
    used = {flag}
    if flag in _FINISHING_FLAGS:
        used |= view.flags & _FINISHING_FLAGS
        if base is B.RUNNING and flag == "CONFIGURING":
            text = f"starting: Slurm job is RUNNING, {rule.text}"
        elif base is B.RUNNING:
            # v0.0.38/39 show COMPLETING instead of the base state: the outcome is not visible.
            text = f"finishing: final state not visible yet, {rule.text}"
        else:
            text = f"finishing: {base.value}{_exit_text(view)}, {rule.text}"
    else:
        text = f"Slurm job {rule.text}"
        if rule.phase.is_terminal:
            text += _exit_text(view)
    return _Part(view, rule.phase, rule.reason, text + _details(view, used), rule.infrastructure)


def _offset(view: SlurmJobView) -> int:
    return view.het_job_offset or 0


def _state_word(view: SlurmJobView) -> str:
    words = [view.base_state.value] if view.base_state is not None else list(view.raw_state)
    words += sorted(view.flags - set(words))
    return "+".join(words) or "(none)"


def _pick(parts: Sequence[_Part], phase: Phase) -> _Part:
    return next(p for p in parts if p.phase is phase)


def observe(views: Sequence[SlurmJobView]) -> Observation:
    """The observation for one Slurm job from all of its components' views.

    Heterogeneous jobs: final only when every component is final. While not final the job is
    Running if any component is Running (or still holds its allocation), else Unknown if any
    component's state is unknown, else Queued; the first component (by het offset) in that
    phase gives reason and message. When final: Failed if any component failed (the first by
    offset gives reason, message and exit code; infrastructure if any failed component's
    failure is), else Cancelled if any was cancelled, else Succeeded.
    """
    if not views:
        raise ValueError("observe() needs at least one view of the job")
    ordered = sorted(views, key=_offset)
    parts = [_classify(v) for v in ordered]
    leader = ordered[0]
    final = all(v.is_final for v in ordered)
    phases = {p.phase for p in parts}

    if final:
        if Phase.FAILED in phases:
            phase = Phase.FAILED
        elif Phase.CANCELLED in phases:
            phase = Phase.CANCELLED
        else:
            phase = Phase.SUCCEEDED
    elif Phase.RUNNING in phases:
        phase = Phase.RUNNING
    elif Phase.UNKNOWN in phases:
        phase = Phase.UNKNOWN
    else:
        phase = Phase.QUEUED
    chosen = _pick(parts, phase)
    infrastructure = phase is Phase.FAILED and any(
        p.infrastructure for p in parts if p.phase is Phase.FAILED
    )

    message = chosen.message
    if len(ordered) > 1:
        states = ", ".join(f"+{_offset(v)} {_state_word(v)}" for v in ordered)
        message = f"component +{_offset(chosen.view)}: {message} (components: {states})"

    if leader.base_state is not None:
        native_state = leader.base_state.value
    else:
        native_state = leader.raw_state[0] if leader.raw_state else ""
    flags: set[str] = set()
    for v in ordered:
        flags |= v.flags

    node_lists = [v.nodes for v in ordered if v.nodes]
    starts = [
        v.start_time
        for v in ordered
        if v.start_time is not None and v.base_state not in (None, B.PENDING)
    ]
    ends = [v.end_time for v in ordered if v.end_time is not None]

    return Observation(
        phase=phase,
        reason=chosen.reason,
        message=message,
        native_state=native_state,
        native_flags=sorted(flags),
        slurm_reason=_real_reason(chosen.view.reason),
        exit_code=chosen.view.exit.return_code,
        signal=chosen.view.exit.signal,
        final=final,
        infrastructure=infrastructure,
        nodes=",".join(node_lists) if node_lists else None,
        started_at=min(starts) if starts else None,
        finished_at=max(ends) if final and ends else None,
    )
