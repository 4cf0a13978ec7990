"""Cutting a log tail down to a size, whole lines and whole characters kept.

The log reader takes up to 64 KiB and 2,000 lines from the end of each file (what the retry
rules' patterns see); the status keeps a smaller end of that, `SLURMJOB_STATUS_TAIL_BYTES`
per stream, because every status is stored in etcd with every revision: two 64 KiB tails in
10,000 statuses would be 1.3 GB of a 2 GB quota. The text cut here is already redacted, and
a suffix of a redacted text holds no secret that the whole did not.

`follow_cut` is the other reader's rule, the one that follows a log from an offset: how much
of what it read to give out now (whole lines, or whole characters of a line longer than a
read), so that the next read starts where a line or at least a character does.
"""

from __future__ import annotations

from slurmjob_operator.api.status import Logs, LogTail

NEWLINE = b"\n"
#: What ends a line for a follower: a newline, or a carriage return (a progress bar).
LINE_BREAKS = (b"\n", b"\r")


def count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def skip_continuation(data: bytes) -> bytes:
    """Drop up to three leading UTF-8 continuation bytes (a character split by the cut)."""
    i = 0
    while i < min(3, len(data)) and data[i] & 0xC0 == 0x80:
        i += 1
    return data[i:]


def capped_tail(tail: LogTail, max_bytes: int) -> LogTail:
    """The last `max_bytes` bytes of `tail` (UTF-8), from the first whole line, or from the
    first whole character when they are all one line; `truncated` when anything was cut."""
    if max_bytes < 1:
        raise ValueError("max_bytes must be at least 1")
    data = tail.tail.encode("utf-8")
    if len(data) <= max_bytes:
        return tail
    cut = data[len(data) - max_bytes :]
    if data[len(data) - max_bytes - 1 : len(data) - max_bytes] != NEWLINE:
        first_newline = cut.find(NEWLINE)
        if 0 <= first_newline < len(cut) - 1:
            cut = cut[first_newline + 1 :]
        else:  # one line longer than the cap: keep its end
            cut = skip_continuation(cut)
    text = cut.decode("utf-8", errors="replace")
    return LogTail(tail=text, truncated=True, bytes=tail.bytes, lines=count_lines(text))


def capped_logs(logs: Logs, max_bytes: int) -> Logs:
    return Logs(
        stdout=capped_tail(logs.stdout, max_bytes) if logs.stdout is not None else None,
        stderr=capped_tail(logs.stderr, max_bytes) if logs.stderr is not None else None,
    )


def whole_chars(data: bytes) -> int:
    """The length of `data` without a UTF-8 sequence its end cuts short (at most 3 bytes
    left out; bytes that are no valid UTF-8 anyway are kept as they are)."""
    i = len(data) - 1
    while i >= 0 and len(data) - i <= 3 and data[i] & 0xC0 == 0x80:
        i -= 1
    if i < 0:
        return len(data)
    lead = data[i]
    if lead & 0xE0 == 0xC0:
        need = 2
    elif lead & 0xF0 == 0xE0:
        need = 3
    elif lead & 0xF8 == 0xF0:
        need = 4
    else:
        return len(data)
    return i if len(data) - i < need else len(data)


def follow_cut(data: bytes, *, full: bool, complete: bool) -> int:
    """How many bytes of `data`, read from a log at some offset, a follower gives out now.

    `full`: the read stopped at its size limit (the file holds more); `complete`: it reached
    the end of a file that grows no more (the attempt ended). A complete read is given out
    whole; otherwise up to its last line break, so a line still being written waits for its
    end; a full read without any break (one line longer than a read) gives out its whole
    characters, or the follower would wait forever."""
    if complete and not full:
        return len(data)
    last = max(data.rfind(b) for b in LINE_BREAKS)
    if last >= 0:
        return last + 1
    return whole_chars(data) if full else 0
