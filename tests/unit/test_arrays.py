"""Job arrays in the pure core: index lists, Slurm's task strings, the tasks of an attempt
folded into one observation, the indices a retry submits, and the captured answers of Slurm
26.05.5 for an array (tests/data/slurm-captures/slurm-26.05.5) read by the dialect."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.api.status import ArrayAttempt, Attempt, Phase, SlurmJobStatus, TaskEnd
from slurmjob_operator.core.arrays import (
    array_total,
    next_indices,
    observe_array,
    shown_index,
    tasks_of,
)
from slurmjob_operator.core.decisions import adoption, belongs
from slurmjob_operator.core.following import observed_array
from slurmjob_operator.core.indices import compact, expand, slurm_array, task_string
from slurmjob_operator.core.jobview import BaseState, JobExit, SlurmJobView, by_leader, leader
from slurmjob_operator.core.reconcile import record_attempt
from slurmjob_operator.slurm.dialects import dialect_for
from slurmjob_operator.slurm.dialects.common import parse_state_entry

from .slurm_fakes import capture
from .test_states import TABLES, _code, _yes

NOW = datetime(2026, 12, 1, 18, 30, tzinfo=UTC)

# -- index lists ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("indices", "text"),
    [
        ([], ""),
        ([0], "0"),
        (list(range(20)), "0-19"),
        ([13, 5], "5,13"),
        ([0, 1, 2, 5, 7, 8, 8], "0-2,5,7-8"),
    ],
)
def test_compact(indices: list[int], text: str) -> None:
    assert compact(indices) == text
    assert expand(text) == sorted(set(indices))


@given(st.sets(st.integers(0, 9_999), max_size=300))
def test_compact_round_trips(indices: set[int]) -> None:
    assert expand(compact(indices)) == sorted(indices)


@pytest.mark.parametrize(
    "text",
    ["x", "1-", "-1", "3-1", "1,,2", " 1", "1 ", "\u0663", "1-99999999", "10000", "0-10000", "1;2"],
)
def test_expand_refuses_what_compact_never_writes(text: str) -> None:
    with pytest.raises(ValueError, match=r"index|backwards|bounds"):
        expand(text)


def test_expand_is_bounded() -> None:
    with pytest.raises(ValueError, match="too long"):
        expand("1," * 40_000)
    with pytest.raises(ValueError, match="out of bounds"):
        expand("0-19", below=10)


def test_slurm_array() -> None:
    assert slurm_array(range(20), 3) == "0-19%3"
    assert slurm_array([13, 5], None) == "5,13"
    with pytest.raises(ValueError, match="at least one"):
        slurm_array([], 3)


@pytest.mark.parametrize(
    ("text", "within", "named"),
    [
        ("2-5%2", range(6), {2, 3, 4, 5}),  # captured
        ("[1,3-9:2]", range(10), {1, 3, 5, 7, 9}),
        ("5,13%3", range(20), {5, 13}),
        ("0-4294967294", range(3), {0, 1, 2}),  # clipped, never expanded
        ("0-99999:1", [5, 99_998], {5, 99_998}),
        ("", range(3), set()),
        (None, range(3), set()),
        ("2-x", range(6), set()),
        ("5-2", range(6), set()),
        ("1-9:0", range(10), set()),
        ("2-5%2", [], set()),
        ("\u0662-\u0665", range(6), set()),  # ARABIC-INDIC digits: int() would read them
    ],
)
def test_task_string(text: str | None, within: Any, named: set[int]) -> None:
    assert task_string(text, within) == named


def test_task_string_work_is_bounded_by_its_inputs() -> None:
    hostile = ",".join(f"{i}-{i + 1_000_000}" for i in range(0, 10_000, 2))
    assert task_string(hostile, range(10)) == frozenset(range(10))
    assert task_string("1-9:2," * 100, range(10)) == frozenset()  # too many stepped ranges


# -- what the dialect makes of the captured answers --------------------------------------------


def _views(name: str) -> list[SlurmJobView]:
    return list(dialect_for("v0.0.45").parse_jobs(capture(name)))


def test_the_captured_running_array_is_read_task_by_task() -> None:
    views = _views("resp_get_array_running.json")
    own = next(v for v in views if v.job_id == 1)
    assert own.array_job_id == 1
    assert own.array_task_id is None  # {set: false}: the array's own, pending record
    assert own.array_tasks == "2-5%2"
    assert own.reason == "JobArrayTaskLimit"
    started = sorted((v.job_id, v.array_task_id) for v in views if v.job_id != 1)
    assert started == [(2, 0), (3, 1)]
    assert all(v.array_tasks is None for v in views if v.job_id != 1)
    assert set(by_leader(views)) == {1}
    assert leader(views).job_id == 1
    assert {i: v.job_id for i, v in tasks_of(views, range(6)).items()} == {
        0: 2,
        1: 3,
        2: 1,
        3: 1,
        4: 1,
        5: 1,
    }


def test_the_captured_state_entries_name_the_tasks() -> None:
    entries = [
        parse_state_entry(j["job_id"], j["state"])
        for j in capture("resp_state_array_running.json")["jobs"]
    ]
    assert sorted((e.job_id, e.array_task) for e in entries) == [
        (1, "2"),
        (1, "3"),
        (1, "4"),
        (1, "5"),
        (2, "0"),
        (3, "1"),
    ]


ALL_SIX = ArrayAttempt(indices="0-5")


def test_the_captured_running_array_is_running() -> None:
    seen = observe_array(_views("resp_get_array_running.json"), ALL_SIX, total=6)
    obs = seen.observation
    assert (obs.phase, obs.reason, obs.final) == (Phase.RUNNING, "Running", False)
    assert obs.message.startswith("array: 0/6 tasks succeeded, 2 running, 4 pending, 0 failed")
    assert obs.nodes == "n1"
    status = seen.status(6)
    assert (status.total, status.pending, status.running, status.succeeded) == (6, 4, 2, 0)
    assert status.log_index == 0
    assert seen.record == ALL_SIX


def test_the_captured_ended_array_failed_on_task_2() -> None:
    seen = observe_array(_views("resp_get_array_done.json"), ALL_SIX, total=6)
    obs = seen.observation
    assert (obs.phase, obs.reason, obs.final) == (Phase.FAILED, "NonZeroExitCode", True)
    assert (obs.exit_code, obs.native_state) == (3, "FAILED")
    assert "task 2:" in obs.message
    assert seen.record.succeeded == "0-1,3-5"
    assert seen.record.failed == "2"
    assert seen.record.first_failed is not None
    assert seen.record.first_failed.exit_code == 3
    status = seen.status(6)
    assert (status.succeeded, status.failed, status.failed_indices) == (5, 1, "2")
    assert seen.log_index == 2
    assert obs.finished_at is not None
    assert obs.started_at is not None


# -- folding tasks: tables ----------------------------------------------------------------------


def task(index: int | None, state: str, code: int | None = None, **extra: Any) -> SlurmJobView:
    job_id = 1 if index is None else 10 + index
    ended = state not in ("PENDING", "RUNNING")
    values: dict[str, Any] = {
        "job_id": job_id,
        "array_job_id": 1,
        "array_task_id": index,
        "name": "sj-a",
        "raw_state": (state,),
        "base_state": BaseState(state),
        "exit": JobExit(return_code=code if ended else None),
        "nodes": "n1" if state == "RUNNING" else None,
    }
    values.update(extra)
    return SlurmJobView(**values)


def pending(text: str) -> SlurmJobView:
    return task(None, "PENDING", array_tasks=text, reason="JobArrayTaskLimit")


@pytest.mark.parametrize(
    ("views", "phase", "counts"),
    [
        ([pending("0-3%2")], Phase.QUEUED, (4, 0, 0, 0, 0)),
        ([task(0, "RUNNING"), pending("1-3%2")], Phase.RUNNING, (3, 1, 0, 0, 0)),
        (
            [task(0, "COMPLETED", 0), task(1, "FAILED", 3), pending("2-3")],
            Phase.QUEUED,
            (2, 0, 1, 1, 0),
        ),
        ([task(i, "COMPLETED", 0) for i in range(4)], Phase.SUCCEEDED, (0, 0, 4, 0, 0)),
        (
            [
                task(0, "COMPLETED", 0),
                task(1, "FAILED", 3),
                task(2, "CANCELLED"),
                task(3, "FAILED", 1),
            ],
            Phase.FAILED,
            (0, 0, 1, 2, 1),
        ),
        (
            [
                task(0, "COMPLETED", 0),
                task(1, "CANCELLED"),
                task(2, "COMPLETED", 0),
                task(3, "PREEMPTED"),
            ],
            Phase.CANCELLED,
            (0, 0, 2, 0, 2),
        ),
        # Task 3 neither in the answer nor remembered: not final, Unknown.
        ([task(i, "COMPLETED", 0) for i in range(3)], Phase.UNKNOWN, (1, 0, 3, 0, 0)),
        # COMPLETING holds the task's nodes: not ended yet.
        (
            [
                task(
                    0,
                    "COMPLETED",
                    0,
                    raw_state=("COMPLETED", "COMPLETING"),
                    flags=frozenset({"COMPLETING"}),
                )
            ]
            + [task(i, "COMPLETED", 0) for i in range(1, 4)],
            Phase.RUNNING,
            (0, 1, 3, 0, 0),
        ),
    ],
)
def test_tasks_fold_into_one_phase(
    views: list[SlurmJobView], phase: Phase, counts: tuple[int, ...]
) -> None:
    seen = observe_array(views, ArrayAttempt(indices="0-3"), total=4)
    status = seen.status(4)
    assert seen.observation.phase is phase
    assert (
        status.pending,
        status.running,
        status.succeeded,
        status.failed,
        status.cancelled,
    ) == counts
    assert seen.observation.final == phase.is_terminal


def test_the_first_failed_task_decides_and_shows_its_logs() -> None:
    views = [
        task(0, "COMPLETED", 0),
        task(1, "CANCELLED"),
        task(2, "FAILED", 7),
        task(3, "FAILED", 9),
    ]
    seen = observe_array(views, ArrayAttempt(indices="0-3"), total=4)
    assert seen.observation.exit_code == 7
    assert seen.log_index == 2
    assert seen.status(4).failed_indices == "1-3"


def test_an_ended_task_slurm_forgot_is_remembered() -> None:
    first = observe_array(
        [task(0, "FAILED", 3), task(1, "RUNNING"), pending("2-3")],
        ArrayAttempt(indices="0-3"),
        total=4,
    )
    assert first.record.failed == "0"
    # Task 0's record is purged (MinJobAge) while the rest runs, then ends.
    later = [task(1, "COMPLETED", 0), task(2, "COMPLETED", 0), task(3, "COMPLETED", 0)]
    seen = observe_array(later, first.record, total=4)
    assert seen.observation.phase is Phase.FAILED
    assert seen.observation.exit_code == 3, "the remembered end of task 0 decides"
    assert seen.status(4).failed_indices == "0"
    assert not seen.unseen


def test_indices_outside_the_attempt_are_ignored() -> None:
    views = [task(5, "COMPLETED", 0), task(13, "COMPLETED", 0), task(6, "FAILED", 1)]
    seen = observe_array(views, ArrayAttempt(indices="5,13"), total=20)
    assert seen.observation.phase is Phase.SUCCEEDED
    assert seen.status(20).succeeded == 20


def test_a_hostile_record_cannot_make_tasks_end() -> None:
    forged = ArrayAttempt(indices="0-3", succeeded="0-99", failed="x", cancelled="2-1")
    seen = observe_array([task(1, "RUNNING")], forged, total=4)
    assert seen.record.succeeded == "0-3"  # only the attempt's own indices
    assert seen.observation.final


# -- a property: any mix of task ends ------------------------------------------------------------

END_STATES = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PENDING", "RUNNING"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(END_STATES), min_size=1, max_size=30))
def test_any_mix_of_task_states(states: list[str]) -> None:
    n = len(states)
    views = [task(i, s, 0 if s == "COMPLETED" else 1) for i, s in enumerate(states)]
    seen = observe_array(views, ArrayAttempt(indices=compact(range(n))), total=n)
    obs, status = seen.observation, seen.status(n)
    assert (
        status.pending + status.running + status.succeeded + status.failed + status.cancelled == n
    )
    live = {"PENDING", "RUNNING"} & set(states)
    assert obs.final == (not live)
    assert (obs.phase is Phase.SUCCEEDED) == (set(states) == {"COMPLETED"})
    failing = {"FAILED", "TIMEOUT", "NODE_FAIL"}
    if obs.final:
        assert (obs.phase is Phase.FAILED) == bool(failing & set(states))
        unsuccessful = [i for i, s in enumerate(states) if s != "COMPLETED"]
        assert expand(status.failed_indices) == unsuccessful
        attempt = Attempt(number=1, job_name="sj-a", job_id=1, array=seen.record)
        retried = next_indices([attempt], n)
        assert retried == unsuccessful  # never the whole range again: it succeeded
        if unsuccessful:
            assert seen.log_index == unsuccessful[0] or states[seen.log_index] in failing
    elif "RUNNING" in states:
        assert obs.phase is Phase.RUNNING


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), min_size=2, max_size=25), st.integers(1, 4))
def test_retries_end_succeeded_only_when_every_task_did(fails: list[bool], rounds: int) -> None:
    """Attempt after attempt, each failing task of the first succeeds in a later round; the
    resource is Succeeded exactly when nothing failed in its last attempt, and every attempt
    after the first submits exactly the previous one's failures."""
    n = len(fails)
    failing = {i for i, f in enumerate(fails) if f}
    status = SlurmJobStatus()
    failing_then: set[int] = set()
    for number in range(1, rounds + 1):
        indices = next_indices(status.attempts, n)
        if number > 1:
            assert set(indices) == failing_then
        status = record_attempt(
            status,
            number=number,
            job_name=f"sj-a-a{number}",
            staging_dir="/x",
            generation=1,
            now=NOW,
            array_indices=indices,
        ).status
        status = status.model_copy(
            update={
                "attempts": [
                    *status.attempts[:-1],
                    status.attempts[-1].model_copy(update={"job_id": number}),
                ]
            }
        )
        # In round r, a failing task fails again only while r is not its last round.
        failing_then = {i for i in indices if i in failing and number < rounds}
        views = [
            task(i, "FAILED" if i in failing_then else "COMPLETED", 1 if i in failing_then else 0)
            for i in indices
        ]
        array = status.attempts[-1].array
        assert array is not None
        seen = observe_array(views, array, total=array_total(status.attempts))
        status = observed_array(status, seen, 1, NOW).status
        assert status.array is not None
        assert status.array.total == n
        assert status.array.succeeded == n - len(failing_then)
        if not failing_then:
            break
    assert (status.phase is Phase.SUCCEEDED) == (not failing_then)
    assert shown_index(status) is not None


