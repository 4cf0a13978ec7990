"""What every dialect shares: the envelope, result types, value coercions, the Dialect contract."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from slurmjob_operator.core.jobview import (
    JOB_ID_MAX,
    JobId,
    JobStateEntry,
    SlurmJobView,
    normalise_state,
)
from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.slurm.dialects.fields import (
    JsonObject,
    OptStr,
    Response,
)
from slurmjob_operator.slurm.dialects.kill import BulkCancelResult
from slurmjob_operator.slurm.dialects.records import UNREADABLE, Records
from slurmjob_operator.slurm.errors import InvalidJobRef, SlurmMessage, SlurmUnsupported


class _RawMessage(Response):
    # v0.0.38 errors: error, error_number (spec) or error_code (REST layer); v0.0.36: errno;
    # v0.0.40+: description, error_number, error, source. Warnings: description, source.
    error: OptStr = None
    error_number: int | None = None
    error_code: int | None = None
    errno: int | None = None
    description: OptStr = None
    warning: OptStr = None
    source: OptStr = None

    def normalise(self) -> SlurmMessage:
        number = next(
            (n for n in (self.error_number, self.error_code, self.errno) if n is not None), None
        )
        return SlurmMessage(
            error_number=number,
            error=self.error,
            description=self.description or self.warning,
            source=self.source,
        )


class Envelope(BaseModel):
    """`errors[]`, `warnings[]` and what `meta` says about the server."""

    model_config = ConfigDict(frozen=True)

    errors: tuple[SlurmMessage, ...] = ()
    warnings: tuple[SlurmMessage, ...] = ()
    release: str | None = None
    cluster: str | None = None
    data_parser: str | None = None


_UNREADABLE_MESSAGE = "unreadable message from slurmrestd"


def _message(item: Mapping[str, Any]) -> SlurmMessage:
    try:
        return _RawMessage.model_validate(item).normalise()
    except UNREADABLE:
        # Still a message: an entry of `errors[]` that cannot be read is still an error.
        return SlurmMessage(description=_UNREADABLE_MESSAGE)


def _messages(items: Any) -> tuple[SlurmMessage, ...]:
    if not isinstance(items, list):
        return ()
    out: list[SlurmMessage] = []
    for item in items:
        if isinstance(item, Mapping):
            out.append(_message(item))
        elif isinstance(item, str) and item:
            out.append(SlurmMessage(description=item))
        elif item not in (None, ""):
            out.append(SlurmMessage(description=_UNREADABLE_MESSAGE))
    return tuple(out)


def _meta_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_envelope(payload: Any) -> Envelope:
    """Read the envelope of any version's answer; a non-object payload has an empty envelope.
    Never raises: whatever the answer holds, its errors and warnings are read as far as they
    can be (an unreadable entry of `errors[]` still counts as an error)."""
    if not isinstance(payload, Mapping):
        return Envelope()
    meta = payload.get("meta")
    release = cluster = data_parser = None
    if isinstance(meta, Mapping):
        # v0.0.38/39 capitalise `Slurm`; v0.0.40+ use `slurm`.
        slurm = meta.get("slurm") or meta.get("Slurm")
        if isinstance(slurm, Mapping):
            release = _meta_text(slurm.get("release"))
            cluster = _meta_text(slurm.get("cluster"))
        plugin = meta.get("plugin")
        if isinstance(plugin, Mapping):
            data_parser = _meta_text(plugin.get("data_parser"))
    return Envelope(
        errors=_messages(payload.get("errors")),
        warnings=_messages(payload.get("warnings")),
        release=release,
        cluster=cluster,
        data_parser=data_parser,
    )


class SubmitReceipt(BaseModel):
    """What a successful submit returned. `job_id` is the leader's id for a het job."""

    model_config = ConfigDict(frozen=True)

    job_id: JobId
    step_id: str | None = None
    user_message: str | None = None
    warnings: tuple[SlurmMessage, ...] = ()


class CancelResult(BaseModel):
    """DELETE succeeded. `already_done` is True when Slurm said the job had already ended
    (v0.0.38 cannot tell: it answers a plain success)."""

    model_config = ConfigDict(frozen=True)

    job_ref: str
    already_done: bool = False
    warnings: tuple[SlurmMessage, ...] = ()


class ControllerPing(BaseModel):
    model_config = ConfigDict(frozen=True)

    hostname: str | None = None
    responding: bool
    status: str | None = None


class PingResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    release: str | None = None
    cluster: str | None = None
    controllers: tuple[ControllerPing, ...] = ()

    @property
    def responding(self) -> bool:
        return any(c.responding for c in self.controllers)


# ASCII digits only: `\d` would take other scripts' digits, which int() reads as numbers.
_STATE_ID = re.compile(r"^([0-9]{1,10})(?:\+([0-9]{1,10}))?(?:_(.+))?$")


