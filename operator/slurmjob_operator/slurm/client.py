"""`SlurmClient`: every slurmrestd call the operator makes, over one shared `HttpTransport`.

Nothing here retries. Failures are raised as the `slurm.errors` taxonomy so the caller can
decide: `SlurmTransient` means nothing was done, `SlurmAmbiguous` (submit only) means a job
may exist and must be looked for (`find_by_name`) before submitting again.

The transport is the caller's (`slurm.http`: one connection per request, and tolerant of the
malformed responses some slurmrestd releases write).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, ValidationError

from slurmjob_operator.core.jobview import JobStateEntry, SlurmJobView
from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.slurm.auth import TokenError, TokenProvider
from slurmjob_operator.slurm.dialects import (
    CancelResult,
    Dialect,
    Envelope,
    PingResult,
    SubmitReceipt,
    dialect_for,
    parse_envelope,
)
from slurmjob_operator.slurm.errors import (
    ZERO_BYTES,
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmError,
    SlurmMessage,
    SlurmNotFound,
    SlurmTransient,
    SlurmUnsupported,
    classify,
)
from slurmjob_operator.slurm.http import ConnectError, ExchangeError, HttpTransport
from slurmjob_operator.slurm.nodes import NodeInfo, parse_nodes, parse_partition_names
from slurmjob_operator.versions import SUPPORTED_VERSIONS, version_key

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: on_request(endpoint_template, method, status_class, seconds); status_class is "2xx" ..
#: "5xx", "timeout" or "error" (no HTTP answer).
OnRequest = Callable[[str, str, str, float], None]

DEFAULT_LOOKBACK = timedelta(days=7)
_NO_CHANGE_TEXT = "no job changes"


class JobListResult(BaseModel):
    """`GET /jobs`. When `not_modified` is True `jobs` is empty and means nothing: the
    controller had no change since `update_time` (v0.0.38: HTTP 304; v0.0.40+: a warning)."""

    model_config = ConfigDict(frozen=True)

    jobs: tuple[SlurmJobView, ...] = ()
    not_modified: bool = False
    warnings: tuple[SlurmMessage, ...] = ()


@dataclass(frozen=True)
class _Answer:
    status: int
    payload: dict[str, Any]
    envelope: Envelope


def _headers(token: TokenProvider | None, user: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if token is not None:
        try:
            headers["X-SLURM-USER-TOKEN"] = token.token()
        except TokenError as exc:
            raise SlurmAuthError(f"no token available: {exc}") from exc
    if user:
        headers["X-SLURM-USER-NAME"] = user
    return headers


async def _exchange(
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
    payload: Any = None
    if raw.strip():
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
    return status, payload, text


def served_versions(openapi: Mapping[str, Any]) -> set[str]:
    """REST API versions with at least one `/slurm/vX/` path in an OpenAPI document."""
    paths = openapi.get("paths")
    found: set[str] = set()
    if isinstance(paths, Mapping):
        for path in paths:
            parts = str(path).split("/")
            if len(parts) > 2 and parts[1] == "slurm" and parts[2].startswith("v"):
                found.add(parts[2])
    return found


def pick_version(
    openapi: Mapping[str, Any], supported: Sequence[str] = SUPPORTED_VERSIONS
) -> str | None:
    """The newest supported version the document serves, or None."""
    usable = served_versions(openapi) & set(supported)
    return max(usable, key=version_key) if usable else None


@dataclass(frozen=True)
class Discovery:
    """What a slurmrestd serves: the chosen version, every served one, and whether the
    accounting (`/slurmdb/`) paths of that version exist (None: not known, no document)."""

    version: str
    served: frozenset[str]
    accounting: bool | None


def _serves_accounting(openapi: Mapping[str, Any], version: str) -> bool:
    paths = openapi.get("paths")
    prefix = f"/slurmdb/{version}/"
    return isinstance(paths, Mapping) and any(str(p).startswith(prefix) for p in paths)


async def discover(
    transport: HttpTransport,
    base_url: str,
    *,
    token: TokenProvider | None = None,
    user: str | None = None,
    request_timeout: float = 30.0,
    supported: Sequence[str] = SUPPORTED_VERSIONS,
    wanted: str | None = None,
) -> Discovery:
    """The newest REST API version in `supported` that the server serves (or check that
    `wanted` is served), from `/openapi/v3` (then `/openapi.json`).

    Without a document, probes `GET /slurm/vX/ping` newest first, moving on at 404. Slurm
    22.05 wants both auth headers even for the OpenAPI document, so pass them. Probing the
    `/slurmdb/` paths instead is no option: 26.05 answers an unserved one with two HTTP
    responses on one connection (see `slurm.http`).
    """
    base = base_url.rstrip("/")
    candidates = [wanted] if wanted else list(supported)
    for path in ("/openapi/v3", "/openapi.json"):
        status, payload, _ = await _exchange(
            transport,
            "GET",
            base + path,
            template=path,
            headers=_headers(token, user),
            request_timeout=request_timeout,
        )
        if status == 401:
            raise SlurmAuthError(
                "authentication refused", status=status, endpoint=path, method="GET"
            )
        if status == 200 and isinstance(payload, Mapping) and "paths" in payload:
            served = served_versions(payload)
            chosen = pick_version(payload, candidates)
            if chosen is None:
                listed = ", ".join(sorted(served, key=version_key)) or "none"
                raise SlurmUnsupported(
                    f"server serves REST API versions {listed}; "
                    f"{'not ' + wanted if wanted else 'none of them is supported'}"
                )
            return Discovery(chosen, frozenset(served), _serves_accounting(payload, chosen))
    for version in sorted(candidates, key=version_key, reverse=True):
        template = f"/slurm/{version}/ping"
        status, payload, text = await _exchange(
            transport,
            "GET",
            base + template,
            template=template,
            headers=_headers(token, user),
            request_timeout=request_timeout,
        )
        env = parse_envelope(payload)
        error = classify(
            status,
            env.errors,
            json_body=isinstance(payload, Mapping),
            text=text,
            endpoint=template,
            method="GET",
        )
        if error is None:
            return Discovery(version, frozenset({version}), None)
        if isinstance(error, SlurmUnsupported):
            continue
        raise error
    raise SlurmUnsupported(f"slurmrestd at {base_url} serves none of {', '.join(candidates)}")


async def discover_version(
    transport: HttpTransport,
    base_url: str,
    *,
    token: TokenProvider | None = None,
    user: str | None = None,
    request_timeout: float = 30.0,
    supported: Sequence[str] = SUPPORTED_VERSIONS,
) -> str:
    """The newest REST API version in `supported` that the server serves (see `discover`)."""
    found = await discover(
        transport,
        base_url,
        token=token,
        user=user,
        request_timeout=request_timeout,
        supported=supported,
    )
    return found.version


class SlurmClient:
    """slurmrestd operations for one server and one concrete REST API version."""

    def __init__(
        self,
        transport: HttpTransport,
        base_url: str,
        version: str,
        *,
        token: TokenProvider,
        user: str | None = None,
        timeout: float = 30.0,
        on_request: OnRequest | None = None,
        accounting: bool | None = None,
    ) -> None:
        """`accounting`: whether `/slurmdb/` paths are served; None finds out on first use."""
        self._transport = transport
        self._base = base_url.rstrip("/")
        self._dialect: Dialect = dialect_for(version)
        self._token = token
        self._user = user
        self._timeout = timeout
        self._on_request = on_request
        self._accounting = accounting if self._dialect.supports_accounting else False

    @property
    def version(self) -> str:
        return self._dialect.version

    def lifecycle_ref(self, job_id: int, sluid: str | None) -> int | str:
        """The SLUID where the version takes it in paths (v0.0.45), else the numeric job id."""
        return sluid if sluid and self.dialect.supports_sluid_paths else job_id

    @property
    def dialect(self) -> Dialect:
        return self._dialect

    # -- plumbing -------------------------------------------------------------------------

    async def _call(
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
    ) -> _Answer:
        status, payload, text = await _exchange(
            self._transport,
            method,
            self._base + path,
            template=template,
            headers=_headers(self._token, self._user),
            request_timeout=self._timeout,
            params=params,
            body=body,
            submit=submit,
            on_request=self._on_request,
        )
        if status == 304 and allow_304:
            return _Answer(status=status, payload={}, envelope=Envelope())
        env = self._dialect.parse_envelope(payload)
        is_json = isinstance(payload, Mapping)
        job_id = payload.get("job_id") if is_json and submit else None
        error = classify(
            status,
            env.errors,
            json_body=is_json,
            text=text,
            submit=submit,
            endpoint=template,
            method=method,
            warnings=env.warnings,
            job_id=job_id if isinstance(job_id, int) and job_id > 0 else None,
        )
        if error is not None:
            raise error
        if not is_json:
            if allow_empty and not text.strip():
                return _Answer(status=status, payload={}, envelope=env)
            cls: type[SlurmError] = SlurmAmbiguous if submit else SlurmTransient
            raise cls(
                "slurmrestd answered without a JSON body",
                status=status,
                endpoint=template,
                method=method,
            )
        return _Answer(status=status, payload=dict(payload), envelope=env)

    def _slurm(self, rest: str) -> str:
        return f"/slurm/{self.version}{rest}"

    def _slurmdb(self, rest: str) -> str:
        return f"/slurmdb/{self.version}{rest}"

    # -- operations -----------------------------------------------------------------------

    async def ping(self) -> PingResult:
        """Check that a controller answers with this token; raises when none does."""
        template = self._slurm("/ping")
        answer = await self._call("GET", template, template)
        result = self._dialect.parse_ping(answer.payload)
        # 26.05 reports a refused token inside a 200 ping rather than as an error.
        if any("authentication" in (c.status or "").lower() for c in result.controllers):
            raise SlurmAuthError(
                "authentication refused by slurmctld",
                status=answer.status,
                endpoint=template,
                method="GET",
            )
        if not result.responding:
            raise SlurmTransient("no slurmctld is responding", endpoint=template, method="GET")
        return result

    async def submit(self, req: LaunchRequest) -> SubmitReceipt:
        """Submit once; never retried. See the module docstring for what each failure means.

        HTTP 200 with `errors[]` raises `SlurmRejected` whose `job_id` (when Slurm created a
        record anyway) should be cancelled by the caller.
        """
        template = self._slurm("/job/submit")
        body = self._dialect.submit_body(req)
        try:
            answer = await self._call("POST", template, template, body=body, submit=True)
        except SlurmAuthError as exc:
            if ZERO_BYTES not in exc.error_numbers:
                raise
            # 5005 is how 22.05 shows a refused token, but also what slurmctld closing the
            # connection after reading the request looks like. A ping with the same token
            # tells them apart; only a refused ping proves nothing was submitted.
            try:
                await self.ping()
            except SlurmAuthError:
                raise exc from None
            except SlurmError:
                pass
            raise SlurmAmbiguous(
                "slurmctld closed the connection after the submit was sent (error 5005)",
                status=exc.status,
                errors=exc.errors,
                endpoint=template,
                method="POST",
            ) from exc
        try:
            return self._dialect.parse_submit(answer.payload)
        except ValidationError as exc:
            raise SlurmAmbiguous(
                f"submit answer unreadable: {exc.errors()[0]['msg']}",
                status=answer.status,
                endpoint=template,
                method="POST",
            ) from exc

    async def get_job(self, ref: int | str) -> list[SlurmJobView]:
        """Every component of a job (all het components for a leader id).

        `ref` is a job id, "123+1", "123_4", or (v0.0.45 only) a SLUID "s…".
        """
        path_ref = self._dialect.job_ref_path(ref)
        template = self._slurm("/job/{job_id}")
        answer = await self._call("GET", template, self._slurm(f"/job/{quote(path_ref)}"))
        jobs = self._parse(self._dialect.parse_jobs, answer, template)
        if not jobs:
            raise SlurmNotFound(
                f"job {path_ref} not found", status=answer.status, endpoint=template, method="GET"
            )
        return jobs

    async def list_jobs(self, update_time: datetime | None = None) -> JobListResult:
        """All jobs the controller holds, or "not modified" since `update_time`."""
        template = self._slurm("/jobs")
        params = [("update_time", str(int(update_time.timestamp())))] if update_time else None
        answer = await self._call("GET", template, template, params=params, allow_304=True)
        if answer.status == 304:
            return JobListResult(not_modified=True)
        warnings = answer.envelope.warnings
        no_change = any(_NO_CHANGE_TEXT in (w.description or "").lower() for w in warnings)
        jobs = self._parse(self._dialect.parse_jobs, answer, template)
        if no_change and not jobs:
            return JobListResult(not_modified=True, warnings=warnings)
        return JobListResult(jobs=tuple(jobs), warnings=warnings)

    async def jobs_state(
        self, job_ids: Sequence[int] | None = None, *, batch: int = 500
    ) -> dict[int, JobStateEntry]:
        """States from `GET /jobs/state` (v0.0.40+), keyed by each component's own job id.

        `job_ids=None` sweeps every job. Ids are sent as repeated `job_id=` parameters (a
        comma list is refused), `batch` at a time. Ids Slurm no longer knows are absent from
        the result. Het components ("123+1") are keyed by leader + offset, the id Slurm gives
        consecutive components.
        """
        if not self._dialect.supports_jobs_state:
            raise SlurmUnsupported(f"/jobs/state is not served by {self.version}")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        entries: list[JobStateEntry] = []
        if job_ids is None:
            entries = await self._jobs_state_query(None)
        else:
            unique = sorted(set(job_ids))
            for start in range(0, len(unique), batch):
                entries.extend(await self._jobs_state_chunk(unique[start : start + batch]))
        result: dict[int, JobStateEntry] = {}
        for entry in entries:
            key = entry.component_job_id
            previous = result.get(key)
            # Array tasks share a key; keep the one that is still live so nothing looks done early.
            if previous is None or (previous.is_final and not entry.is_final):
                result[key] = entry
        return result

    async def _jobs_state_chunk(self, ids: Sequence[int]) -> list[JobStateEntry]:
        try:
            return await self._jobs_state_query(ids)
        except SlurmNotFound:
            # One purged id can fail the whole query: split until the unknown ids are isolated.
            if len(ids) <= 1:
                return []
            middle = len(ids) // 2
            return [
                *await self._jobs_state_chunk(ids[:middle]),
                *await self._jobs_state_chunk(ids[middle:]),
            ]

    async def _jobs_state_query(self, ids: Sequence[int] | None) -> list[JobStateEntry]:
        template = self._slurm("/jobs/state")
        params = [("job_id", str(i)) for i in ids] if ids is not None else None
        answer = await self._call("GET", template, template, params=params)
        return self._parse(self._dialect.parse_jobs_state, answer, template)

    async def find_by_name(
        self, name: str, *, lookback: timedelta = DEFAULT_LOOKBACK
    ) -> list[SlurmJobView]:
        """Jobs whose name is exactly `name`: the controller's list, plus accounting records
        from the last `lookback` when the server serves `/slurmdb/`. Merged by job id, the
        controller's view winning; sorted by job id. For reconciling a lost submit answer.
        """
        listing = await self.list_jobs()
        merged: dict[int, SlurmJobView] = {}
        for job in listing.jobs:
            if job.name == name:
                merged[job.job_id] = job
        # job_name is a CSV filter on slurmdb; a name with a comma cannot be asked for safely.
        if "," not in name:
            controller_ids = set(merged)
            since = datetime.now(tz=UTC) - lookback
            oldest = datetime.min.replace(tzinfo=UTC)
            for job in await self._accounting_jobs(
                [("job_name", name), ("start_time", str(int(since.timestamp())))]
            ):
                if job.name != name or job.job_id in controller_ids:
                    continue
                # A requeued job has one record per run: keep the newest.
                previous = merged.get(job.job_id)
                if previous is None or (job.submit_time or oldest) >= (
                    previous.submit_time or oldest
                ):
                    merged[job.job_id] = job
        return [merged[k] for k in sorted(merged)]

    async def has_accounting(self) -> bool:
        """Whether `/slurmdb/` job paths are served (probed once, then remembered)."""
        if self._accounting is None:
            await self._accounting_jobs([("job_name", "-"), ("start_time", str(int(time.time())))])
        return bool(self._accounting)

    async def _accounting_jobs(self, params: Sequence[tuple[str, str]]) -> list[SlurmJobView]:
        if self._accounting is False:
            return []
        template = self._slurmdb("/jobs")
        try:
            answer = await self._call("GET", template, template, params=params)
        except SlurmUnsupported:
            self._accounting = False
            return []
        self._accounting = True
        return self._parse(self._dialect.parse_accounting_jobs, answer, template)

    async def get_job_accounting(self, ref: int | str) -> list[SlurmJobView]:
        """Accounting records of a job (every record of a requeued job; [] when none)."""
        if self._accounting is False:
            raise SlurmUnsupported(f"accounting is not available through {self.version}")
        path_ref = self._dialect.job_ref_path(ref)
        template = self._slurmdb("/job/{job_id}")
        try:
            answer = await self._call("GET", template, self._slurmdb(f"/job/{quote(path_ref)}"))
        except SlurmUnsupported:
            self._accounting = False
            raise
        self._accounting = True
        return self._parse(self._dialect.parse_accounting_jobs, answer, template)

    async def hold(self, job_id: int, held: bool) -> tuple[SlurmMessage, ...]:
        """Hold (or release) a pending job: `POST /job/{id}` with `{"hold": ...}`.

        Job updates take the numeric id only (26.05 does not wire SLUIDs into updates).
        Returns the warnings; per-job refusals arrive as errors (raised) or, on v0.0.40+,
        as warnings in an HTTP 200, which are returned for the caller to show.
        """
        template = self._slurm("/job/{job_id}")
        answer = await self._call(
            "POST", template, self._slurm(f"/job/{job_id}"), body={"hold": held}
        )
        return answer.envelope.warnings

    async def cancel(self, ref: int | str, *, signal: str | None = None) -> CancelResult:
        """Cancel (or signal) a job. A job that already ended is a success
        (`already_done` where the version says so); an unknown job raises SlurmNotFound."""
        path_ref = self._dialect.job_ref_path(ref)
        template = self._slurm("/job/{job_id}")
        params = [("signal", signal)] if signal else None
        answer = await self._call(
            "DELETE",
            template,
            self._slurm(f"/job/{quote(path_ref)}"),
            params=params,
            allow_empty=True,
        )
        try:
            return self._dialect.parse_cancel(answer.payload, path_ref)
        except SlurmError as exc:
            exc.endpoint, exc.method = template, "DELETE"
            raise

    async def list_partitions(self) -> list[str]:
        """Names of the partitions the controller knows."""
        template = self._slurm("/partitions")
        answer = await self._call("GET", template, template)
        return parse_partition_names(answer.payload)

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node with its features and state (for site checks, not for polling)."""
        template = self._slurm("/nodes")
        answer = await self._call("GET", template, template)
        return parse_nodes(answer.payload)

    @staticmethod
    def _parse(
        parser: Callable[[Mapping[str, Any]], list[_T]], answer: _Answer, template: str
    ) -> list[_T]:
        try:
            return parser(answer.payload)
        except ValidationError as exc:
            raise SlurmError(
                f"unexpected answer shape: {exc.errors()[0]['msg']}",
                status=answer.status,
                endpoint=template,
            ) from exc
