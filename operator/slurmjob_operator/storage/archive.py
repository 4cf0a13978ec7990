"""The log archive: what is kept of a SlurmJob's attempts after its staging directory goes.

Deleting a SlurmJob (a person, a GitOps prune, its TTL) removes its staging directory and,
with the object, the tails in its status. Before that, the operator copies every attempt's
logs (each array task's too), its script and the resource's final status into the archive
root the admin sets (`SLURMJOB_ARCHIVE_ROOT`):

    <archive root>/<namespace>/<uid>/record.json       who it was (namespace uid, name), when
    <archive root>/<namespace>/<uid>/status.json       the status, as the API had it
    <archive root>/<namespace>/<uid>/attempt-<n>/...   stdout.log, stderr.log, stdout-<i>.log,
                                                       stderr-<i>.log, job.sh

The sources are read as the status tails are (`storage.nofollow`: no link followed, a regular
file with one link, the job user's) and redacted with the values the attempt was given. Each
file keeps at most its last `file_cap` bytes (whole lines), and an entry at most `entry_cap`
bytes, shared among its files as they come (each gets `min(file_cap, room left / files
left)`), so an entry over the cap keeps the end of every log rather than some logs whole and
the rest not at all; the record names what was cut (`entryCap` when the entry cap cut it).
The record also names the entry's owner (its tenant, else its namespace), whose share of the
archive the sweep keeps to (`storage.archivesweep`). Everything here is the operator's:
directories 0700, files 0600, owned by its uid, written into a temporary directory that is
renamed into place once complete, so a reader finds a whole entry or none. The archive root is
trusted (the admin's); below it nothing is followed and nothing of another owner is read, so a
planted link or file is refused, not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from slurmjob_operator.core.naming import SCRIPT_FILE
from slurmjob_operator.core.redact import Redactor
from slurmjob_operator.core.shares import OWNER_RE
from slurmjob_operator.storage.files import write_at
from slurmjob_operator.storage.logs import read_tail
from slurmjob_operator.storage.nofollow import (
    UnsafePath,
    below,
    dir_owners,
    lstat_at,
    open_dir,
    open_file,
    open_root,
    read_at_most,
    walk,
)

RECORD_FILE = "record.json"
STATUS_FILE = "status.json"
DIR_MODE = 0o700
FILE_MODE = 0o600
#: record.json and status.json are read back at most this large.
MAX_RECORD_BYTES = 4 * 1024 * 1024
#: A temporary entry left by a crash is removed by the sweep after this long.
STALE_TEMPORARY = 3600.0

NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
UID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ATTEMPT_RE = re.compile(r"^attempt-([1-9][0-9]{0,6})$")
# A job array has at most MAX_ARRAY_TASKS tasks (indices below 10,000): with the two plain
# files an attempt has at most 20,002 log names, whatever its job created beside them.
_LOG_RE = re.compile(r"^(stdout|stderr)(-(0|[1-9][0-9]{0,3}))?\.log$")
TEMPORARY_RE = re.compile(r"^\.[0-9a-f-]{36}\.[0-9a-f]{12}\.tmp$")


class ArchivedAttempt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int = Field(ge=1, le=1_000_000)
    files: list[str] = Field(default_factory=list, description="The files archived.")
    truncated: list[str] = Field(
        default_factory=list, description="Files of which only the end was kept (the file cap)."
    )
    skipped: list[str] = Field(
        default_factory=list, description="Files left out: the entry was full, or refused."
    )


class ArchiveRecord(BaseModel):
    """Who an entry belongs to: checked before any of it is served again."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    namespace: str = Field(pattern=NAMESPACE_RE.pattern)
    namespace_uid: str = Field(alias="namespaceUid", min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=253)
    uid: str = Field(pattern=UID_RE.pattern)
    archived_at: float = Field(alias="archivedAt", ge=0)
    phase: str | None = Field(default=None, max_length=64, description="The final phase.")
    attempts: list[ArchivedAttempt] = Field(default_factory=list)
    # The previous release wrote neither: its entries are read with None and swept as their
    # namespace's current owner (`storage.archivesweep`).
    owner: str | None = Field(
        default=None,
        pattern=OWNER_RE.pattern,
        description="Whose share it counts against, as the operator resolved it at writing.",
    )
    entry_cap: int | None = Field(
        default=None,
        alias="entryCap",
        ge=1,
        description="The per-entry cap that cut this entry's files; None: it fitted.",
    )

    def attempt(self, number: int | None) -> ArchivedAttempt | None:
        """Attempt `number`, or the last one archived (None: none such)."""
        if number is None:
            return self.attempts[-1] if self.attempts else None
        return next((a for a in self.attempts if a.number == number), None)


