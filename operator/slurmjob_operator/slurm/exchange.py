"""One request to slurmrestd and its answer, read into the `slurm.errors` taxonomy.

How far a request got decides the error: no connection means nothing was sent
(`SlurmTransient`); a timeout or a broken exchange after connecting means the server may have
read it, which for a submit is `SlurmAmbiguous`. Nothing here retries.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from slurmjob_operator.core.jobview import valid_job_id
from slurmjob_operator.slurm.auth import TokenError, TokenProvider
from slurmjob_operator.slurm.dialects import Dialect, Envelope
from slurmjob_operator.slurm.dialects.records import UNREADABLE, describe
from slurmjob_operator.slurm.errors import (
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmError,
    SlurmMalformed,
    SlurmTransient,
    classify,
)
from slurmjob_operator.slurm.http import ConnectError, ExchangeError, HttpTransport

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: on_request(endpoint_template, method, status_class, seconds); status_class is "2xx" ..
#: "5xx", "timeout" or "error" (no HTTP answer).
OnRequest = Callable[[str, str, str, float], None]


# No Slurm number has more digits than a uint64 (20).
_INT_DIGITS = 20


def _long_int(text: str) -> float:
    """A JSON integer too long for any Slurm field, read as infinite: every numeric field
    refuses it, so only the record that holds it is unreadable, not the whole answer."""
    return -math.inf if text.startswith("-") else math.inf


def _int_or_infinite(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= _INT_DIGITS else _long_int(text)


def decode_json(text: str) -> Any:
    """The JSON value of an answer body, or None when it is not JSON.

    Python refuses to read integers of more than 4300 digits (and runs out of stack on deep
    nesting); such a body is read again with the long integers as infinite.
    """
    try:
        return json.loads(text)
    except RecursionError:
        return None
    except ValueError:
        pass
    try:
        return json.loads(text, parse_int=_int_or_infinite)
    except (ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class Answer:
    status: int
    payload: dict[str, Any]
    envelope: Envelope

    def parse(
        self, parser: Callable[[Mapping[str, Any]], _T], template: str, method: str = "GET"
    ) -> _T:
        """`parser(payload)`; an answer it cannot read is `SlurmMalformed` (with the status and
        endpoint), other `SlurmError`s pass through."""
        try:
            return parser(self.payload)
        except SlurmMalformed as exc:
            reason = exc.reason
            cause: BaseException = exc
        except SlurmError:
            raise
        except UNREADABLE as exc:
            reason, cause = f"unreadable answer: {describe(exc)}", exc
        raise SlurmMalformed(
            reason, status=self.status, endpoint=template, method=method
        ) from cause


def auth_headers(token: TokenProvider | None, user: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if token is not None:
        try:
            headers["X-SLURM-USER-TOKEN"] = token.token()
        except TokenError as exc:
            raise SlurmAuthError(f"no token available: {exc}") from exc
    if user:
        headers["X-SLURM-USER-NAME"] = user
    return headers


async def exchange(
    transport: HttpTransport,
    method: str,
    url: str,
    *,
    template: str,
    headers: Mapping[str, str],
    request_timeout: float,
    params: Sequence[tuple[str, str]] | None = None,
    body: Mapping[str, Any] | None = None,
    submit: bool = False,
    on_request: OnRequest | None = None,
) -> tuple[int, Any, str]:
    """One HTTP exchange: (status, parsed JSON or None, body text). Network failures raise."""
    started = time.monotonic()
    status_class = "error"
    request_headers = dict(headers)
    data: bytes | None = None
    if body is not None:
        data = json.dumps(body).encode()
        request_headers["Content-Type"] = "application/json"
    try:
        response = await transport.request(
            method,
            url,
            params=params,
            headers=request_headers,
            body=data,
            timeout=request_timeout,
        )
        status = response.status
        raw = response.body
        status_class = f"{status // 100}xx"
    except ConnectError as exc:
        # No connection was made: the request cannot have been sent.
        raise SlurmTransient(
            f"cannot connect to slurmrestd: {exc}", endpoint=template, method=method
        ) from exc
    except TimeoutError as exc:
        status_class = "timeout"
        cls: type[SlurmError] = SlurmAmbiguous if submit else SlurmTransient
        raise cls("slurmrestd did not answer in time", endpoint=template, method=method) from exc
    except ExchangeError as exc:
        # Connected, then reset/closed or a broken answer: the request may have been read.
        cls = SlurmAmbiguous if submit else SlurmTransient
        raise cls(
            f"connection to slurmrestd failed: {exc}", endpoint=template, method=method
        ) from exc
    finally:
        if on_request is not None:
            try:
                on_request(template, method, status_class, time.monotonic() - started)
            except Exception:  # a metrics hook must never break a Slurm call
                log.exception("on_request callback failed")
    text = raw.decode("utf-8", errors="replace")
    payload = decode_json(text) if raw.strip() else None
    return status, payload, text


class Requester:
    """Requests to one slurmrestd as one user, answers read through one version's dialect."""

    def __init__(
        self,
        transport: HttpTransport,
        base_url: str,
        dialect: Dialect,
        *,
        token: TokenProvider,
        user: str | None = None,
        timeout: float = 30.0,
        on_request: OnRequest | None = None,
    ) -> None:
        self._transport = transport
        self._base = base_url.rstrip("/")
        self._dialect = dialect
        self._token = token
        self._user = user
        self._timeout = timeout
        self._on_request = on_request

    async def call(
        self,
        method: str,
        template: str,
        path: str,
        *,
        params: Sequence[tuple[str, str]] | None = None,
        body: Mapping[str, Any] | None = None,
        submit: bool = False,
        allow_304: bool = False,
        allow_empty: bool = False,
    ) -> Answer:
        """The answer to `method path` (`template` names the endpoint in errors and metrics),
        or the `slurm.errors` exception it amounts to."""
        status, payload, text = await exchange(
            self._transport,
            method,
            self._base + path,
            template=template,
            # Built per request: a token provider may hand out a fresh token each time.
            headers=auth_headers(self._token, self._user),
            request_timeout=self._timeout,
            params=params,
            body=body,
            submit=submit,
            on_request=self._on_request,
        )
        if status == 304 and allow_304:
            return Answer(status=status, payload={}, envelope=Envelope())
        env = self._dialect.parse_envelope(payload)
        is_json = isinstance(payload, Mapping)
        # A refused submit's record is cancelled by this id: only one Slurm could have made.
        job_id = valid_job_id(payload.get("job_id")) if is_json and submit else None
        error = classify(
            status,
            env.errors,
            json_body=is_json,
            text=text,
            submit=submit,
            endpoint=template,
            method=method,
            warnings=env.warnings,
            job_id=job_id,
        )
        if error is not None:
            raise error
        if not is_json:
            if allow_empty and not text.strip():
                return Answer(status=status, payload={}, envelope=env)
            cls: type[SlurmError] = SlurmAmbiguous if submit else SlurmTransient
            raise cls(
                "slurmrestd answered without a JSON body",
                status=status,
                endpoint=template,
                method=method,
            )
        return Answer(status=status, payload=dict(payload), envelope=env)
