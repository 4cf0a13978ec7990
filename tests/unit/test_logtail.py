"""Cutting a log tail to `SLURMJOB_STATUS_TAIL_BYTES`: whole lines, whole characters, never
more than the cap, always the end of what was read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmjob_operator.api.status import Logs, LogTail
from slurmjob_operator.core.logtail import capped_logs, capped_tail, count_lines


def tail(text: str, size: int | None = None) -> LogTail:
    return LogTail(
        tail=text, bytes=size or len(text.encode()), lines=count_lines(text), truncated=False
    )


@pytest.mark.parametrize(
    ("text", "cap", "kept"),
    [
        ("a\nb\n", 16, "a\nb\n"),  # fits: unchanged
        ("line one\nline two\n", 10, "line two\n"),  # the partial first line is dropped
        ("0123456789\nab\n", 3, "ab\n"),  # the cut falls right after a newline
        ("x" * 40, 8, "x" * 8),  # one long line: its end
        ("é" * 10, 5, "éé"),  # a character split by the cut is dropped, not garbled
        ("aaaa\nbbbb", 6, "bbbb"),  # no final newline
    ],
)
def test_cut_table(text: str, cap: int, kept: str) -> None:
    result = capped_tail(tail(text), cap)
    assert result.tail == kept
    assert result.truncated is (kept != text)
    assert result.lines == count_lines(kept)
    assert result.bytes == len(text.encode()), "the file's size is kept"


def test_a_cut_tail_stays_truncated_and_keeps_the_file_size() -> None:
    read = LogTail(tail="a\n" * 100, truncated=True, bytes=10**10, lines=100)
    result = capped_tail(read, 10)
    assert result.truncated
    assert result.bytes == 10**10
    assert result.tail == "a\n" * 5


def test_both_streams_are_cut_and_a_missing_one_stays_missing() -> None:
    logs = capped_logs(Logs(stdout=tail("o" * 20 + "\n"), stderr=None), 8)
    assert logs.stdout is not None
    assert len(logs.stdout.tail.encode()) <= 8
    assert logs.stderr is None


def test_a_cap_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        capped_tail(tail("x"), 0)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400), st.integers(1, 200))
def test_never_more_than_the_cap_and_always_the_end(text: str, cap: int) -> None:
    result = capped_tail(tail(text), cap)
    assert len(result.tail.encode()) <= max(cap, 0)
    assert text.endswith(result.tail)
    if result.tail != text:
        cut = text[: len(text) - len(result.tail)]
        # Whole lines whenever the kept part starts a line somewhere within the cap.
        assert cut.endswith("\n") or "\n" not in result.tail[:-1]
    assert capped_tail(result, cap) == result, "cutting twice changes nothing"
