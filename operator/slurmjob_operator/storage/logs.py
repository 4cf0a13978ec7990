"""Bounded tails of a job's log files, read from the shared storage.

`read_tail` reads at most `max_bytes` (+1, to see whether the cut fell on a line boundary)
from the end of a file with one positioned read, whatever the file's size, so memory stays
bounded even for a runaway log. It keeps whole lines only: a first line that started before
the cut is dropped, and at most `max_lines` lines are kept. Text is decoded as UTF-8 with
replacement, and secret values are replaced by `***` in the returned text, never in the file
(`core.redact`: the value in its JSON, URL and base64 forms too, also split over lines).

The job owns the directory its logs are in, so a log is reached only through `nofollow`: from
the storage root, one component at a time, no link followed, and it must be a regular file
with one link owned by the job user. A link (to a token, a key, /proc/self/environ), a FIFO,
a device, a hard link or another owner's file is refused with `UnsafePath` (an OSError) and
its content never read; a FIFO or a device is not even opened (so it cannot block the reader).

`read_from` is the follower's read (the log endpoint, `kubectl slurmjob logs -f`): the bytes
from an offset on, at most `max_bytes`, up to the last line break read (`core.logtail.
follow_cut`). It reads up to `context` bytes before the offset too, never given out, so a
secret value split between two reads is still found and hidden whole (`Redactor.redact`'s
`start`); and while the file can still grow, a value's beginning at the end of the read is
hidden too (`cut_end`), since its rest may come in the next one.

`read_attempt_logs` is the controller's entry: both tails of one attempt, redacted with the
values the attempt was given (`redactions`) and the current ones. It blocks; the controller
runs it in a worker thread bounded by `READ_TIMEOUT`, so a slow shared filesystem never stalls
the event loop or the other jobs. `tail_signatures` lets a poller re-read the files only when
one moved; it uses the same walk (lstat only) and never raises.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmjob_operator.api.status import Logs, LogTail
from slurmjob_operator.config import Settings
from slurmjob_operator.core.logtail import count_lines, follow_cut, skip_continuation
from slurmjob_operator.core.naming import log_files
from slurmjob_operator.core.redact import MIN_REDACT_LENGTH, REDACTED, Redactor, redact_text
from slurmjob_operator.storage.nofollow import (
    UnsafePath,
    below,
    dir_owners,
    job_owner,
    lstat_at,
    open_file,
    read_at_most,
    walk,
)
from slurmjob_operator.storage.redactions import recall

__all__ = [
    "CONTEXT_BYTES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_LINES",
    "MIN_REDACT_LENGTH",
    "READ_TIMEOUT",
    "REDACTED",
    "Chunk",
    "SecretsUnknown",
    "Signature",
    "UnsafePath",
    "attempt_redactor",
    "read_attempt_logs",
    "read_from",
    "read_logs",
    "read_tail",
    "redact_text",
    "tail_signatures",
]

DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_LINES = 2000
#: Seconds the controller gives one attempt's log read. Two tails of at most 64 KiB take
#: milliseconds on a healthy filesystem; a read still running after this means the storage
#: (or something a job put there) is stuck, and the status keeps the tails it had.
READ_TIMEOUT = 5.0
#: Bytes before a follower's offset read again as context for the redaction (a PEM key, a
#: certificate chain and their base64 forms are shorter).
CONTEXT_BYTES = 16 * 1024

#: What tells a poller that a log file moved: type and inode (replaced), size, mtime, ctime.
Signature = tuple[int, int, int, int, int]

_NEWLINE = 0x0A

log = logging.getLogger(__name__)


def tail_signatures(
    root: Path, staging_dir: Path, names: Sequence[str], owner: int
) -> tuple[Signature | None, ...]:
    """Per name, the file's `Signature` (its own, a link is not followed), None when it does
    not exist or the directory cannot be walked safely. Never raises: the poller calls it
    for every job on the event loop."""
    try:
        parts = below(root, staging_dir)
        with walk(root, parts, dir_owners(owner)) as fd:
            out: list[Signature | None] = []
            for name in names:
                st = lstat_at(fd, name)
                out.append(
                    None
                    if st is None
                    else (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                )
            return tuple(out)
    except OSError:
        return tuple(None for _ in names)


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


def _redactor(redact: Redactor | Collection[str]) -> Redactor:
    return redact if isinstance(redact, Redactor) else Redactor(redact)


def _open_log(path: Path, root: Path, owner: int) -> int | None:
    """A descriptor of the log at `path` (see the module docstring), None when missing."""
    parts = below(root, path)
    try:
        with walk(root, parts[:-1], dir_owners(owner)) as parent:
            return open_file(parent, parts[-1], owner, str(path))
    except FileNotFoundError:
        return None


def read_tail(
    path: Path,
    *,
    root: Path,
    owner: int,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_lines: int = DEFAULT_MAX_LINES,
    redact: Redactor | Collection[str] = (),
) -> LogTail | None:
    """The end of `path` (below the trusted `root`, a regular file with one link owned by
    `owner`), None when it does not exist; UnsafePath when it is refused.

    At most `max_bytes` bytes and `max_lines` lines, whole lines only: when the read starts
    mid-file the partial first line is dropped — unless the whole read is one line (a progress
    bar without newlines), which is then kept from the first whole character. `truncated` is
    True when either cap left anything out; `bytes` is the file's size; `lines` counts the
    lines of the returned (redacted) tail. Other OS errors (permissions, ...) propagate.
    """
    if max_bytes < 1 or max_lines < 1:
        raise ValueError("max_bytes and max_lines must be at least 1")
    fd = _open_log(path, root, owner)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        if start == 0:
            data = read_at_most(fd, max_bytes)
            mid_line = False
        else:
            # One byte more: was the byte before the cut a newline (no partial line)?
            data = read_at_most(fd, max_bytes + 1, start - 1)
            mid_line = data[:1] != b"\n"
            data = data[1:]
    finally:
        os.close(fd)
    size = max(size, start + len(data))  # the file may have grown while we read
    truncated = start > 0
    cut_start = False
    if mid_line:
        first_newline = data.find(_NEWLINE)
        if 0 <= first_newline < len(data) - 1:
            data = data[first_newline + 1 :]
        else:
            # One line longer than the read (or its newline is the last byte): keep its end.
            data = skip_continuation(data)
            cut_start = True
    data, dropped = _keep_last_lines(data, max_lines)
    truncated = truncated or dropped
    text = data.decode("utf-8", errors="replace")
    text = _redactor(redact).redact(text, cut_start=cut_start, cut_end=not text.endswith("\n"))
    return LogTail(tail=text, truncated=truncated, bytes=size, lines=count_lines(text))


@dataclass(frozen=True)
class Chunk:
    """What `read_from` read: `text` starts at byte `start` of the file (the offset asked
    for, or 0 when the file is now shorter than that: it was cut short or replaced), the
    next read starts at `next_offset`; `size` is the file's size as it was read."""

    text: str
    start: int
    next_offset: int
    size: int