# -- which indices an attempt submits -----------------------------------------------------------


def _attempt(number: int, indices: str, *, job_id: int | None = 1, **array: Any) -> Attempt:
    return Attempt(
        number=number,
        job_name=f"sj-a{number}",
        job_id=job_id,
        array=ArrayAttempt(indices=indices, **array),
    )


@pytest.mark.parametrize(
    ("attempts", "count", "expected"),
    [
        ([], 20, list(range(20))),
        ([Attempt(number=1, job_name="plain", job_id=1)], 3, [0, 1, 2]),
        ([_attempt(1, "0-19", succeeded="0-4,6-12,14-19", failed="5,13")], 20, [5, 13]),
        ([_attempt(1, "0-19", succeeded="0-4,6-12,14-19", cancelled="5,13")], 20, [5, 13]),
        # Never reached Slurm (proven absent, declared lost): the same tasks again.
        ([_attempt(2, "5,13", job_id=None)], 20, [5, 13]),
        # A status naming tasks beyond the array: never widens it.
        ([_attempt(1, "0-40", succeeded="0-9")], 20, list(range(10, 20))),
        ([_attempt(1, "garbage")], 4, [0, 1, 2, 3]),
        # spec.array.count lowered below every task left: nothing (the submit refuses it),
        # never the whole range again.
        ([_attempt(1, "0-9", succeeded="0-6", failed="7-9")], 5, []),
    ],
)
def test_next_indices(attempts: list[Attempt], count: int, expected: list[int]) -> None:
    assert next_indices(attempts, count) == expected


