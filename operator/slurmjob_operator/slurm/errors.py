"""The failures the operator acts on, and the one function that decides which is which.

slurmrestd's HTTP status is not reliable across releases (the same bad token is a 500 on 22.05
and a 511 on 24.11+, an unknown job a 500 on 22.05 and a 404 later), so `classify` looks at the
Slurm error numbers and texts in `errors[]` first and at the status second.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict


class SlurmMessage(BaseModel):
    """One entry of `errors[]` or `warnings[]`, whatever the version called its fields."""

    model_config = ConfigDict(frozen=True)

    error_number: int | None = None
    error: str | None = None
    description: str | None = None
    source: str | None = None

    @property
    def text(self) -> str:
        parts = [p for p in (self.description, self.error) if p]
        if self.error_number not in (None, 0):
            parts.append(f"[{self.error_number}]")
        if self.source:
            parts.append(f"({self.source})")
        return " ".join(parts) if parts else "unspecified"


class SlurmError(Exception):
    """Base of every failure raised by the slurm layer."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        errors: Iterable[SlurmMessage] = (),
        warnings: Iterable[SlurmMessage] = (),
        endpoint: str | None = None,
        method: str | None = None,
        job_id: int | None = None,
    ) -> None:
        self.status = status
        self.errors = tuple(errors)
        self.warnings = tuple(warnings)
        self.endpoint = endpoint
        self.method = method
        # A refused submit can still have created a job record (22.05: HTTP 200 + errors +
        # job_id); the caller needs the id to cancel it.
        self.job_id = job_id
        details = "; ".join(e.text for e in self.errors)
        where = f"{method or ''} {endpoint or ''}".strip()
        full = message
        if status is not None:
            full += f" (HTTP {status})"
        if where:
            full += f" [{where}]"
        if details:
            full += f": {details}"
        super().__init__(full)

    @property
    def error_numbers(self) -> tuple[int, ...]:
        return tuple(e.error_number for e in self.errors if e.error_number is not None)


class SlurmAuthError(SlurmError):
    """The token was refused (expired, bad signature, unknown user) or headers are missing."""


class SlurmNotFound(SlurmError):
    """The job is unknown to the controller (never existed, or purged after MinJobAge)."""


class SlurmRejected(SlurmError):
    """Slurm refused the request; nothing will change by sending the same thing again."""


class SlurmTransient(SlurmError):
    """Nothing was done; the same request may be sent again later."""


class SlurmAmbiguous(SlurmError):
    """Submit only: the request may have reached slurmctld but its answer was lost.

    A job may exist. Reconcile (find the job by its unique name) before submitting again.
    """


class SlurmUnsupported(SlurmError):
    """The operation or path is not served by this REST API version or server."""


class SlurmMalformed(SlurmError):
    """slurmrestd answered, but in a shape the operator cannot read: a field of the wrong
    type, a number outside Slurm's range, a list that is not a list. Says nothing about what
    the request did (a submit answer that cannot be read is `SlurmAmbiguous` instead)."""

    def __init__(self, reason: str, **context: Any) -> None:
        #: What was wrong, without the HTTP status and endpoint the message adds.
        self.reason = reason
        super().__init__(reason, **context)


class InvalidJobRef(SlurmNotFound, ValueError):
    """A job reference no Slurm job can have (0, negative, beyond Slurm's uint32 ids, neither
    an id nor a SLUID). Nothing is sent: no such job exists. A ValueError as well, since the
    caller handed it in (a status `jobId` is a claim anyone with status write access makes)."""


# slurm_errno.h: SLURM_PROTOCOL_AUTHENTICATION_ERROR, SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT
# (what a 22.05 slurmctld's refusal of a bad token looks like through slurmrestd),
# ESLURM_AUTH_CRED_INVALID / ESLURM_AUTH_BADARG range (6000, 6001).
AUTH_ERROR_NUMBERS = frozenset({1007, 5005, 6000, 6001})
# SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT: a refused token on 22.05, or a connection slurmctld
# closed after reading the request; `SlurmClient.submit` tells the two apart with a ping.
ZERO_BYTES = 5005
INVALID_JOB_ID = 2017
ALREADY_DONE = 2021
_NOT_FOUND_TEXTS = ("invalid job id", "unknown job")
_AUTH_TEXTS = ("slurmctld config is unable to load", "protocol authentication error")
# Failure to open a connection to slurmctld/slurmdbd: the RPC was never sent.
_CONNECT_ERROR_NUMBERS = frozenset({1001, 1800, 1804, 7000})
# Failure after the RPC may have been sent (send/receive errors, socket timeouts).
_IN_FLIGHT_ERROR_NUMBERS = frozenset({1002, 1003, 1004, 1801, 1802, 1803, 5000, 5001, 5002, 5004})
# Plain-text bodies slurmrestd writes before it talks to slurmctld at all.
_PRE_DISPATCH_TEXTS = (
    "unable to parse",
    "authentication failure",
    "unable to find requested url endpoint",
)


