"""The image cache's records, and the result file an import job writes.

`ImageRecord` is the operator's own account of one (scope, canonical reference): the import
attempt in flight (recorded before its submit: the write-ahead), the digest a tag resolved
to and when, the published entry with the size, inode and ctime the node saw, the failure,
the last use and the SlurmJobs that use it. It lives in an object the operator owns and is
never read back from a SlurmJob's status. `schemaVersion` lets a later operator upgrade it.

`ImportResult` is read from a file the import job wrote on the shared storage: hostile in
principle, so it is parsed strictly (a fixed set of `key=value` lines, bounded, every value
of a fixed alphabet) and nothing in it names a path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from slurmjob_operator.api.model import Model
from slurmjob_operator.core.jobview import JobId
from slurmjob_operator.imagecache.layout import is_dns_label, is_safe_word, scope_tenant
from slurmjob_operator.imagecache.reference import (
    ImageReference,
    ImageReferenceError,
    parse_reference,
)
from slurmjob_operator.imagecache.resultfile import ResultFileError, ResultFormat, ctime_text
from slurmjob_operator.site.catalogs import ArtifactFormat

SCHEMA_VERSION = 1
#: SlurmJobs listed as users of one record; past it the oldest use is forgotten (a waiting
#: or running SlurmJob is listed again at its next reconcile).
MAX_USERS = 512
#: Entries a moved tag left behind, kept for eviction and for the jobs still using them.
MAX_RETIRED = 16
MAX_RECORD_BYTES = 256 * 1024
MAX_RESULT_BYTES = 4096
MAX_MESSAGE = 1024
#: The nodes' platform: the import resolves a manifest list to this.
PLATFORM = "linux/amd64"

DIGEST_RE = r"^sha256:[0-9a-f]{64}$"
HEX64_RE = r"^[0-9a-f]{64}$"
Digest = Annotated[str, Field(pattern=DIGEST_RE)]
Hex64 = Annotated[str, Field(pattern=HEX64_RE)]
#: Sizes, inodes and times: what `stat` prints, bounded.
Size = Annotated[int, Field(strict=True, ge=1, le=2**63 - 1)]
Inode = Annotated[int, Field(strict=True, ge=1, le=2**64 - 1)]
Nanoseconds = Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)]
Uid = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")]
Reason = Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]{0,62}$")]


class RecordState(StrEnum):
    RESOLVING = "Resolving"  # a job is finding what a tag names now
    IMPORTING = "Importing"  # a job is importing a digest, or waits to be retried
    READY = "Ready"
    FAILED = "Failed"


class FailureKind(StrEnum):
    TRANSIENT = "transient"  # retried per the site's policy
    PERMANENT = "permanent"  # fails the waiting SlurmJobs at once


def _checked_word(value: str, what: str) -> str:
    if not is_safe_word(value):
        raise ValueError(f"{what} {value!r} is not a safe word")
    return value


def _checked_canonical(value: str) -> str:
    try:
        parsed = parse_reference(value)
    except ImageReferenceError as exc:
        raise ValueError(str(exc)) from None
    if parsed.canonical != value:
        raise ValueError(f"reference {value!r} is not canonical ({parsed.canonical!r})")
    return value


class ImportAttempt(Model):
    """One import job: named and recorded before it is submitted (`write_ahead` until the
    submit's answer, its job id, is recorded), ended once its outcome is recorded."""

    number: int = Field(ge=1, le=1_000_000)
    job_name: str = Field(max_length=200)
    job_id: JobId | None = None
    submitted_at: AwareDatetime
    write_ahead: bool = True
    ended_at: AwareDatetime | None = None

    @field_validator("job_name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _checked_word(value, "job name")

    @model_validator(mode="after")
    def _write_ahead_until_answered(self) -> ImportAttempt:
        if self.write_ahead != (self.job_id is None):
            raise ValueError("an attempt is write-ahead exactly while its job id is unknown")
        return self


class Resolved(Model):
    """What a tag named when it was last resolved (a digest reference names itself)."""

    digest: Digest
    at: AwareDatetime


class Entry(Model):
    """A published cache file, as the import's node saw it after the rename."""

    digest: Digest
    sha256: Hex64
    size: Size
    inode: Inode
    ctime_ns: Nanoseconds
    path: str = Field(max_length=4096)
    published_at: AwareDatetime
    #: Set once the record's tag moved on to another digest.
    retired_at: AwareDatetime | None = None

    @field_validator("path")
    @classmethod
    def _absolute_safe(cls, value: str) -> str:
        parts = value.split("/")
        if parts[0] != "" or not all(is_safe_word(p) for p in parts[1:]):
            raise ValueError(f"entry path {value!r} is not an absolute path of safe words")
        return value

    @property
    def ctime(self) -> str:
        """The ctime as `stat -c %.9Z` prints it (as `CachedImage.recorded` shows it)."""
        return ctime_text(self.ctime_ns)


class Failure(Model):
    kind: FailureKind
    reason: Reason
    message: str = Field(max_length=MAX_MESSAGE)
    at: AwareDatetime
    #: When the next attempt may start (transient failures with retries left).
    retry_at: AwareDatetime | None = None


class ImageUser(Model):
    """A SlurmJob (by uid) that uses the record's entry of `digest`."""

    uid: Uid
    digest: Digest


class ImageRecord(Model):
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)
    key: str = Field(max_length=63)
    #: The record's creation second: part of its import jobs' names.
    epoch: int = Field(ge=0)
    scope: str = Field(max_length=80)
    reference: str = Field(max_length=512)
    format: ArtifactFormat
    state: RecordState
    attempt: ImportAttempt | None = None
    resolved: Resolved | None = None
    entry: Entry | None = None
    retired: list[Entry] = Field(default_factory=list, max_length=MAX_RETIRED)
    failure: Failure | None = None
    retries: int = Field(default=0, ge=0)
    last_use: AwareDatetime | None = None
    #: The share the entry counts in (`ImageRequest.charged`): the tenant whose SlurmJob made
    #: the record; None: the scope's own (a record of an earlier build, or no tenants).
    charged: str | None = Field(default=None, max_length=80)
    users: list[ImageUser] = Field(default_factory=list, max_length=MAX_USERS)

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not is_dns_label(value):
            raise ValueError(f"record key {value!r} is not a DNS label")
        return value

    @field_validator("scope")
    @classmethod
    def _scope(cls, value: str) -> str:
        scope_tenant(value)
        return value

    @field_validator("reference")
    @classmethod
    def _reference(cls, value: str) -> str:
        return _checked_canonical(value)

    @field_validator("charged")
    @classmethod
    def _charged(cls, value: str | None) -> str | None:
        if value is not None:
            scope_tenant(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ImageRecord:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema version {self.schema_version} is not {SCHEMA_VERSION}")
        if self.state is RecordState.READY and self.entry is None:
            raise ValueError("a Ready record has an entry")
        if self.state is RecordState.FAILED and self.failure is None:
            raise ValueError("a Failed record has a failure")
        return self

    @property
    def parsed_reference(self) -> ImageReference:
        return parse_reference(self.reference)

    @property
    def tenant(self) -> str | None:
        return scope_tenant(self.scope)

    @property
    def in_flight(self) -> bool:
        """An attempt was recorded and its outcome not yet."""
        return self.attempt is not None and self.attempt.ended_at is None

    def pinned_digests(self) -> frozenset[str]:
        return frozenset(user.digest for user in self.users)

    def used_by(self, uid: str, now: datetime) -> ImageRecord:
        """The record with `uid` listed as using the current entry, and `now` as last use."""
        if self.entry is None:
            raise ValueError(f"record {self.key} has no entry to use")
        users = [u for u in self.users if u.uid != uid]
        users.append(ImageUser(uid=uid, digest=self.entry.digest))
        return self.model_copy(update={"users": users[-MAX_USERS:], "last_use": now})

    def released_by(self, uid: str) -> ImageRecord:
        """The record without `uid` (its SlurmJob is final or gone)."""
        return self.model_copy(update={"users": [u for u in self.users if u.uid != uid]})

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ImageRecord:
        """Parse a stored record, upgrading an older schema; a newer one is refused (an
        operator that does not know its fields must not rewrite it)."""
        data, version = stored_json(text, "image record", MAX_RECORD_BYTES, SCHEMA_VERSION)
        while version < SCHEMA_VERSION:
            data = _UPGRADES[version](data)
            version = data["schemaVersion"]
        return cls.model_validate(data)


#: schemaVersion n -> the function that turns a record of version n into one of n + 1.
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def stored_json(
    text: str | bytes, what: str, max_bytes: int, schema_version: int
) -> tuple[dict[str, Any], int]:
    """A stored record's JSON object and its `schemaVersion`, which is refused when newer
    than `schema_version`: an operator that does not know its fields must not rewrite it."""
    if len(text) > max_bytes:
        raise ValueError(f"{what}: more than {max_bytes} bytes")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{what}: not a JSON object")
    version = data.get("schemaVersion")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"{what}: schemaVersion {version!r} is not a version")
    if version > schema_version:
        raise ValueError(
            f"{what}: schemaVersion {version} is newer than this operator's {schema_version}"
        )
    return data, version


# ---------------------------------------------------------------------------------------------
# The result file


class ResultError(ResultFileError):
    """The import's result file is unusable; the message says why."""


class ImportResult(BaseModel):
    """What the import job wrote after it published the entry, one `key=value` a line:
    `job`, `reference`, `format`, `platform`, `digest`, `sha256`, `size`, `inode` and
    `ctime` (`seconds.nanoseconds` as `stat -c %.9Z` prints it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str = Field(max_length=200)
    reference: str = Field(max_length=512)
    format: ArtifactFormat
    platform: str = Field(max_length=64, pattern=r"^[a-z0-9]+/[a-z0-9]+(/[a-z0-9]+)?$")
    digest: Digest
    sha256: Hex64
    size: Size
    inode: Inode
    ctime_ns: Nanoseconds

    @field_validator("job")
    @classmethod
    def _job(cls, value: str) -> str:
        return _checked_word(value, "job name")

    @field_validator("reference")
    @classmethod
    def _reference(cls, value: str) -> str:
        return _checked_canonical(value)

    def render(self) -> str:
        """The file's text, as the import script writes it."""
        values = {
            **self.model_dump(mode="json", exclude={"ctime_ns"}),
            "ctime": ctime_text(self.ctime_ns),
        }
        return RESULT_FORMAT.render(values)


RESULT_KEYS = (
    "job",
    "reference",
    "format",
    "platform",
    "digest",
    "sha256",
    "size",
    "inode",
    "ctime",
)
RESULT_FORMAT = ResultFormat(
    keys=RESULT_KEYS,
    max_bytes=MAX_RESULT_BYTES,
    alphabet=frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@"),
    error=ResultError,
    keys_suffix="=...",
    odd="unexpected",
    whole_seconds=True,
)


def parse_result(data: bytes) -> ImportResult:
    """The result file's content, or a `ResultError`: at most `MAX_RESULT_BYTES` of ASCII,
    each key of `RESULT_KEYS` exactly once, nothing else."""
    values = RESULT_FORMAT.values(data)
    fields: dict[str, object] = {k: v for k, v in values.items() if k != "ctime"}
    fields["size"] = RESULT_FORMAT.number("size", values["size"])
    fields["inode"] = RESULT_FORMAT.number("inode", values["inode"])
    fields["ctime_ns"] = RESULT_FORMAT.ctime_ns(values["ctime"])
    return RESULT_FORMAT.model(ImportResult, fields)