def test_record_attempt_names_its_tasks() -> None:
    status = record_attempt(
        SlurmJobStatus(attempts=[_attempt(1, "0-19", succeeded="0-4,6-12,14-19", failed="5,13")]),
        number=2,
        job_name="sj-a2",
        staging_dir="/x",
        generation=1,
        now=NOW,
        array_indices=[5, 13],
    ).status
    assert status.attempts[-1].array == ArrayAttempt(indices="5,13")
    assert status.array is not None
    assert (status.array.total, status.array.pending, status.array.succeeded) == (20, 2, 18)
    plain = record_attempt(
        status, number=3, job_name="p", staging_dir="/x", generation=1, now=NOW
    ).status
    assert plain.attempts[-1].array is None
    assert plain.array is None


def test_a_status_without_the_array_fields_is_a_plain_job() -> None:
    old = SlurmJobStatus.parse(
        {"phase": "Running", "attempts": [{"number": 1, "jobName": "sj-x", "jobId": 7}]}
    )
    assert old.array is None
    assert old.attempts[0].array is None
    assert shown_index(old) is None


# -- adoption and identity -----------------------------------------------------------------------


def test_an_arrays_tasks_belong_to_its_attempt_and_adopt_as_one_job() -> None:
    from slurmjob_operator.core import naming

    comment = naming.comment("team-a", "sweep", "u-1", 1)
    attempt = Attempt(number=1, job_name="sj-a", array=ArrayAttempt(indices="0-5"))
    views = [
        v.model_copy(update={"comment": comment}) for v in _views("resp_get_array_running.json")
    ]
    views = [v.model_copy(update={"name": "sj-a"}) for v in views]
    decision = adoption(views, "u-1", attempt, staged=True)
    assert decision.keep is not None
    assert decision.keep.job_id == 1
    assert decision.duplicates == ()
    adopted = attempt.model_copy(update={"job_id": 1})
    assert all(belongs(v, "u-1", adopted) for v in views)
    other = adopted.model_copy(update={"job_id": 2})
    assert not any(belongs(v, "u-1", other) for v in views)


