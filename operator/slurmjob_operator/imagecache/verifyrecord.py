"""The verification of registry artifacts (docs/images.md, "Verified registry artifacts"): the
operator's record of one (runtime id, registry sha256, node path), the names that tie it to
its verification jobs, and the result file such a job writes.

Where a site opts in (SLURMJOB_ARTIFACT_VERIFY_JOBS), a runtime-registry artifact is hashed
once, by a job of the cache user on the import partition, instead of on every job's node.
The job also checks that only root or the file's owner (root or the cache user) can change
the file or its directory, and records what `stat` prints of it. Jobs that run it then
compare that `stat` line, as the image cache's entries are checked.

`ArtifactRecord` is the operator's own (a ConfigMap of its namespace, never a SlurmJob's
status). `VerifyResult` comes from a file on the shared storage: hostile in principle, so it
is parsed strictly (a fixed set of `key=value` lines, bounded, every value of a fixed
alphabet) and nothing in it names a path. Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from slurmjob_operator.api.model import Model
from slurmjob_operator.imagecache.layout import DNS_LABEL_MAX, is_dns_label, is_safe_word
from slurmjob_operator.imagecache.record import (
    Failure,
    Hex64,
    ImportAttempt,
    Inode,
    Nanoseconds,
    Size,
    stored_json,
)
from slurmjob_operator.imagecache.resultfile import OCTAL, ResultFileError, ResultFormat, ctime_text
from slurmjob_operator.site.catalogs import ArtifactFormat

SCHEMA_VERSION = 1
RECORD_KEY_PREFIX = "artifact-"
VERIFY_JOB_PREFIX = "slurmjob-verify-"
#: Under the cache root: the verification jobs' result files (`<job name>.result`).
VERIFY_DIR = "verify"
RESULT_SUFFIX = ".result"
MAX_RECORD_BYTES = 64 * 1024
MAX_RESULT_BYTES = 1024
MAX_PATH = 4096
MAX_RUNTIME_ID = 253
#: Group and other write: a verified artifact and its directory have neither.
GROUP_OTHER_WRITE = 0o022
_KEY_HASH = 16
_KEY_SLUG_MAX = DNS_LABEL_MAX - len(RECORD_KEY_PREFIX) - 1 - _KEY_HASH
_JOB_HASH = 12
_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")

Uid = Annotated[int, Field(strict=True, ge=0, le=2**32 - 2)]
Mode = Annotated[int, Field(strict=True, ge=0, le=0o7777)]


def artifact_key(runtime_id: str, sha256: str, node_path: str) -> str:
    """The record's name: `artifact-<slug>-<hash16>`, a DNS label. The hash covers the
    runtime id, the registry's sha256 and the path: a registry entry that changes any of them
    is a new record, verified anew."""
    slug = "".join(c if c in _LOWER else "-" for c in runtime_id.lower())
    slug = "-".join(part for part in slug.split("-") if part)[:_KEY_SLUG_MAX].strip("-")
    digest = hashlib.sha256(f"{runtime_id}\n{sha256}\n{node_path}".encode()).hexdigest()
    key = f"{RECORD_KEY_PREFIX}{slug or 'x'}-{digest[:_KEY_HASH]}"
    if not is_dns_label(key):  # pragma: no cover - by construction
        raise ValueError(f"record key {key!r} is not a DNS label")
    return key


def verify_job_name(key: str, epoch: int, attempt: int) -> str:
    """`slurmjob-verify-<hash12>-<n>`: one name per attempt of one record's life (the epoch,
    the record's creation second, keeps a record made again from reusing a job's name)."""
    if not key.startswith(RECORD_KEY_PREFIX) or not is_dns_label(key):
        raise ValueError(f"{key!r} is not an artifact record key")
    if attempt < 1 or epoch < 0:
        raise ValueError("attempts count from 1; the epoch is a Unix time")
    seed = hashlib.sha256(f"{key}\n{epoch}".encode()).hexdigest()[:_JOB_HASH]
    return f"{VERIFY_JOB_PREFIX}{seed}-{attempt}"


def verify_result_path(cache_root: PurePosixPath, job_name: str) -> PurePosixPath:
    if not is_safe_word(job_name):
        raise ValueError(f"{job_name!r} is not a safe path word")
    return cache_root / VERIFY_DIR / (job_name + RESULT_SUFFIX)


def _node_path(value: str) -> str:
    # The admin's registry names the path (trusted), but it reaches a shell and a `stat`:
    # an absolute path of printable characters with no '..', '.' or empty component.
    parts = value.split("/")
    if (
        len(value) > MAX_PATH
        or parts[0] != ""
        or any(p in ("", ".", "..") for p in parts[1:])
        or not value.isprintable()
    ):
        raise ValueError(f"artifact path {value[:80]!r} is not a plain absolute path")
    return value


class VerifyState(StrEnum):
    VERIFYING = "Verifying"  # a job checks the file, or waits to be retried
    VERIFIED = "Verified"
    FAILED = "Failed"


class VerifiedFile(Model):
    """The artifact as its verification job saw it after hashing it: what the operator and
    the jobs' nodes compare from then on."""

    job_name: str = Field(max_length=200)
    sha256: Hex64
    size: Size
    inode: Inode
    ctime_ns: Nanoseconds
    owner_uid: Uid
    mode: Mode
    verified_at: AwareDatetime


