"""State and exit-code normalisation: the rules every dialect relies on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.core.jobview import (
    BaseState,
    JobStateEntry,
    SlurmJobView,
    normalise_state,
    split_wait_status,
    state_is_final,
)

B = BaseState


@pytest.mark.parametrize(
    ("raw", "base", "flags", "final"),
    [
        # v0.0.38 single strings: base states
        ("PENDING", B.PENDING, set(), False),
        ("RUNNING", B.RUNNING, set(), False),
        ("SUSPENDED", B.SUSPENDED, set(), False),
        ("COMPLETED", B.COMPLETED, set(), True),
        ("CANCELLED", B.CANCELLED, set(), True),
        ("FAILED", B.FAILED, set(), True),
        ("TIMEOUT", B.TIMEOUT, set(), True),
        ("NODE_FAIL", B.NODE_FAIL, set(), True),
        ("PREEMPTED", B.PREEMPTED, set(), True),
        ("BOOT_FAIL", B.BOOT_FAIL, set(), True),
        ("DEADLINE", B.DEADLINE, set(), True),
        ("OUT_OF_MEMORY", B.OUT_OF_MEMORY, set(), True),
        # v0.0.38 flags shown instead of the base state
        ("COMPLETING", B.RUNNING, {"COMPLETING"}, False),
        ("STAGE_OUT", B.RUNNING, {"STAGE_OUT"}, False),
        ("CONFIGURING", B.RUNNING, {"CONFIGURING"}, False),
        ("SIGNALING", B.RUNNING, {"SIGNALING"}, False),
        ("RESIZING", B.RUNNING, {"RESIZING"}, False),
        ("REQUEUED", B.PENDING, {"REQUEUED"}, False),
        ("REQUEUE_HOLD", B.PENDING, {"REQUEUE_HOLD"}, False),
        ("REQUEUE_FED", B.PENDING, {"REQUEUE_FED"}, False),
        ("RESV_DEL_HOLD", B.PENDING, {"RESV_DEL_HOLD"}, False),
        ("SPECIAL_EXIT", B.PENDING, {"SPECIAL_EXIT"}, False),
        ("STOPPED", B.SUSPENDED, {"STOPPED"}, False),
        ("REVOKED", B.CANCELLED, {"REVOKED"}, True),
        # unknown strings: kept, never final
        ("WIBBLE", None, {"WIBBLE"}, False),
        ("", None, set(), False),
        # v0.0.40+ lists
        (["RUNNING"], B.RUNNING, set(), False),
        (["COMPLETED", "COMPLETING"], B.COMPLETED, {"COMPLETING"}, False),
        (["FAILED", "STAGE_OUT"], B.FAILED, {"STAGE_OUT"}, False),
        (["PENDING", "REQUEUED"], B.PENDING, {"REQUEUED"}, False),
        (["CANCELLED", "LAUNCH_FAILED"], B.CANCELLED, {"LAUNCH_FAILED"}, True),
        (["TIMEOUT", "EXPEDITING"], B.TIMEOUT, {"EXPEDITING"}, True),
        (["COMPLETING"], B.RUNNING, {"COMPLETING"}, False),
        (["NEW_FLAG"], None, {"NEW_FLAG"}, False),
        ([], None, set(), False),
        ("failed", B.FAILED, set(), True),
    ],
)
def test_state_table(
    raw: str | list[str], base: BaseState | None, flags: set[str], final: bool
) -> None:
    got_base, got_flags = normalise_state(raw)
    assert got_base == base
    assert got_flags == frozenset(flags)
    assert state_is_final(got_base, got_flags) is final


def test_none_state() -> None:
    assert normalise_state(None) == (None, frozenset())


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (0, (0, None)),
        (768, (3, None)),  # exit 3
        (1792, (7, None)),  # exit 7
        (15, (None, 15)),  # killed by SIGTERM
        (9 | 0x80, (None, 9)),  # SIGKILL with core dump bit
        (None, (None, None)),
        (-1, (None, None)),
    ],
)
def test_wait_status(status: int | None, expected: tuple[int | None, int | None]) -> None:
    assert split_wait_status(status) == expected


@given(st.integers(min_value=0, max_value=255))
def test_wait_status_roundtrip_exit(code: int) -> None:
    assert split_wait_status(code << 8) == (code, None)


@given(st.integers(min_value=1, max_value=0x7E))
def test_wait_status_roundtrip_signal(sig: int) -> None:
    assert split_wait_status(sig) == (None, sig)


@given(st.lists(st.sampled_from([*BaseState, "COMPLETING", "STAGE_OUT", "REQUEUED", "X"])))
def test_final_needs_known_inactive_base(raw: list[str]) -> None:
    base, flags = normalise_state(raw)
    if state_is_final(base, flags):
        assert base is not None
        assert base not in (B.PENDING, B.RUNNING, B.SUSPENDED)
        assert not flags & {"COMPLETING", "STAGE_OUT", "CONFIGURING"}


def test_view_properties() -> None:
    view = SlurmJobView(job_id=7, base_state=B.COMPLETED, het_job_id=6, het_job_offset=1)
    assert view.is_final
    assert view.is_heterogeneous
    assert not SlurmJobView(job_id=1).is_final


def test_state_entry_component_id() -> None:
    entry = JobStateEntry(raw_job_id="123+1", job_id=123, het_job_offset=1)
    assert entry.component_job_id == 124
