"""Following a log from an offset (issue 13, part 4): the names of array logs, what a follower
gives out of a read (`core.logtail.follow_cut`), redaction of a read with the text before it
as context (`Redactor.redact(start=...)`), `storage.logs.read_from` against real files,
which attempt a read is about (`core.logview`) and the small expiring cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmjob_operator.api.logs import LogQuery, LogStream, QueryError, dns_name
from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus
from slurmjob_operator.core import naming
from slurmjob_operator.core.logtail import follow_cut, whole_chars
from slurmjob_operator.core.logview import attempt_ended, pick_attempt
from slurmjob_operator.core.redact import Redactor
from slurmjob_operator.core.ttlcache import TtlCache
from slurmjob_operator.storage.logs import UnsafePath, read_from

ME = os.geteuid()
SECRET = "hunter2-very-secret-value"

# -- names ----------------------------------------------------------------------------------


def test_log_file_names() -> None:
    assert naming.log_file("stdout") == naming.STDOUT_FILE == "stdout.log"
    assert naming.log_file("stderr") == naming.STDERR_FILE == "stderr.log"
    assert naming.log_file(LogStream.STDERR, 0) == "stderr-0.log"
    assert naming.log_file("stdout", 999_999) == "stdout-999999.log"


@pytest.mark.parametrize(
    ("stream", "index"),
    [
        ("stdin", None),
        ("../stdout", None),
        ("stdout", -1),
        ("stdout", 1_000_000),
        ("stdout", "1"),
        ("stdout", "../../x"),
        ("stdout", True),
        ("stdout", 1.0),
    ],
)
def test_a_log_file_name_holds_no_path(stream: str, index: object) -> None:
    with pytest.raises(ValueError, match="not"):
        naming.log_file(stream, index)  # type: ignore[arg-type]


# -- the query ------------------------------------------------------------------------------


def test_a_query_is_parsed_strictly() -> None:
    items = [("stream", "stderr"), ("attempt", "2"), ("index", "7"), ("offset", "0")]
    query = LogQuery.parse(items)
    assert query == LogQuery(stream=LogStream.STDERR, attempt=2, index=7, offset=0)
    assert LogQuery.parse([]) == LogQuery()
    assert LogQuery.parse(query.items()) == query


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([("index", "../../etc/passwd")], "index: '../../etc/passwd' is not"),
        ([("index", "1_000")], "is not a non-negative decimal integer"),
        ([("index", "+1")], "is not a non-negative decimal integer"),
        ([("index", " 1")], "is not a non-negative decimal integer"),
        ([("index", "\u0661")], "is not a non-negative decimal integer"),  # an Arabic-Indic 1
        ([("index", "1000000")], "index: 1000000 is not from 0 to 999999"),
        ([("attempt", "0")], "attempt: 0 is not from 1"),
        ([("offset", "-5")], "is not a non-negative decimal integer"),
        ([("offset", "9" * 20)], "is not a non-negative decimal integer"),
        ([("stream", "stdin")], "stream: 'stdin' is not stdout or stderr"),
        ([("path", "/etc")], "unknown parameter 'path'"),
        ([("index", "1"), ("index", "2")], "index: given more than once"),
    ],
)
def test_a_bad_query_is_refused_naming_the_parameter(
    items: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(QueryError, match=message.replace("+", r"\+")):
        LogQuery.parse(items)


@pytest.mark.parametrize(
    ("value", "limit", "dots", "ok"),
    [
        ("team-a", 63, False, True),
        ("a", 63, False, True),
        ("a.b-c", 253, True, True),
        ("a.b", 63, False, False),
        ("-a", 63, False, False),
        ("a-", 63, False, False),
        ("a..b", 253, True, False),
        ("A", 63, False, False),
        ("a/b", 253, True, False),
        ("..", 253, True, False),
        ("", 63, False, False),
        ("a" * 64, 63, False, False),
    ],
)
def test_dns_names(value: str, limit: int, dots: bool, ok: bool) -> None:
    assert dns_name(value, limit, dots=dots) is ok


# -- what a follower gives out --------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "full", "complete", "given"),
    [
        (b"one\ntwo\nthr", False, False, b"one\ntwo\n"),  # the line being written waits
        (b"one\ntwo\nthr", False, True, b"one\ntwo\nthr"),  # ... unless the file is complete
        (b"one\ntwo\nthr", True, True, b"one\ntwo\n"),  # a full read: more follows anyway
        (b"10%\r20%\r3", False, False, b"10%\r20%\r"),  # a progress bar's carriage returns
        (b"partial", False, False, b""),
        (b"x" * 10, True, False, b"x" * 10),  # a line longer than a read comes in pieces
        ("ab€".encode(), True, False, b"ab\xe2\x82\xac"),
        ("ab€".encode()[:-1], True, False, b"ab"),  # never half a character
        (b"", False, True, b""),
    ],
)
def test_follow_cut(data: bytes, full: bool, complete: bool, given: bytes) -> None:
    assert data[: follow_cut(data, full=full, complete=complete)] == given


@given(st.text(max_size=30), st.integers(0, 3))
def test_whole_chars_never_splits_a_character(text: str, drop: int) -> None:
    data = text.encode()
    cut = data[: max(0, len(data) - drop)]
    kept = cut[: whole_chars(cut)]
    kept.decode("utf-8")  # no error: whole characters only
    assert len(cut) - whole_chars(cut) <= 3


# -- redaction with context -----------------------------------------------------------------


def test_a_value_split_between_two_reads_is_hidden_in_the_second() -> None:
    text = f"before {SECRET} after\n"
    cut = text.index(SECRET) + 5  # the first read ended inside the value
    redactor = Redactor([SECRET])
    second = redactor.redact(text, start=cut)
    assert second == "*** after\n"
    assert SECRET[5:] not in second


def test_context_alone_is_not_given_out_and_hits_in_it_are_dropped() -> None:
    text = f"{SECRET}\nline two\n"
    start = len(SECRET) + 1
    assert Redactor([SECRET]).redact(text, start=start) == "line two\n"
    assert Redactor([]).redact(text, start=start) == "line two\n"
    with pytest.raises(ValueError, match="outside"):
        Redactor([SECRET]).redact(text, start=len(text) + 1)


@settings(max_examples=200)
@given(
    before=st.text(alphabet="xy \n", max_size=30),
    after=st.text(alphabet="xy \n", max_size=30),
    split=st.integers(0, len(SECRET)),
)
def test_no_split_point_shows_the_value(before: str, after: str, split: int) -> None:
    text = before + SECRET + after
    start = len(before) + split
    redactor = Redactor([SECRET])
    first = redactor.redact(text[:start], cut_end=True)
    second = redactor.redact(text, start=start)
    shown = first + second
    assert SECRET not in shown
    # What is shown of the value: never 4 characters in a row on either side.
    for piece in (first, second):
        assert not any(SECRET[i : i + 4] in piece for i in range(len(SECRET) - 3))
    assert second.endswith(after)


# -- read_from on files ---------------------------------------------------------------------


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_reading_on_from_an_offset_gives_whole_lines_and_the_next_offset(tmp_path: Path) -> None:
    log = write(tmp_path / "stdout.log", "one\ntwo\nthr")
    chunk = read_from(log, 0, root=tmp_path, owner=ME, complete=False)
    assert chunk is not None
    assert (chunk.text, chunk.start, chunk.next_offset, chunk.size) == ("one\ntwo\n", 0, 8, 11)
    again = read_from(log, chunk.next_offset, root=tmp_path, owner=ME, complete=False)
    assert again is not None
    assert (again.text, again.next_offset) == ("", 8)
    with log.open("ab") as f:
        f.write(b"ee\nfour\n")
    more = read_from(log, 8, root=tmp_path, owner=ME, complete=True)
    assert more is not None
    assert (more.text, more.next_offset, more.size) == ("three\nfour\n", 19, 19)


def test_a_huge_file_is_read_in_capped_pieces_with_one_bounded_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "stdout.log"
    with log.open("wb") as f:
        f.truncate(64 * 1024 * 1024)  # a sparse 64 MiB of NULs, no line break
        f.seek(0, 2)
        f.write(b"end\n")
    reads: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    offset = 32 * 1024 * 1024
    chunk = read_from(log, offset, root=tmp_path, owner=ME, complete=False, max_bytes=4096)
    assert chunk is not None
    assert chunk.next_offset == offset + 4096  # one long line: its whole characters
    assert sum(reads) <= 16 * 1024 + 4096


def test_a_file_cut_short_is_read_again_from_its_start(tmp_path: Path) -> None:
    log = write(tmp_path / "stdout.log", "fresh\n")
    chunk = read_from(log, 1000, root=tmp_path, owner=ME, complete=False)
    assert chunk is not None
    assert (chunk.start, chunk.text, chunk.next_offset) == (0, "fresh\n", 6)


def test_a_split_secret_is_hidden_on_both_sides_of_the_offset(tmp_path: Path) -> None:
    text = f"key={SECRET}\n"
    log = write(tmp_path / "stdout.log", text)
    cut = text.index(SECRET) + 9
    second = read_from(log, cut, root=tmp_path, owner=ME, complete=True, redact=[SECRET])
    assert second is not None
    assert second.text == "***\n"


@pytest.mark.parametrize("into", range(1, 4))
def test_an_offset_inside_a_character_cannot_unmask_a_non_ascii_secret(
    tmp_path: Path, into: int
) -> None:
    secret = "p\u00e4ssw\u00f6rd-Zugang-\U0001f511-123"
    text = f"key={secret}\n"
    log = write(tmp_path / "stdout.log", text)
    raw = text.encode()
    # Offsets inside the two-byte 'ä' and the four-byte key emoji.
    for lead in (raw.index("\u00e4".encode()), raw.index("\U0001f511".encode())):
        width = 2 if raw[lead] < 0xE0 else 4
        if into >= width:
            continue
        chunk = read_from(log, lead + into, root=tmp_path, owner=ME, complete=True, redact=[secret])
        assert chunk is not None
        assert chunk.start == lead
        assert "\ufffd" not in chunk.text
        assert "Zugang" not in chunk.text


def test_a_missing_file_is_none(tmp_path: Path) -> None:
    assert read_from(tmp_path / "nope.log", 0, root=tmp_path, owner=ME, complete=False) is None


def test_a_symlinked_log_is_refused_and_not_read(tmp_path: Path) -> None:
    target = write(tmp_path / "token", "the operator's token\n")
    (tmp_path / "stdout.log").symlink_to(target)
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        read_from(tmp_path / "stdout.log", 0, root=tmp_path, owner=ME, complete=False)


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "stdout.log")
    with pytest.raises(UnsafePath, match="FIFO"):
        read_from(tmp_path / "stdout.log", 0, root=tmp_path, owner=ME, complete=False)


def test_a_hard_link_is_refused(tmp_path: Path) -> None:
    target = write(tmp_path / "other", "x\n")
    os.link(target, tmp_path / "stdout.log")
    with pytest.raises(UnsafePath, match="hard links"):
        read_from(tmp_path / "stdout.log", 0, root=tmp_path, owner=ME, complete=False)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    log = write(tmp_path / "stdout.log", "x\n")
    with pytest.raises(ValueError, match="max_bytes"):
        read_from(log, -1, root=tmp_path, owner=ME, complete=False)
    with pytest.raises(ValueError, match="max_bytes"):
        read_from(log, 0, root=tmp_path, owner=ME, complete=False, max_bytes=0)


# -- which attempt, and has it ended --------------------------------------------------------


def attempt(number: int, **extra: object) -> Attempt:
    return Attempt.model_validate({"number": number, "jobName": f"sj-a{number}", **extra})


@pytest.mark.parametrize(
    ("attempts", "phase", "number", "ended"),
    [
        ([attempt(1)], Phase.RUNNING, 1, False),
        ([attempt(1)], Phase.QUEUED, 1, False),
        ([attempt(1)], Phase.SUCCEEDED, 1, True),
        ([attempt(1, finishedAt="2026-01-01T00:00:00Z")], Phase.PENDING, 1, True),
        ([attempt(1, finishedAt="2026-01-01T00:00:00Z"), attempt(2)], Phase.RUNNING, 1, True),
        ([attempt(1), attempt(2)], Phase.RUNNING, 2, False),
        ([attempt(1, provenAbsentAt="2026-01-01T00:00:00Z")], Phase.PENDING, 1, True),
        ([attempt(1, declaredLost=True)], Phase.PENDING, 1, True),
    ],
)
def test_attempt_ended(attempts: list[Attempt], phase: Phase, number: int, ended: bool) -> None:
    status = SlurmJobStatus(phase=phase, attempts=attempts)
    chosen = pick_attempt(status, number)
    assert chosen is not None
    assert attempt_ended(status, chosen) is ended


def test_pick_attempt() -> None:
    status = SlurmJobStatus(attempts=[attempt(1), attempt(2)])
    assert pick_attempt(status, None) == attempt(2)
    assert pick_attempt(status, 1) == attempt(1)
    assert pick_attempt(status, 3) is None
    assert pick_attempt(SlurmJobStatus(), None) is None


# -- the cache ------------------------------------------------------------------------------


def test_entries_expire_and_the_size_is_capped() -> None:
    cache: TtlCache[str, int] = TtlCache(10.0, 2)
    cache.put("a", 1, now=0.0)
    assert cache.get("a", now=9.9) == 1
    assert cache.get("a", now=10.0) is None
    assert len(cache) == 0
    cache.put("a", 1, now=0.0)
    cache.put("b", 2, now=1.0)
    cache.put("c", 3, now=2.0)  # full: the oldest goes
    assert (cache.get("a", 3.0), cache.get("b", 3.0), cache.get("c", 3.0)) == (None, 2, 3)
    cache.put("b", 4, now=5.0)  # replaced: its time restarts
    assert cache.get("b", now=14.0) == 4
    cache.drop("b")
    assert cache.get("b", now=14.0) is None
    with pytest.raises(ValueError, match="ttl"):
        TtlCache(0, 1)