def read_from(
    path: Path,
    offset: int,
    *,
    root: Path,
    owner: int,
    complete: bool,
    max_bytes: int = DEFAULT_MAX_BYTES,
    context: int = CONTEXT_BYTES,
    redact: Redactor | Collection[str] = (),
) -> Chunk | None:
    """The text of `path` (reached as `read_tail` reaches it) from byte `offset` on; None
    when it does not exist, UnsafePath when it is refused.

    At most `max_bytes` bytes, up to the last line break read unless `complete` (the file
    grows no more) and the end was reached; a line longer than `max_bytes` is given out in
    pieces of whole characters. One positioned read of at most `context + max_bytes` bytes,
    whatever the file's size."""
    if max_bytes < 1 or offset < 0 or context < 0:
        raise ValueError("max_bytes must be at least 1, offset and context at least 0")
    fd = _open_log(path, root, owner)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        start = 0 if offset > size else offset
        back = min(start, context)
        raw = read_at_most(fd, back + max_bytes, start - back)
    finally:
        os.close(fd)
    # An offset inside a character (anyone may send one) starts at that character instead:
    # a secret split into two replacement characters would escape its redaction.
    for _ in range(3):
        if back > 0 and back < len(raw) and raw[back] & 0xC0 == 0x80:
            back -= 1
            start -= 1
    before, data = raw[:back], raw[back:]
    full = len(data) >= max_bytes
    cut = follow_cut(data, full=full, complete=complete)
    at_end = complete and not full and cut == len(data)
    if start - back > 0:
        before = skip_continuation(before)  # the context may begin inside a character
    shown = before.decode("utf-8", errors="replace")
    body = data[:cut].decode("utf-8", errors="replace")
    text = _redactor(redact).redact(
        shown + body, cut_start=start - back > 0, cut_end=not at_end, start=len(shown)
    )
    return Chunk(text=text, start=start, next_offset=start + cut, size=max(size, start + len(data)))


