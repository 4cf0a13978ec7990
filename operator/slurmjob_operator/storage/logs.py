"""Bounded tails of a job's log files, read from the shared storage.

`read_tail` reads at most `max_bytes` (+1, to see whether the cut fell on a line boundary)
from the end of a file with one seek, whatever the file's size, so memory stays bounded even
for a runaway log. It keeps whole lines only: a first line that started before the cut is
dropped, and at most `max_lines` lines are kept. Text is decoded as UTF-8 with replacement,
and secret values are replaced by `***` in the returned text (never in the file).

The async variants run the blocking reads in a worker thread (`asyncio.to_thread`), so a slow
shared filesystem never stalls the event loop. `tail_signature` lets a poller re-read a file
only when its size or modification time moved.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from pathlib import Path

from slurmjob_operator.api.status import Logs, LogTail

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_LINES",
    "MIN_REDACT_LENGTH",
    "REDACTED",
    "read_logs",
    "read_tail",
    "redact_text",
    "tail_signature",
]

DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_LINES = 2000
#: Shorter values are not redacted: replacing every "1" or "abc" would wreck the log and hide
#: little.
MIN_REDACT_LENGTH = 4
REDACTED = "***"

_NEWLINE = 0x0A
_MISSING = (FileNotFoundError, NotADirectoryError)


def tail_signature(path: Path) -> tuple[int, int] | None:
    """(size, mtime_ns) of the file, None when it does not exist."""
    try:
        st = path.stat()
    except _MISSING:
        return None
    return st.st_size, st.st_mtime_ns


def _secrets(redact: Iterable[str]) -> list[str]:
    """The strings to replace: each value, and each line of a multi-line value (so a PEM key
    cut by the line cap still has its lines hidden); longest first."""
    out: set[str] = set()
    for value in redact:
        if len(value) >= MIN_REDACT_LENGTH:
            out.add(value)
            if "\n" in value:
                out.update(
                    line for line in value.splitlines() if len(line.strip()) >= MIN_REDACT_LENGTH
                )
    return sorted(out, key=lambda s: (-len(s), s))


def redact_text(
    text: str, redact: Iterable[str], *, cut_start: bool = False, cut_end: bool = False
) -> str:
    """`text` with every secret value (length >= 4) replaced by `***`.

    `cut_start`: the text starts in the middle of a line, so it may begin with the end of a
    secret; `cut_end`: it ends without a newline (a writer may be mid-way through a secret).
    Then a secret's suffix at the start, or prefix at the end, of at least 4 characters is
    replaced too.
    """
    secrets = _secrets(redact)
    if not secrets:
        return text
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    if cut_start:
        for secret in secrets:
            for k in range(len(secret) - 1, MIN_REDACT_LENGTH - 1, -1):
                if text.startswith(secret[-k:]):
                    text = REDACTED + text[k:]
                    break
    if cut_end:
        for secret in secrets:
            for k in range(len(secret) - 1, MIN_REDACT_LENGTH - 1, -1):
                if text.endswith(secret[:k]):
                    text = text[:-k] + REDACTED
                    break
    return text


def _count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _keep_last_lines(data: bytes, max_lines: int) -> tuple[bytes, bool]:
    """The last `max_lines` lines of `data` and whether earlier ones were dropped."""
    # Skip a trailing newline: it ends the last line rather than starting another.
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    pos = end
    for _ in range(max_lines):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return data, False
    return data[pos + 1 :], True


def _skip_continuation(data: bytes) -> bytes:
    """Drop up to three leading UTF-8 continuation bytes (a character split by the cut)."""
    i = 0
    while i < min(3, len(data)) and data[i] & 0xC0 == 0x80:
        i += 1
    return data[i:]


def read_tail(
    path: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_lines: int = DEFAULT_MAX_LINES,
    redact: Collection[str] = (),
) -> LogTail | None:
    """The end of `path`, None when it does not exist.

    At most `max_bytes` bytes and `max_lines` lines, whole lines only: when the read starts
    mid-file the partial first line is dropped — unless the whole read is one line (a progress
    bar without newlines), which is then kept from the first whole character. `truncated` is
    True when either cap left anything out; `bytes` is the file's size; `lines` counts the
    lines of the returned (redacted) tail. Other OS errors (permissions, ...) propagate.
    """
    if max_bytes < 1 or max_lines < 1:
        raise ValueError("max_bytes and max_lines must be at least 1")
    try:
        f = path.open("rb")
    except _MISSING:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - max_bytes)
        if start == 0:
            data = f.read(max_bytes)
            mid_line = False
        else:
            # One byte more: was the byte before the cut a newline (no partial line)?
            f.seek(start - 1)
            data = f.read(max_bytes + 1)
            mid_line = data[:1] != b"\n"
            data = data[1:]
    size = max(size, start + len(data))  # the file may have grown while we read
    truncated = start > 0
    cut_start = False
    if mid_line:
        first_newline = data.find(_NEWLINE)
        if 0 <= first_newline < len(data) - 1:
            data = data[first_newline + 1 :]
        else:
            # One line longer than the read (or its newline is the last byte): keep its end.
            data = _skip_continuation(data)
            cut_start = True
    data, dropped = _keep_last_lines(data, max_lines)
    truncated = truncated or dropped
    text = data.decode("utf-8", errors="replace")
    text = redact_text(text, redact, cut_start=cut_start, cut_end=not text.endswith("\n"))
    return LogTail(tail=text, truncated=truncated, bytes=size, lines=_count_lines(text))


def read_logs(
    stdout: Path,
    stderr: Path | None,
    redact: Collection[str] = (),
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_lines: int = DEFAULT_MAX_LINES,
) -> Logs:
    """Tails of a job's standard output and error (each None when its file is missing).

    When `stderr` is None or the same path as `stdout` (Slurm's default), only `stdout` is
    read and `Logs.stderr` is None, so the same text is not stored twice.
    """
    out = read_tail(stdout, max_bytes=max_bytes, max_lines=max_lines, redact=redact)
    err = None
    if stderr is not None and not _same_file(stdout, stderr):
        err = read_tail(stderr, max_bytes=max_bytes, max_lines=max_lines, redact=redact)
    return Logs(stdout=out, stderr=err)


def _same_file(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