def _mentions(messages: Iterable[SlurmMessage], needles: tuple[str, ...]) -> bool:
    for m in messages:
        text = f"{m.description or ''} {m.error or ''}".lower()
        if any(n in text for n in needles):
            return True
    return False


def is_auth_failure(errors: tuple[SlurmMessage, ...]) -> bool:
    """True when `errors[]` shows a refused token whatever the HTTP status."""
    if any(e.error_number in AUTH_ERROR_NUMBERS for e in errors):
        return True
    # 22.05 ping with a bad token: error -1 from slurm_load_ctl_conf and this text.
    return _mentions(errors, _AUTH_TEXTS)


def is_not_found(errors: tuple[SlurmMessage, ...]) -> bool:
    if any(e.error_number == INVALID_JOB_ID for e in errors):
        return True
    return _mentions(errors, _NOT_FOUND_TEXTS)


def classify(
    status: int,
    errors: tuple[SlurmMessage, ...],
    *,
    json_body: bool,
    text: str = "",
    submit: bool = False,
    endpoint: str | None = None,
    method: str | None = None,
    warnings: tuple[SlurmMessage, ...] = (),
    job_id: int | None = None,
) -> SlurmError | None:
    """Map one complete HTTP answer to an error, or None when it is a success.

    `errors` is the parsed `errors[]` (empty when the body was not JSON); `json_body` says
    whether a JSON object was parsed at all. 304 is not an error (the caller knows it means
    "no change"). `submit` switches the "was anything done?" questions to the cautious side.
    """

    def make(cls: type[SlurmError], message: str) -> SlurmError:
        return cls(
            message,
            status=status,
            errors=errors,
            warnings=warnings,
            endpoint=endpoint,
            method=method,
            job_id=job_id,
        )

    if status in (401, 511) or is_auth_failure(errors):
        return make(SlurmAuthError, "authentication refused")
    if is_not_found(errors):
        return make(SlurmNotFound, "job not found")
    if status == 404 and not errors:
        # A route slurmrestd does not serve (plain-text 404), not a missing job: reporting
        # "not found" here would make a caller believe its job vanished.
        return make(SlurmUnsupported, "endpoint not served")
    if 200 <= status < 400 and not errors:
        return None
    if any(e.error_number in _CONNECT_ERROR_NUMBERS for e in errors):
        return make(SlurmTransient, "slurmrestd could not reach the daemon")
    if any(e.error_number in _IN_FLIGHT_ERROR_NUMBERS for e in errors):
        cls: type[SlurmError] = SlurmAmbiguous if submit else SlurmTransient
        return make(cls, "communication with the daemon failed")
    if status in (502, 503, 504):
        # slurmrestd never answers 503 itself; a proxy in front of it (Envoy, for one) does,
        # also when the upstream broke after the request was sent: a submit may exist.
        cls = SlurmAmbiguous if submit else SlurmTransient
        return make(cls, "gateway failure")
    if errors:
        # Slurm answered with its own error codes: the request was read and refused.
        return make(SlurmRejected, "request refused")
    if 400 <= status < 500:
        suffix = f": {text.strip()[:200]}" if text.strip() else ""
        return make(SlurmRejected, f"request refused{suffix}")
    if status >= 500:
        lowered = text.lower()
        if not json_body and any(t in lowered for t in _PRE_DISPATCH_TEXTS):
            return make(SlurmTransient, f"server error: {text.strip()[:200]}")
        cls = SlurmAmbiguous if submit else SlurmTransient
        return make(cls, "server error without a usable body")
    return make(SlurmRejected, f"unexpected HTTP status {status}")