def read_logs(
    stdout: Path,
    stderr: Path | None,
    redact: Redactor | Collection[str] = (),
    *,
    root: Path,
    owner: int,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_lines: int = DEFAULT_MAX_LINES,
) -> Logs:
    """Tails of a job's standard output and error (each None when its file is missing; the
    first refused file raises UnsafePath, so the caller keeps the tails it had).

    When `stderr` is None or the same path as `stdout` (Slurm's default), only `stdout` is
    read and `Logs.stderr` is None, so the same text is not stored twice. (Another name for
    the same file would be a link, which is refused.)
    """
    redactor = _redactor(redact)
    caps = {"max_bytes": max_bytes, "max_lines": max_lines}
    out = read_tail(stdout, root=root, owner=owner, redact=redactor, **caps)
    err = None
    if stderr is not None and stderr != stdout:
        err = read_tail(stderr, root=root, owner=owner, redact=redactor, **caps)
    return Logs(stdout=out, stderr=err)


class SecretsUnknown(LookupError):
    """Neither the secret values an attempt was given nor the current ones are known: no
    text is given out rather than an unredacted one."""


def attempt_redactor(
    settings: Settings, staging_dir: Path, current: Collection[str] | None, owner: int
) -> Redactor:
    """What hides the attempt's secrets: the `current` values and those it was staged with
    (`redactions.recall`); SecretsUnknown when neither is known (the Secrets cannot be read
    and no copy is kept)."""
    try:
        given = recall(settings.storage_root, staging_dir, owner)
    except (UnsafePath, ValueError) as exc:
        log.warning("ignoring the secret values kept for %s: %s", staging_dir, exc)
        given = None
    if current is None and given is None:
        raise SecretsUnknown(f"the secret values to hide in the logs of {staging_dir} are unknown")
    return Redactor([*(current or ()), *(given or ())])


def read_attempt_logs(
    settings: Settings,
    staging_dir: Path,
    current: Collection[str] | None,
    owner: int | None = None,
    *,
    index: int | None = None,
) -> Logs | None:
    """Both tails of the attempt at `staging_dir` (derived from the resource, never taken
    from its status), redacted with the `current` secret values and those the attempt was
    staged with (`redactions.recall`). None when neither is known (the Secrets cannot be read
    and no copy is kept): no tail is better than an unredacted one. `owner`: the uid the job
    runs as, when it is not `job_owner(settings)` (a tenant's own uid); `index`: the task of
    a job array whose files to read (`naming.array_log_file`)."""
    owner = job_owner(settings) if owner is None else owner
    try:
        redactor = attempt_redactor(settings, staging_dir, current, owner)
    except SecretsUnknown:
        return None
    stdout, stderr = log_files(index)
    return read_logs(
        staging_dir / stdout,
        staging_dir / stderr,
        redactor,
        root=settings.storage_root,
        owner=owner,
    )


def attempt_dir_owner(
    settings: Settings, staging_dir: Path, owner: int | None = None
) -> tuple[int, int, int] | None:
    """(uid, gid, mode) of the attempt directory at `staging_dir`, reached without following a
    link; None when it is missing or refused (the message then says it could not be looked at).
    """
    owner = job_owner(settings) if owner is None else owner
    try:
        parts = below(settings.storage_root, staging_dir)
        with walk(settings.storage_root, parts, dir_owners(owner)) as fd:
            st = os.fstat(fd)
    except OSError:
        return None
    return st.st_uid, st.st_gid, st.st_mode