def parse_state_entry(raw_id: Any, raw_state: Any) -> JobStateEntry:
    """One `/jobs/state` entry; raises ValueError for an id that is not a job id."""
    if isinstance(raw_id, bool) or not isinstance(raw_id, int | str):
        raise ValueError(f"job_id is a {type(raw_id).__name__}")
    text = str(raw_id).strip()
    match = _STATE_ID.match(text)
    if match is None:
        raise ValueError("job_id is not a Slurm job id")
    states: tuple[str, ...]
    if isinstance(raw_state, str):
        states = (raw_state,)
    elif isinstance(raw_state, list):
        states = tuple(str(s) for s in raw_state)
    else:
        states = ()
    base, flags = normalise_state(states)
    return JobStateEntry(
        raw_job_id=text,
        job_id=int(match.group(1)),
        het_job_offset=int(match.group(2)) if match.group(2) is not None else None,
        array_task=match.group(3),
        raw_state=states,
        base_state=base,
        flags=flags,
    )


def environment_entries(environment: Mapping[str, str]) -> dict[str, str]:
    """Check the environment before Slurm does: it rejects a batch job without one (2127)."""
    if not environment:
        raise ValueError("environment must not be empty: Slurm rejects batch jobs without one")
    for key in environment:
        if not key or "=" in key:
            raise ValueError(f"invalid environment variable name {key!r}")
    return dict(environment)


class Dialect(ABC):
    """How one REST API version spells requests and responses. Pure: no I/O."""

    version: str
    #: `GET /slurm/V/jobs/state` exists.
    supports_jobs_state: bool = False
    #: `/slurm/V/job/{sluid}` paths are accepted (Slurm 26.05, v0.0.45).
    supports_sluid_paths: bool = False
    #: This dialect can read `/slurmdb/V/...` job records.
    supports_accounting: bool = False
    #: Whether a job description can exclude nodes (`excluded_nodes`, v0.0.40 on).
    supports_exclusion: bool = False
    #: `DELETE /slurm/V/jobs` with a list of ids (v0.0.40 from 23.11.6 on, v0.0.41+; a
    #: v0.0.40 without it answers an unserved route, which the caller takes as "ask per job").
    supports_bulk_cancel: bool = False

    @abstractmethod
    def submit_body(self, req: LaunchRequest) -> dict[str, Any]:
        """The exact JSON body for `POST /slurm/V/job/submit`."""

    # Every parse function raises only `SlurmError`s (`records.reading`): `SlurmMalformed`
    # for an answer it cannot read. List answers leave out an unreadable record and say so
    # in `Records.skipped`.

    @abstractmethod
    def parse_jobs(self, payload: JsonObject) -> Records[SlurmJobView]:
        """`GET /slurm/V/job/{id}` and `GET /slurm/V/jobs`."""

    @abstractmethod
    def parse_submit(self, payload: JsonObject) -> SubmitReceipt:
        """A submit answer that carried no errors (its job id in Slurm's range)."""

    @abstractmethod
    def parse_cancel(self, payload: JsonObject | None, job_ref: str) -> CancelResult:
        """A DELETE answer that carried no errors (may still raise for per-job failures)."""

    @abstractmethod
    def parse_ping(self, payload: JsonObject) -> PingResult:
        """`GET /slurm/V/ping`."""

    def parse_envelope(self, payload: Any) -> Envelope:
        return parse_envelope(payload)

    def parse_jobs_state(self, payload: JsonObject) -> Records[JobStateEntry]:
        """`GET /slurm/V/jobs/state` (v0.0.40+)."""
        raise SlurmUnsupported(f"/jobs/state is not served by {self.version}")

    def kill_jobs_body(self, refs: Sequence[str]) -> dict[str, Any]:
        """The body of `DELETE /slurm/V/jobs` for these ids (v0.0.40+)."""
        raise SlurmUnsupported(f"bulk cancel is not served by {self.version}")

    def parse_kill_jobs(self, payload: JsonObject | None, sent: Sequence[str]) -> BulkCancelResult:
        """`DELETE /slurm/V/jobs`: what happened to each id sent."""
        raise SlurmUnsupported(f"bulk cancel is not served by {self.version}")

    def parse_accounting_jobs(self, payload: JsonObject) -> Records[SlurmJobView]:
        """`GET /slurmdb/V/job/{id}` and `GET /slurmdb/V/jobs`."""
        raise SlurmUnsupported(f"accounting records are not read for {self.version}")

    def job_ref_path(self, ref: int | str) -> str:
        """Validate a job reference for a URL path: a number, "123+1", "123_4", or a SLUID.

        One no job can have raises `InvalidJobRef` (a `SlurmNotFound` and a ValueError).
        """
        if isinstance(ref, bool):
            raise TypeError("job reference must be an int or a str")
        if isinstance(ref, int):
            if not 1 <= ref <= JOB_ID_MAX:
                raise InvalidJobRef(f"invalid job id {ref}" if ref < 1 else "invalid job id")
            return str(ref)
        text = ref.strip()
        if text.startswith("s"):
            if not self.supports_sluid_paths:
                raise SlurmUnsupported(f"SLUID job references are not accepted by {self.version}")
            if not SLUID_PATTERN.match(text):
                raise InvalidJobRef(f"invalid SLUID {ref[:40]!r}")
            return text
        match = _STATE_ID.match(text)
        if match is None or "[" in text or not 1 <= int(match.group(1)) <= JOB_ID_MAX:
            raise InvalidJobRef(f"invalid job reference {ref[:40]!r}")
        return text


# "s" + 13 Crockford base32 digits; the path parser only recognises a lower-case "s".
SLUID_PATTERN = re.compile(r"^s[0-9A-Za-z]{13}$")