class ArtifactRecord(Model):
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)
    key: str = Field(max_length=DNS_LABEL_MAX)
    #: The record's creation second: part of its jobs' names.
    epoch: int = Field(ge=0)
    runtime_id: str = Field(min_length=1, max_length=MAX_RUNTIME_ID)
    sha256: Hex64
    #: The artifact as the compute nodes see it.
    path: str
    format: ArtifactFormat
    state: VerifyState
    attempt: ImportAttempt | None = None
    verified: VerifiedFile | None = None
    failure: Failure | None = None
    retries: int = Field(default=0, ge=0)

    @field_validator("runtime_id")
    @classmethod
    def _runtime_id(cls, value: str) -> str:
        if not value.isprintable():
            raise ValueError("a runtime id is printable")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _node_path(value)

    @model_validator(mode="after")
    def _consistent(self) -> ArtifactRecord:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema version {self.schema_version} is not {SCHEMA_VERSION}")
        if self.key != artifact_key(self.runtime_id, self.sha256, self.path):
            raise ValueError(f"record key {self.key} is not the key of its artifact")
        if (self.state is VerifyState.VERIFIED) != (self.verified is not None):
            raise ValueError("a record is Verified exactly when it has a verified file")
        if self.verified is not None and self.verified.sha256 != self.sha256:
            raise ValueError("a verified file has the registry's sha256")
        if self.state is VerifyState.FAILED and self.failure is None:
            raise ValueError("a Failed record has a failure")
        return self

    @property
    def in_flight(self) -> bool:
        return self.attempt is not None and self.attempt.ended_at is None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ArtifactRecord:
        """A stored record; a newer schema is refused (an operator that does not know its
        fields must not rewrite it)."""
        data, _ = stored_json(text, "artifact record", MAX_RECORD_BYTES, SCHEMA_VERSION)
        return cls.model_validate(data)


# ---------------------------------------------------------------------------------------------
# The result file


class VerifyResultError(ResultFileError):
    """A verification job's result file is unusable; the message says why."""


class VerifyResult(BaseModel):
    """What the verification job wrote once the artifact passed, one `key=value` a line:
    `job`, `format`, `sha256`, `size`, `inode`, `ctime` (`seconds.nanoseconds` as
    `stat -c %.9Z` prints it), `uid` and `mode` (octal, as `stat -c %a` prints it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str = Field(max_length=200)
    format: ArtifactFormat
    sha256: Hex64
    size: Size
    inode: Inode
    ctime_ns: Nanoseconds
    uid: Uid
    mode: Mode

    @field_validator("job")
    @classmethod
    def _job(cls, value: str) -> str:
        if not is_safe_word(value):
            raise ValueError(f"job name {value!r} is not a safe word")
        return value

    def render(self) -> str:
        """The file's text, as the verification script writes it."""
        values = {
            "job": self.job,
            "format": self.format.value,
            "sha256": self.sha256,
            "size": str(self.size),
            "inode": str(self.inode),
            "ctime": ctime_text(self.ctime_ns),
            "uid": str(self.uid),
            "mode": f"{self.mode:o}",
        }
        return RESULT_FORMAT.render(values)


RESULT_KEYS = ("job", "format", "sha256", "size", "inode", "ctime", "uid", "mode")
RESULT_FORMAT = ResultFormat(
    keys=RESULT_KEYS,
    max_bytes=MAX_RESULT_BYTES,
    alphabet=frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"),
    error=VerifyResultError,
)


def parse_verify_result(data: bytes) -> VerifyResult:
    """The result file's content, or a `VerifyResultError`: at most `MAX_RESULT_BYTES` of
    ASCII, each key of `RESULT_KEYS` exactly once, nothing else."""
    values = RESULT_FORMAT.values(data)
    fields: dict[str, object] = {
        "job": values["job"],
        "format": values["format"],
        "sha256": values["sha256"],
        "size": RESULT_FORMAT.number("size", values["size"]),
        "inode": RESULT_FORMAT.number("inode", values["inode"]),
        "ctime_ns": RESULT_FORMAT.ctime_ns(values["ctime"]),
        "uid": RESULT_FORMAT.number("uid", values["uid"]),
        "mode": RESULT_FORMAT.number("mode", values["mode"], OCTAL, 8),
    }
    return RESULT_FORMAT.model(VerifyResult, fields)