def test_task_end_keeps_few_flags() -> None:
    end = TaskEnd(index=3, native_flags=["A"] * 32)
    assert len(end.native_flags) == 32


# -- docs/states.md: the array table is checked against observe_array -----------------------------

ARRAY_HEADER = ["Tasks", "Phase", "Reason", "Final", "Infrastructure", "Note"]
ARRAY_ROWS = [row for header, rows in TABLES if header == ARRAY_HEADER for row in rows]


def _doc_task(index: int, word: str) -> SlurmJobView | None:
    if word == "GONE":
        return None
    base, *flags = word.split("+")
    ended = base not in ("PENDING", "RUNNING")
    return task(
        index,
        base,
        (0 if base == "COMPLETED" else 1) if ended else None,
        raw_state=(base, *flags),
        flags=frozenset(flags),
    )


def test_the_document_has_an_array_table() -> None:
    assert len(ARRAY_ROWS) >= 10


@pytest.mark.parametrize("row", ARRAY_ROWS, ids=[r[0] for r in ARRAY_ROWS])
def test_array_table_row_matches_observe_array(row: list[str]) -> None:
    words = _code(row[0]).split(" / ")
    views = [v for i, w in enumerate(words) if (v := _doc_task(i, w)) is not None]
    attempt = ArrayAttempt(indices=compact(range(len(words))))
    obs = observe_array(views, attempt, total=len(words)).observation
    _, phase, reason, final, infra, _note = row
    assert (obs.phase.value, obs.reason, obs.final, obs.infrastructure) == (
        phase,
        _code(reason),
        _yes(final),
        _yes(infra),
    ), row