@dataclass(frozen=True)
class AttemptSource:
    """Where one attempt's files are and whose they must be, and what hides its secrets."""

    number: int
    storage_root: Path
    staging_dir: Path
    log_owner: int
    script_owner: int
    redactor: Redactor


def entry_dir(root: Path, namespace: str, uid: str) -> Path:
    """`<root>/<namespace>/<uid>`; ValueError for a name no entry can have."""
    if not NAMESPACE_RE.fullmatch(namespace) or not UID_RE.fullmatch(uid):
        raise ValueError(f"no archive entry can be named {namespace}/{uid}")
    return root / namespace / uid


def own_uids() -> frozenset[int]:
    return frozenset({os.geteuid()})


def _mkdir_at(parent: int, name: str, where: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, DIR_MODE, dir_fd=parent)
    return open_dir(parent, name, own_uids(), where)


def _task_order(name: str) -> tuple[int, str]:
    match = _LOG_RE.fullmatch(name)
    return (int(match.group(3)) if match and match.group(3) else -1, name)


def _source_names(source: AttemptSource) -> list[str] | None:
    """The attempt's log files (sorted: stdout before stderr, tasks in order) and its script;
    None when its directory is gone."""
    parts = below(source.storage_root, source.staging_dir)
    # Streamed: a directory the job filled with names is walked, never held whole.
    owners = dir_owners(source.script_owner)
    try:
        with walk(source.storage_root, parts, owners) as fd, os.scandir(fd) as entries:
            names = [e.name for e in entries if _LOG_RE.fullmatch(e.name)]
    except FileNotFoundError:
        return None
    names.sort(key=_task_order)
    return [*names, SCRIPT_FILE]


