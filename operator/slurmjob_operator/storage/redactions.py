"""The secret values an attempt was given, kept to redact its logs after an operator restart.

Log tails must hide the values the attempt received, not the ones its Secrets hold now: a
Secret may have been rotated (or deleted) since the submit. The operator keeps the values in
memory (`ResourceEdge`), which a restart loses. So when `stage_attempt` writes an attempt's
`secrets.env`, it also writes a copy, `<resource dir>/.redact-attempt-<n>`: beside the attempt
directory (which the job owns and may empty or fill), owned by the operator, mode 0600. The log
reader takes the union of these values and the current ones.

Only when the operator runs as another uid than the job user (`SLURMJOB_STAGING_OWNER`): then
no job can read the copy. When the operator runs as the job user (the chart's advice), every
job of every namespace runs as that uid too and could read it for as long as the resource
lives, so nothing is written and a restarted operator redacts the Secrets' current values only:
a value rotated between the submit and the restart shows in that attempt's tails. Documented
in docs/security.md.

The copy is read back like everything below the root (`nofollow`): a regular file with one
link, owned by the operator itself, mode 0600, at most `MAX_RECORD_BYTES`; anything else is
refused. The job user may delete it (it owns the resource directory): then the current values
are all that is redacted, as without a copy. It can neither read it nor put its own in place.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
from pathlib import Path

from slurmjob_operator.storage.files import write_at
from slurmjob_operator.storage.nofollow import (
    UnsafePath,
    below,
    dir_owners,
    open_file,
    read_at_most,
    walk,
)

RECORD_MODE = 0o600
#: secrets.env of even many large values (certificates) stays far below this.
MAX_RECORD_BYTES = 1024 * 1024


def record_name(attempt_dir: str) -> str:
    """`.redact-attempt-<n>` for the directory `attempt-<n>`."""
    return f".redact-{attempt_dir}"


def keeps_records(owner: int) -> bool:
    """Whether copies are written (and read): only when no job can read them."""
    return owner != os.geteuid()


def write_record(resource_fd: int, attempt_dir: str, secrets_env: bytes) -> None:
    """The copy of an attempt's secrets.env, beside its directory (it stays the operator's)."""
    write_at(resource_fd, record_name(attempt_dir), secrets_env, RECORD_MODE)


def remove_record(resource_fd: int, attempt_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_name(attempt_dir), dir_fd=resource_fd)


def parse_env(data: bytes) -> list[str]:
    """The values in a copy of secrets.env, in either format `site.render` writes: `NAME=value`
    records each ending in NUL, or `export NAME=<one shell word>` entries (a value may span
    lines inside its quotes). ValueError when it is neither."""
    text = data.decode("utf-8")
    if "\0" in text:
        entries = text.split("\0")
        if entries[-1]:
            raise ValueError("the last NAME=value record does not end in NUL")
        entries.pop()
    else:
        entries = [w for w in shlex.split(text, comments=False, posix=True) if w != "export"]
    values = []
    for entry in entries:
        name, sep, value = entry.partition("=")
        if not sep or not name:
            raise ValueError("not a NAME=value entry")
        values.append(value)
    return values


def recall(root: Path, staging_dir: Path, owner: int) -> list[str] | None:
    """The values the attempt at `staging_dir` was staged with; None when there is no copy
    (none is kept, the attempt had no secrets, or the copy was removed). UnsafePath when the
    copy is refused, ValueError when it cannot be parsed."""
    if not keeps_records(owner):
        return None
    parts = below(root, staging_dir)
    name = record_name(parts[-1])
    where = str(staging_dir.parent / name)
    try:
        with walk(root, parts[:-1], dir_owners(owner)) as resource:
            fd = open_file(resource, name, os.geteuid(), where)
            try:
                mode = stat.S_IMODE(os.fstat(fd).st_mode)
                if mode & 0o077:
                    raise UnsafePath(f"{where}: mode {mode:04o}, not 0600")
                data = read_at_most(fd, MAX_RECORD_BYTES + 1)
            finally:
                os.close(fd)
    except FileNotFoundError:
        return None
    if len(data) > MAX_RECORD_BYTES:
        raise UnsafePath(f"{where}: larger than {MAX_RECORD_BYTES} bytes")
    return parse_env(data)