def test_v38_array_records() -> None:
    """v0.0.38 (Slurm 22.05) sends plain integers: the array's own record says NO_VAL for its
    task id while it stands for pending tasks. Records made after the 22.05 schema's
    `job_response_properties` (array_job_id, array_task_id, array_task_string); not captured."""
    base: dict[str, Any] = {
        "name": "sj-a",
        "job_state": "PENDING",
        "array_job_id": 7,
        "array_task_string": "2-5%2",
    }
    payload = {
        "jobs": [
            {**base, "job_id": 7, "array_task_id": 4294967294},
            {
                **base,
                "job_id": 8,
                "array_task_id": 0,
                "job_state": "RUNNING",
                "array_task_string": "",
            },
            {"job_id": 9, "name": "plain", "job_state": "RUNNING", "array_job_id": 0},
        ]
    }
    own, started, plain = dialect_for("v0.0.38").parse_jobs(payload)
    assert (own.array_job_id, own.array_task_id, own.array_tasks) == (7, None, "2-5%2")
    assert (started.array_job_id, started.array_task_id, started.array_tasks) == (7, 0, None)
    assert (plain.array_job_id, plain.array_task_id) == (None, None)
    assert set(by_leader([own, started, plain])) == {7, 9}
    assert sorted(tasks_of([own, started], range(6))) == [0, 2, 3, 4, 5]