class _Budget:
    """The entry cap shared among the entry's files in the order they are copied: each gets
    `min(file_cap, room / files left)`, and what a small file leaves goes to the later ones."""

    def __init__(self, file_cap: int, entry_cap: int, files: int) -> None:
        self.file_cap = file_cap
        self.room = entry_cap
        self.left = files
        self.capped = False

    def next(self) -> int:
        """Bytes the next file may keep (0: none; the entry is full)."""
        allowed = min(self.file_cap, self.room // max(self.left, 1))
        self.left -= 1
        return allowed

    def spend(self, allowed: int, written: int, truncated: bool) -> None:
        self.room -= written
        if truncated and allowed < self.file_cap:
            self.capped = True  # the entry cap, not the file cap, cut it


def _copy_attempt(
    parent: int, source: AttemptSource, names: list[str], budget: _Budget
) -> ArchivedAttempt:
    """Copy one attempt's `names` below `parent` (its entry's temporary directory)."""
    name = f"attempt-{source.number}"
    files: list[str] = []
    truncated: list[str] = []
    skipped: list[str] = []
    fd = _mkdir_at(parent, name, name)
    try:
        for file in names:
            allowed = budget.next()
            if allowed < 1:
                budget.capped = True
                skipped.append(file)
                continue
            owner = source.script_owner if file == SCRIPT_FILE else source.log_owner
            try:
                tail = read_tail(
                    source.staging_dir / file,
                    root=source.storage_root,
                    owner=owner,
                    max_bytes=allowed,
                    max_lines=sys.maxsize,
                    redact=source.redactor,
                )
            except UnsafePath:
                skipped.append(file)
                continue
            if tail is None:
                continue
            data = tail.tail.encode("utf-8")
            write_at(fd, file, data, FILE_MODE, exclusive=True)
            budget.spend(allowed, len(data), tail.truncated)
            files.append(file)
            if tail.truncated:
                truncated.append(file)
    finally:
        os.close(fd)
    return ArchivedAttempt(number=source.number, files=files, truncated=truncated, skipped=skipped)


def write_entry(
    root: Path,
    record: ArchiveRecord,
    sources: Sequence[AttemptSource],
    status: dict[str, object],
    *,
    file_cap: int,
    entry_cap: int,
) -> ArchiveRecord:
    """Archive `sources` and `status` under `record`'s namespace and uid (an entry already
    there is replaced: a finalizer retried after a crash archives again). Returns the record
    written, with what each attempt kept and `entry_cap` set when that cap cut files. OSError
    when the archive root cannot take it."""
    entry_dir(root, record.namespace, record.uid)  # the names are checked before any write
    tmp = f".{record.uid}.{secrets.token_hex(6)}.tmp"
    rootfd = open_root(root)
    try:
        nsfd = _mkdir_at(rootfd, record.namespace, str(root / record.namespace))
        try:
            os.mkdir(tmp, DIR_MODE, dir_fd=nsfd)
            try:
                entry = open_dir(nsfd, tmp, own_uids(), tmp)
                try:
                    named = [(source, _source_names(source)) for source in sources]
                    count = sum(len(names) for _, names in named if names is not None)
                    budget = _Budget(file_cap, entry_cap, count)
                    attempts = [
                        _copy_attempt(entry, source, names, budget)
                        if names is not None
                        else ArchivedAttempt(number=source.number)
                        for source, names in named
                    ]
                    status_json = json.dumps(status, sort_keys=True).encode()
                    write_at(entry, STATUS_FILE, status_json, FILE_MODE)
                    cap = entry_cap if budget.capped else None
                    final = record.model_copy(update={"attempts": attempts, "entry_cap": cap})
                    body = final.model_dump_json(by_alias=True).encode()
                    write_at(entry, RECORD_FILE, body, FILE_MODE)
                    os.fsync(entry)
                finally:
                    os.close(entry)
                if lstat_at(nsfd, record.uid) is not None:
                    remove_at(nsfd, record.uid)
                os.rename(tmp, record.uid, src_dir_fd=nsfd, dst_dir_fd=nsfd)
                os.fsync(nsfd)
            finally:
                if lstat_at(nsfd, tmp) is not None:
                    remove_at(nsfd, tmp)
        finally:
            os.close(nsfd)
    finally:
        os.close(rootfd)
    return final


def remove_at(parent: int, name: str) -> None:
    """Remove `name` of `parent` whatever it is (a link itself, never its target)."""
    entry = lstat_at(parent, name)
    if entry is None:
        return
    if stat.S_ISDIR(entry.st_mode):
        shutil.rmtree(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)


def read_small(parent: int, name: str, where: str) -> bytes:
    fd = open_file(parent, name, os.geteuid(), where)
    try:
        data = read_at_most(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise UnsafePath(f"{where}: larger than {MAX_RECORD_BYTES} bytes")
    return data


def read_record(root: Path, namespace: str, uid: str) -> ArchiveRecord | None:
    """The record of the entry of `namespace`/`uid`; None when there is none. UnsafePath when
    what is there is not the operator's, ValueError when it does not parse."""
    try:
        entry_dir(root, namespace, uid)
    except ValueError:
        return None
    try:
        with walk(root, (namespace, uid), own_uids()) as fd:
            data = read_small(fd, RECORD_FILE, f"{namespace}/{uid}/{RECORD_FILE}")
    except FileNotFoundError:
        return None
    record = ArchiveRecord.model_validate_json(data)
    if (record.namespace, record.uid) != (namespace, uid):
        raise ValueError(f"the record in {namespace}/{uid} names {record.namespace}/{record.uid}")
    return record


def archived_file(root: Path, namespace: str, uid: str, attempt: int, file: str) -> Path:
    """The path of one archived file, for the log readers (`read_tail`, `read_from` with the
    archive root and the operator's own uid); ValueError for a name no entry can hold."""
    if not (_LOG_RE.fullmatch(file) or file == SCRIPT_FILE) or not 1 <= attempt <= 1_000_000:
        raise ValueError(f"no archived file is named attempt-{attempt}/{file}")
    return entry_dir(root, namespace, uid) / f"attempt-{attempt}" / file
