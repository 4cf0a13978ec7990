"""Slurm state -> phase: docs/states.md is read and every row is checked against `observe`."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.status import CONDITION_REASON_RE, Phase
from slurmjob_operator.core.jobview import (
    FLAG_SHOWN_AS_STATE,
    BaseState,
    JobExit,
    SlurmJobView,
    normalise_state,
)
from slurmjob_operator.core.states import (
    BASE_STATE_RULES,
    FLAG_PRECEDENCE,
    FLAG_RULES,
    Observation,
    observe,
    reason_from_slurm,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "states.md"
DOC_FLAGS = {
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "STOPPED",
    "REVOKED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "LAUNCH_FAILED",
    "SIGNALING",
    "RESIZING",
}
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def view(state: str, *, offset: int | None = None, **kw: object) -> SlurmJobView:
    """A view the way the dialects build it, from `BASE+FLAG+...` as in the doc."""
    raw = tuple(s.strip() for s in state.split("+"))
    base, flags = normalise_state(raw)
    return SlurmJobView.model_validate(
        {
            "job_id": 100,
            "het_job_id": 100 if offset is not None else None,
            "het_job_offset": offset,
            "raw_state": raw,
            "base_state": base,
            "flags": flags,
            **kw,
        }
    )


def het(*states: str, **kw: object) -> list[SlurmJobView]:
    return [view(s, offset=i, **kw) for i, s in enumerate(states)]


# -- the document ---------------------------------------------------------------------


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table as (header cells, body rows)."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    block: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if block:
            header, sep, *rows = block
            assert all(re.fullmatch(r":?-+:?", c) for c in sep), header
            tables.append((header, rows))
            block = []
    return tables


def _code(cell: str) -> str:
    m = re.fullmatch(r"`([^`]*)`", cell)
    assert m, f"expected a `code` cell, got {cell!r}"
    return m.group(1)


def _yes(cell: str) -> bool:
    assert cell in ("yes", "no"), cell
    return cell == "yes"


STATE_HEADER = ["Slurm state", "Phase", "Reason", "Final", "Infrastructure", "Note"]
HET_HEADER = ["Components", "Phase", "Reason", "Final", "Infrastructure", "Note"]

TABLES = _tables(DOC.read_text(encoding="utf-8"))
STATE_ROWS = [row for header, rows in TABLES if header == STATE_HEADER for row in rows]
HET_ROWS = [row for header, rows in TABLES if header == HET_HEADER for row in rows]
REASON_ROWS = [
    row for header, rows in TABLES if header == ["Slurm state_reason", "Reason"] for row in rows
]


def _expect(obs: Observation, row: list[str]) -> None:
    _, phase, reason, final, infra, _note = row
    assert (obs.phase.value, obs.reason, obs.final, obs.infrastructure) == (
        phase,
        _code(reason),
        _yes(final),
        _yes(infra),
    ), row


def test_the_document_has_its_tables() -> None:
    assert len([h for h, _ in TABLES if h == STATE_HEADER]) == 2
    assert HET_ROWS
    assert REASON_ROWS


@pytest.mark.parametrize("row", STATE_ROWS, ids=[r[0] for r in STATE_ROWS])
def test_state_table_row_matches_observe(row: list[str]) -> None:
    _expect(observe([view(_code(row[0]))]), row)


@pytest.mark.parametrize("row", HET_ROWS, ids=[r[0] for r in HET_ROWS])
def test_het_table_row_matches_observe(row: list[str]) -> None:
    _expect(observe(het(*_code(row[0]).split(" / "))), row)


@pytest.mark.parametrize("row", REASON_ROWS, ids=[r[0] for r in REASON_ROWS])
def test_queue_reason_row_matches_observe(row: list[str]) -> None:
    obs = observe([view("PENDING", reason=_code(row[0]))])
    assert obs.phase is Phase.QUEUED
    assert obs.reason == _code(row[1])


def test_every_base_state_and_flag_is_documented() -> None:
    states = [_code(r[0]).split("+") for r in STATE_ROWS]
    bases = [s[0] for s in states if len(s) == 1 and s[0] in BaseState.__members__]
    assert sorted(bases) == sorted(b.value for b in BaseState)  # once each, all of them
    flags = {f for s in states for f in s[1:]}
    assert flags >= DOC_FLAGS | set(FLAG_RULES)


def test_documented_precedence_is_the_code_s() -> None:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"the first in this order wins: ([A-Z_, \n]+)\.", text)
    assert m
    assert tuple(re.split(r",\s*", m.group(1).strip())) == FLAG_PRECEDENCE
    assert set(FLAG_PRECEDENCE) == set(FLAG_RULES)


def test_tables_cover_every_rule() -> None:
    assert set(BASE_STATE_RULES) == set(BaseState)
    for name, rule in FLAG_RULES.items():
        assert rule.applies_to, name
        assert re.fullmatch(CONDITION_REASON_RE, rule.reason)
    for base_rule in BASE_STATE_RULES.values():
        assert re.fullmatch(CONDITION_REASON_RE, base_rule.reason)


# -- messages, facts, times -------------------------------------------------------------


def test_suspended_keeps_native_sub_state_in_message() -> None:
    obs = observe([view("SUSPENDED")])
    assert (obs.phase, obs.reason) == (Phase.RUNNING, "Suspended")
    assert obs.message == "Slurm job is SUSPENDED (still owns its allocation)"
    assert obs.native_state == "SUSPENDED"


def test_v0038_stopped_string() -> None:
    obs = observe([view("STOPPED")])
    assert (obs.phase, obs.reason, obs.final) == (Phase.RUNNING, "Stopped", False)
    assert obs.native_state == "SUSPENDED"
    assert obs.native_flags == ["STOPPED"]
    assert "STOPPED" in obs.message


def test_completing_says_which_final_state_is_pending() -> None:
    obs = observe([view("COMPLETED+COMPLETING", exit=JobExit(return_code=0))])
    assert obs.message == "finishing: COMPLETED (exit code 0), epilog still running"
    assert not obs.final
    assert obs.finished_at is None


def test_failed_carries_exit_code_and_signal() -> None:
    obs = observe([view("FAILED", exit=JobExit(return_code=3))])
    assert (obs.exit_code, obs.signal) == (3, None)
    assert "exit code 3" in obs.message
    obs = observe([view("FAILED", exit=JobExit(signal=9))])
    assert (obs.exit_code, obs.signal) == (None, 9)
    assert "signal 9" in obs.message


def test_pending_reason_description_and_slurm_reason() -> None:
    obs = observe(
        [
            view(
                "PENDING",
                reason="ReqNodeNotAvail, UnavailableNodes:n[1-2]",
                description="nodes are down",
            )
        ]
    )
    assert obs.reason == "ReqNodeNotAvail"
    assert obs.slurm_reason == "ReqNodeNotAvail, UnavailableNodes:n[1-2]"
    assert "ReqNodeNotAvail, UnavailableNodes:n[1-2]" in obs.message
    assert "nodes are down" in obs.message
    assert observe([view("RUNNING", reason="None")]).slurm_reason is None


def test_flag_reason_beats_slurm_state_reason() -> None:
    obs = observe([view("PENDING+REQUEUE_HOLD", reason="JobHeldAdmin")])
    assert obs.reason == "RequeueHold"
    assert "JobHeldAdmin" in obs.message


def test_unknown_state_keeps_raw_string() -> None:
    obs = observe([view("WIBBLE")])
    assert (obs.phase, obs.final, obs.native_state) == (Phase.UNKNOWN, False, "WIBBLE")
    assert "WIBBLE" in obs.message
    empty = observe([SlurmJobView(job_id=1)])
    assert (empty.phase, empty.native_state) == (Phase.UNKNOWN, "")


def test_empty_views_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        observe([])


@pytest.mark.parametrize("shown", sorted(FLAG_SHOWN_AS_STATE))
def test_v0038_flags_shown_as_state_are_handled(shown: str) -> None:
    obs = observe([view(shown)])
    assert obs.final == (shown == "REVOKED")
    assert obs.phase is not Phase.UNKNOWN


def test_times_are_facts_only() -> None:
    expected: dict[str, Any] = {"start_time": T0, "end_time": T0 + timedelta(hours=1)}
    pending = observe([view("PENDING", **expected)])
    assert (pending.started_at, pending.finished_at) == (None, None)
    requeued = observe([view("PENDING+REQUEUED", **expected)])
    assert requeued.started_at is None
    running = observe([view("RUNNING", **expected)])
    assert (running.started_at, running.finished_at) == (T0, None)
    completing = observe([view("COMPLETED+COMPLETING", **expected)])
    assert completing.finished_at is None
    done = observe([view("COMPLETED", **expected)])
    assert (done.started_at, done.finished_at) == (T0, T0 + timedelta(hours=1))
    unknown = observe([view("WIBBLE", **expected)])
    assert unknown.started_at is None


def test_het_nodes_times_flags_and_leader_state() -> None:
    views = [
        view(
            "COMPLETED", offset=1, nodes="g[1-2]", start_time=T0, end_time=T0 + timedelta(hours=2)
        ),
        view(
            "FAILED+LAUNCH_FAILED",
            offset=0,
            nodes="c1",
            start_time=T0 + timedelta(minutes=1),
            end_time=T0 + timedelta(hours=1),
            exit=JobExit(return_code=1),
        ),
    ]
    obs = observe(views)
    assert obs.phase is Phase.FAILED
    assert (obs.reason, obs.infrastructure, obs.exit_code) == ("LaunchFailed", True, 1)
    assert obs.nodes == "c1,g[1-2]"  # by het offset
    assert obs.native_state == "FAILED"  # the leader's
    assert obs.native_flags == ["LAUNCH_FAILED"]
    assert (obs.started_at, obs.finished_at) == (T0, T0 + timedelta(hours=2))
    assert obs.message.startswith("component +0: ")
    assert "+1 COMPLETED" in obs.message


def test_het_exit_code_comes_from_first_failed_component() -> None:
    views = [
        view("COMPLETED", offset=0, exit=JobExit(return_code=0)),
        view("FAILED", offset=1, exit=JobExit(return_code=7)),
        view("FAILED", offset=2, exit=JobExit(return_code=9)),
    ]
    obs = observe(views)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 7)


def test_het_not_final_while_a_component_completes() -> None:
    obs = observe(het("COMPLETED", "COMPLETED+STAGE_OUT"))
    assert (obs.phase, obs.reason, obs.final) == (Phase.RUNNING, "StageOut", False)
    assert obs.native_flags == ["STAGE_OUT"]


# -- properties --------------------------------------------------------------------------

KNOWN_FLAGS = sorted(
    set(FLAG_RULES) | {"EXPEDITING", "UPDATE_DB", "RECONFIG_FAIL", "POWER_UP_NODE", "WIBBLE"}
)
bases = st.sampled_from([b.value for b in BaseState] + ["WIBBLE"])
states = st.builds(
    lambda base, flags: "+".join([base, *flags]),
    bases,
    st.lists(st.sampled_from(KNOWN_FLAGS), max_size=3, unique=True),
)
NEVER = {Phase.PENDING, Phase.SUBMITTING}


@given(states)
def test_single_view_invariants(state: str) -> None:
    v = view(state)
    obs = observe([v])
    assert obs.final == v.is_final
    assert obs.phase.is_terminal == obs.final
    assert obs.phase not in NEVER
    assert re.fullmatch(CONDITION_REASON_RE, obs.reason)
    assert not obs.infrastructure or obs.phase is Phase.FAILED
    assert obs.native_flags == sorted(obs.native_flags)
    assert (obs.phase is Phase.UNKNOWN) == (v.base_state is None)


@given(st.lists(states, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_het_invariants(components: list[str], rnd: random.Random) -> None:
    views = het(*components)
    obs = observe(views)
    parts = [observe([v]) for v in views]
    assert obs.final == all(v.is_final for v in views)
    assert obs.phase.is_terminal == obs.final
    assert obs.phase not in NEVER
    if obs.final:
        phases = [p.phase for p in parts]
        if Phase.FAILED in phases:
            first = next(p for p in parts if p.phase is Phase.FAILED)
            assert (obs.phase, obs.reason, obs.exit_code) == (
                Phase.FAILED,
                first.reason,
                first.exit_code,
            )
            assert obs.infrastructure == any(p.infrastructure for p in parts)
        elif Phase.CANCELLED in phases:
            assert obs.phase is Phase.CANCELLED
        else:
            assert obs.phase is Phase.SUCCEEDED
    elif any(p.phase is Phase.RUNNING for p in parts):
        assert obs.phase is Phase.RUNNING
    shuffled = list(views)
    rnd.shuffle(shuffled)
    assert observe(shuffled) == obs  # het offset, not list order, decides


@given(st.text(max_size=60))
def test_reason_from_slurm_is_always_a_valid_condition_reason(text: str) -> None:
    reason = reason_from_slurm(text, "Pending")
    assert re.fullmatch(CONDITION_REASON_RE, reason)
    assert len(reason) <= 128


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (None, "Pending"),
        ("", "Pending"),
        ("   ", "Pending"),
        ("None", "Pending"),
        ("123", "Pending"),
        ("Nodes_required_for_job_are_DOWN,_DRAINED", "NodesRequiredForJobAreDOWN"),
        ("BeginTime", "BeginTime"),
        ("3rd party", "RdParty"),
    ],
)
def test_reason_from_slurm(text: str | None, reason: str) -> None:
    assert reason_from_slurm(text, "Pending") == reason
