"""Bounded log tails: caps, cuts, UTF-8, redaction, memory."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmjob_operator.api.status import Logs, LogTail
from slurmjob_operator.storage import logs
from slurmjob_operator.storage.logs import (
    UnsafePath,
    read_logs,
    read_tail,
    redact_text,
    tail_signatures,
)

MB = 1024 * 1024


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


ME = os.geteuid()


def tail_of(path: Path, **kwargs: Any) -> LogTail | None:
    """`read_tail` with the file's directory as the (trusted) root and this process as owner."""
    return read_tail(path, root=path.parent, owner=ME, **kwargs)


def logs_of(stdout: Path, stderr: Path | None, *args: Any, **kwargs: Any) -> Logs:
    return read_logs(stdout, stderr, *args, root=stdout.parent, owner=ME, **kwargs)


class ReadSpy:
    """Records every positioned read `read_tail` makes (its size)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[int] = []
        real_pread = os.pread

        def pread(fd: int, n: int, offset: int) -> bytes:
            self.reads.append(n)
            return real_pread(fd, n, offset)

        monkeypatch.setattr(os, "pread", pread)


# -- basics ------------------------------------------------------------------------------


def test_missing_file_is_none(tmp_path: Path) -> None:
    assert tail_of(tmp_path / "nope.out") is None
    assert read_tail(tmp_path / "no-dir" / "a.out", root=tmp_path, owner=ME) is None


def test_a_file_where_a_directory_should_be_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "file", "x")
    with pytest.raises(UnsafePath, match="not a directory"):
        read_tail(tmp_path / "file" / "below", root=tmp_path, owner=ME)


def test_a_path_outside_the_root_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", "x\n")
    with pytest.raises(UnsafePath, match="not below the storage root"):
        read_tail(p, root=tmp_path / "other", owner=ME)
    with pytest.raises(UnsafePath, match="not a path below"):
        read_tail(tmp_path / "d" / ".." / "a.out", root=tmp_path, owner=ME)


def test_small_file_whole(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", "one\ntwo\nthree\n")
    assert tail_of(p) == LogTail(tail="one\ntwo\nthree\n", truncated=False, bytes=14, lines=3)


def test_last_line_without_newline_counts(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", "one\ntwo")
    tail = tail_of(p)
    assert tail is not None
    assert (tail.tail, tail.lines, tail.truncated) == ("one\ntwo", 2, False)


def test_empty_file(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", b"")
    assert tail_of(p) == LogTail(tail="", truncated=False, bytes=0, lines=0)


def test_caps_must_be_positive(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", "x\n")
    with pytest.raises(ValueError, match="at least 1"):
        tail_of(p, max_bytes=0)
    with pytest.raises(ValueError, match="at least 1"):
        tail_of(p, max_lines=0)


# -- the byte cap ------------------------------------------------------------------------


def test_exactly_at_the_byte_limit_is_whole(tmp_path: Path) -> None:
    line = b"0123456789abcde\n"  # 16 bytes
    p = write(tmp_path / "a.out", line * 64)  # 1024 bytes
    tail = tail_of(p, max_bytes=1024)
    assert tail is not None
    assert (tail.truncated, tail.lines, tail.bytes) == (False, 64, 1024)
    assert tail.tail == (line * 64).decode()


def test_one_byte_over_on_a_line_boundary_drops_only_that_line(tmp_path: Path) -> None:
    body = b"0123456789abcde\n" * 64
    p = write(tmp_path / "a.out", b"\n" + body)  # the cut falls right after a newline
    tail = tail_of(p, max_bytes=len(body))
    assert tail is not None
    assert tail.tail == body.decode()
    assert (tail.truncated, tail.lines, tail.bytes) == (True, 64, len(body) + 1)


def test_mid_line_cut_drops_the_partial_line(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", "first line here\nsecond\nthird\n")
    tail = tail_of(p, max_bytes=16)  # starts inside "first line here"'s end
    assert tail is not None
    assert tail.tail == "second\nthird\n"
    assert (tail.truncated, tail.lines) == (True, 2)


def test_one_long_line_keeps_its_end(tmp_path: Path) -> None:
    # A progress bar without newlines: dropping "the partial line" would leave nothing.
    p = write(tmp_path / "a.out", "x" * 1000 + "\rdone")
    tail = tail_of(p, max_bytes=100)
    assert tail is not None
    assert tail.tail == ("x" * 1000 + "\rdone")[-100:]
    assert (tail.truncated, tail.lines) == (True, 1)


def test_multibyte_character_split_at_the_cut(tmp_path: Path) -> None:
    text = "é" * 100  # two bytes each, no newline: the single-line path
    p = write(tmp_path / "a.out", text)
    tail = tail_of(p, max_bytes=51)  # the cut lands inside a character
    assert tail is not None
    assert tail.tail == "é" * 25
    assert "\ufffd" not in tail.tail
    # With lines, a character split by the cut is in the dropped partial line.
    p = write(tmp_path / "b.out", "€€€€\nzwölf €\n")
    tail = tail_of(p, max_bytes=len("€\nzwölf €\n".encode()) + 1)
    assert tail is not None
    assert tail.tail == "zwölf €\n"


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", b"ok \xff\xfe bytes\n")
    tail = tail_of(p)
    assert tail is not None
    assert tail.tail == "ok \ufffd\ufffd bytes\n"


def test_huge_file_is_read_with_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "huge.out"
    with p.open("wb") as f:
        f.truncate(50 * MB)  # sparse: 50 MB of NULs without writing them
        f.seek(50 * MB)
        f.write(b"".join(b"line %06d\n" % i for i in range(20000)))
    size = p.stat().st_size
    spy = ReadSpy(monkeypatch)
    tracemalloc.start()
    try:
        tail = tail_of(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tail is not None
    assert spy.reads == [64 * 1024 + 1]
    assert peak < 2 * MB
    assert tail.bytes == size
    assert tail.truncated
    assert tail.lines == 2000
    assert tail.tail.endswith("line 019999\n")
    assert tail.tail.startswith("line 018000\n")


# -- the line cap ------------------------------------------------------------------------


def test_line_cap(tmp_path: Path) -> None:
    lines = [f"{i}\n" for i in range(5000)]
    p = write(tmp_path / "a.out", "".join(lines))
    tail = tail_of(p)
    assert tail is not None
    assert tail.tail == "".join(lines[-2000:])
    assert (tail.lines, tail.truncated) == (2000, True)


def test_exactly_max_lines_is_not_truncated(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", "x\n" * 2000)
    tail = tail_of(p)
    assert tail is not None
    assert (tail.lines, tail.truncated) == (2000, False)
    p = write(tmp_path / "b.out", "x\n" * 1999 + "x")
    tail = tail_of(p)
    assert tail is not None
    assert (tail.lines, tail.truncated) == (2000, False)


# -- redaction ---------------------------------------------------------------------------


def test_redaction(tmp_path: Path) -> None:
    content = "token=s3cr3t-value\nuser abc pw hunter2\nagain s3cr3t-value!\n"
    p = write(tmp_path / "a.out", content)
    tail = tail_of(p, redact=["s3cr3t-value", "abc", "", "hunter2"])
    assert tail is not None
    assert tail.tail == "token=***\nuser abc pw ***\nagain ***!\n"
    assert p.read_text() == content  # only the returned text is redacted


def test_longer_secret_wins_over_its_substring() -> None:
    assert redact_text("key=abcdefgh", ["abcd", "abcdefgh"]) == "key=***"


def test_secret_spanning_the_cut_is_hidden(tmp_path: Path) -> None:
    secret = "SUPERSECRETVALUE"
    p = write(tmp_path / "a.out", "x" * 50 + secret + "y" * 40)
    # The read starts 10 characters into the secret: its end must not leak.
    tail = tail_of(p, max_bytes=6 + 40, redact=[secret])
    assert tail is not None
    assert tail.tail == "***" + "y" * 40
    assert "VALUE" not in tail.tail


def test_secret_being_written_at_the_end_is_hidden(tmp_path: Path) -> None:
    p = write(tmp_path / "a.out", "ok\nexport TOKEN=SUPERSEC")
    tail = tail_of(p, redact=["SUPERSECRETVALUE"])
    assert tail is not None
    assert tail.tail == "ok\nexport TOKEN=***"


def test_multi_line_secret_cut_by_the_line_cap(tmp_path: Path) -> None:
    key = "-----BEGIN KEY-----\nAAAAline1\nBBBBline2\n-----END KEY-----"
    p = write(tmp_path / "a.out", f"start\n{key}\nafter\n")
    tail = tail_of(p, max_lines=3, redact=[key])
    assert tail is not None
    assert tail.tail == "***\n***\nafter\n"
    whole = tail_of(p, redact=[key])
    assert whole is not None
    # The key's line breaks are kept, so the tail has the lines the job wrote.
    assert whole.tail == "start\n***\n***\n***\n***\nafter\n"
    assert whole.lines == 6


def test_short_values_are_not_redacted() -> None:
    assert redact_text("a 123 b", ["123", ""]) == "a 123 b"


# -- both files, async, signature --------------------------------------------------------


def test_read_logs(tmp_path: Path) -> None:
    out = write(tmp_path / "job.out", "hello\n")
    err = write(tmp_path / "job.err", "oops pw=hunter22\n")
    got = logs_of(out, err, ["hunter22"])
    assert got.stdout is not None
    assert got.stderr is not None
    assert got.stdout.tail == "hello\n"
    assert got.stderr.tail == "oops pw=***\n"
    assert logs_of(out, tmp_path / "missing.err") == Logs(stdout=got.stdout, stderr=None)
    assert logs_of(out, out).stderr is None  # one file: not stored twice
    assert logs_of(out, None).stderr is None
    link = tmp_path / "link.err"
    link.symlink_to(out)
    with pytest.raises(UnsafePath, match="symbolic link"):  # another name: a link, refused
        logs_of(out, link)
    small = logs_of(out, err, max_bytes=4, max_lines=1)
    assert small.stderr is not None
    assert small.stderr.truncated


def test_tail_signatures(tmp_path: Path) -> None:
    d = tmp_path / "attempt-1"
    d.mkdir()
    p = d / "a.out"
    names = ("a.out", "b.out")
    assert tail_signatures(tmp_path, d, names, ME) == (None, None)
    write(p, "one\n")
    first, missing = tail_signatures(tmp_path, d, names, ME)
    assert missing is None
    assert first is not None
    assert first[2] == 4  # the size
    assert tail_signatures(tmp_path, d, names, ME) == (first, None)
    with p.open("ab") as f:
        f.write(b"two\n")
    os.utime(p, ns=(first[3] + 1_000_000_000, first[3] + 1_000_000_000))
    second, _ = tail_signatures(tmp_path, d, names, ME)
    assert second is not None
    assert second != first
    assert second[2] == 8
    assert tail_signatures(tmp_path, tmp_path / "gone", names, ME) == (None, None)


def test_a_replaced_file_of_the_same_size_and_time_changes_the_signature(tmp_path: Path) -> None:
    d = tmp_path / "attempt-1"
    d.mkdir()
    p = write(d / "a.out", "same\n")
    before = tail_signatures(tmp_path, d, ("a.out",), ME)[0]
    assert before is not None
    write(d / "new", "same\n")
    os.utime(d / "new", ns=(before[3], before[3]))
    os.replace(d / "new", p)
    assert tail_signatures(tmp_path, d, ("a.out",), ME)[0] != before


def test_module_defaults_match_the_seed() -> None:
    assert (logs.DEFAULT_MAX_BYTES, logs.DEFAULT_MAX_LINES) == (65536, 2000)


# -- properties --------------------------------------------------------------------------

line_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n"), max_size=30
)
files = st.lists(line_text, max_size=30).map(lambda ls: "\n".join(ls)) | st.lists(
    line_text, max_size=30
).map(lambda ls: "".join(f"{s}\n" for s in ls))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(
    content=files,
    max_bytes=st.integers(min_value=1, max_value=300),
    max_lines=st.integers(min_value=1, max_value=40),
)
def test_tail_is_a_bounded_suffix(
    tmp_path: Path, content: str, max_bytes: int, max_lines: int
) -> None:
    p = write(tmp_path / "prop.out", content)
    data = content.encode()
    tail = tail_of(p, max_bytes=max_bytes, max_lines=max_lines)
    assert tail is not None
    text = tail.tail
    assert content.endswith(text)
    assert len(text.encode()) <= max_bytes
    assert tail.lines <= max_lines
    assert tail.lines == (text.count("\n") + (1 if text and not text.endswith("\n") else 0))
    assert tail.bytes == len(data)
    if not tail.truncated:
        assert text == content
    else:
        before = content[: len(content) - len(text)]
        # Whole lines only, except when the read was one single (long) line.
        starts_a_line = before == "" or before.endswith("\n")
        single_line_fallback = "\n" not in text.rstrip("\n")
        assert starts_a_line or single_line_fallback
        if len(data) <= max_bytes:
            assert text.count("\n") + (0 if text.endswith("\n") else 1) == max_lines


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200)
@given(
    before=st.text(alphabet="ab \n", max_size=80),
    after=st.text(alphabet="ab \n", max_size=80),
    max_bytes=st.integers(min_value=1, max_value=200),
)
def test_a_secret_never_leaks(tmp_path: Path, before: str, after: str, max_bytes: int) -> None:
    secret = "XYZW1234"
    p = write(tmp_path / "prop.out", before + secret + after)
    tail = tail_of(p, max_bytes=max_bytes, redact=[secret])
    assert tail is not None
    for k in range(4, len(secret) + 1):
        for i in range(len(secret) - k + 1):
            assert secret[i : i + k] not in tail.tail
