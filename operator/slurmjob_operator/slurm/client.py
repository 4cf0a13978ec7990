"""`SlurmClient`: every slurmrestd operation the operator makes, over one shared `HttpTransport`.

Nothing here retries. Failures are raised as the `slurm.errors` taxonomy so the caller can
decide: `SlurmTransient` means nothing was done, `SlurmAmbiguous` (submit only) means a job
may exist and must be looked for (`find_by_name`) before submitting again.

The transport is the caller's (`slurm.http`: one connection per request, and tolerant of the
malformed responses some slurmrestd releases write). Choosing the version to speak is
`slurm.discovery`; one request and its answer is `slurm.exchange`.

Every answer is untrusted. One that cannot be read raises `SlurmMalformed` (a submit's:
`SlurmAmbiguous`, since the job may exist); ids outside Slurm's range are refused as
`InvalidJobRef` before anything is sent. A record of a list that cannot be read is left out
with a warning where the list is a sweep (`list_jobs`, `jobs_state`, the accounting search of
`find_by_name`): the other jobs go on. Where the answer is one job (`get_job`,
`get_job_accounting`) an unreadable record makes the answer `SlurmMalformed`: leaving out a
component or a run would misstate the job, and an empty answer would read as "gone".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from slurmjob_operator.core.jobview import JobStateEntry, SlurmJobView, valid_job_id
from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.core.verified import VerifiedJob
from slurmjob_operator.slurm.auth import TokenError, TokenProvider, decode_claims
from slurmjob_operator.slurm.dialects import (
    BulkCancelResult,
    CancelResult,
    Dialect,
    PingResult,
    SubmitReceipt,
    dialect_for,
)
from slurmjob_operator.slurm.errors import (
    ZERO_BYTES,
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmError,
    SlurmMalformed,
    SlurmMessage,
    SlurmNotFound,
    SlurmTransient,
    SlurmUnsupported,
)
from slurmjob_operator.slurm.exchange import OnRequest, Requester
from slurmjob_operator.slurm.http import HttpTransport
from slurmjob_operator.slurm.joblists import (
    JobListResult,
    live_per_component,
    merge_named,
    query_known,
    usable,
)
from slurmjob_operator.slurm.nodes import (
    ConfFacts,
    NodeInfo,
    PartitionInfo,
    parse_conf,
    parse_dbd_queue,
    parse_names,
    parse_nodes,
    parse_partitions,
)
from slurmjob_operator.slurm.routes import Routes

DEFAULT_LOOKBACK = timedelta(days=7)
_NO_CHANGE_TEXT = "no job changes"


def _checked_ping(result: PingResult, status: int, template: str) -> PingResult:
    """`result`, unless it shows the token refused or no controller answering."""
    # 26.05 reports a refused token inside a 200 ping rather than as an error.
    if any("authentication" in (c.status or "").lower() for c in result.controllers):
        raise SlurmAuthError(
            "authentication refused by slurmctld",
            status=status,
            endpoint=template,
            method="GET",
        )
    if not result.responding:
        raise SlurmTransient("no slurmctld is responding", endpoint=template, method="GET")
    return result


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
        self._dialect: Dialect = dialect_for(version)
        self._rest = Requester(
            transport,
            base_url,
            self._dialect,
            token=token,
            user=user,
            timeout=timeout,
            on_request=on_request,
        )
        self._accounting = accounting if self._dialect.supports_accounting else False
        self._user = user
        self._token = token
        self._routes = Routes(self._rest, self._dialect.version, lambda: self.user)

    @property
    def version(self) -> str:
        return self._dialect.version

    def lifecycle_ref(self, job_id: int, sluid: str | None) -> int | str:
        """The SLUID where the version takes it in paths (v0.0.45), else the numeric job id."""
        return sluid if sluid and self.dialect.supports_sluid_paths else job_id

    @property
    def dialect(self) -> Dialect:
        return self._dialect

    @property
    def user(self) -> str | None:
        """The Slurm user this client acts as: the one it names, else its token's (`sun`);
        None when neither can be told."""
        if self._user:
            return self._user
        try:
            claims = decode_claims(self._token.token())
        except TokenError:
            return None
        sun = claims.get("sun") if claims else None
        return sun if isinstance(sun, str) and sun else None

    @property
    def accounting(self) -> bool | None:
        """Whether `/slurmdb/` paths are served, as far as known (None: not asked yet)."""
        return self._accounting

    # -- operations -----------------------------------------------------------------------

    async def ping(self) -> PingResult:
        """Check that a controller answers with this token; raises when none does."""
        template = self._routes.template("ping")
        answer = await self._routes.send("ping")
        result = answer.parse(self._dialect.parse_ping, template)
        return _checked_ping(result, answer.status, template)

    async def submit(self, req: LaunchRequest) -> SubmitReceipt:
        """Submit once; never retried. See the module docstring for what each failure means.

        HTTP 200 with `errors[]` raises `SlurmRejected` whose `job_id` (when Slurm created a
        record anyway) should be cancelled by the caller.
        """
        template = self._routes.template("submit")
        body = self._dialect.submit_body(req)
        try:
            answer = await self._routes.send("submit", body=body, submit=True)
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
            return answer.parse(self._dialect.parse_submit, template, "POST")
        except SlurmMalformed as exc:
            # Slurm said yes, but not to which job id (none, 0, -7, beyond uint32): a job may
            # exist, and only its unique name can find it.
            raise SlurmAmbiguous(
                f"submit answer unreadable: {exc.reason}",
                status=answer.status,
                endpoint=template,
                method="POST",
            ) from exc

    async def get_job(self, ref: int | str) -> list[SlurmJobView]:
        """Every component of a job (all het components for a leader id).

        `ref` is a job id, "123+1", "123_4", or (v0.0.45 only) a SLUID "s…".
        """
        path_ref = self._dialect.job_ref_path(ref)
        template = self._routes.template("get_job")
        answer = await self._routes.send("get_job", ref=path_ref)
        jobs = answer.parse(lambda p: self._dialect.parse_jobs(p).complete(), template)
        if not jobs:
            raise SlurmNotFound(
                f"job {path_ref} not found", status=answer.status, endpoint=template, method="GET"
            )
        return jobs

    async def list_jobs(self, update_time: datetime | None = None) -> JobListResult:
        """All jobs the controller holds, or "not modified" since `update_time`."""
        template = self._routes.template("list_jobs")
        params = [("update_time", str(int(update_time.timestamp())))] if update_time else None
        answer = await self._routes.send("list_jobs", params=params, allow_304=True)
        if answer.status == 304:
            return JobListResult(not_modified=True)
        warnings = answer.envelope.warnings
        no_change = any(_NO_CHANGE_TEXT in (w.description or "").lower() for w in warnings)
        jobs = usable(answer.parse(self._dialect.parse_jobs, template), template)
        if no_change and not jobs:
            return JobListResult(not_modified=True, warnings=warnings)
        return JobListResult(jobs=tuple(jobs), warnings=warnings)

    async def jobs_state(
        self, job_ids: Sequence[int] | None = None, *, batch: int = 500
    ) -> list[JobStateEntry]:
        """States from `GET /jobs/state` (v0.0.40+), one entry per het component and per
        array task.

        `job_ids=None` sweeps every job. Ids are sent as repeated `job_id=` parameters (a
        comma list is refused), `batch` at a time. Ids Slurm no longer knows are absent from
        the result, and so are ids no Slurm job can have (they are not sent). An array's id
        answers every task of the array: the pending ones as "<array id>_<index>", each
        started one under its own job id ("<task's job id>_<index>").
        """
        if not self._dialect.supports_jobs_state:
            raise SlurmUnsupported(f"/jobs/state is not served by {self.version}")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        if job_ids is None:
            entries = await self._jobs_state_query(None)
        else:
            # One out-of-range id (a status's jobId is only a claim) must not fail the batch.
            wanted = {i for i in job_ids if valid_job_id(i) is not None}
            entries = await query_known(self._jobs_state_query, sorted(wanted), batch)
        return live_per_component(entries)

    async def _jobs_state_query(self, ids: Sequence[int] | None) -> list[JobStateEntry]:
        template = self._routes.template("jobs_state")
        params = [("job_id", str(i)) for i in ids] if ids is not None else None
        answer = await self._routes.send("jobs_state", params=params)
        return usable(answer.parse(self._dialect.parse_jobs_state, template), template)

    async def find_by_name(
        self, name: str, *, lookback: timedelta = DEFAULT_LOOKBACK
    ) -> list[SlurmJobView]:
        """Jobs whose name is exactly `name`: the controller's list, plus accounting records
        from the last `lookback` when the server serves `/slurmdb/`. Merged by job id, the
        controller's view winning; sorted by job id. For reconciling a lost submit answer.
        """
        listing = await self.list_jobs()
        accounted: list[SlurmJobView] = []
        # job_name is a CSV filter on slurmdb; a name with a comma cannot be asked for safely.
        if "," not in name:
            since = datetime.now(tz=UTC) - lookback
            accounted = await self._accounting_jobs(
                [("job_name", name), ("start_time", str(int(since.timestamp())))]
            )
        return merge_named(name, listing.jobs, accounted)

    async def has_accounting(self) -> bool:
        """Whether `/slurmdb/` job paths are served (probed once, then remembered)."""
        if self._accounting is None:
            await self._accounting_jobs([("job_name", "-"), ("start_time", str(int(time.time())))])
        return bool(self._accounting)

    async def _accounting_jobs(self, params: Sequence[tuple[str, str]]) -> list[SlurmJobView]:
        if self._accounting is False:
            return []
        template = self._routes.template("accounting_jobs")
        try:
            answer = await self._routes.send("accounting_jobs", params=params)
        except SlurmUnsupported:
            self._accounting = False
            return []
        self._accounting = True
        return usable(answer.parse(self._dialect.parse_accounting_jobs, template), template)

    async def get_job_accounting(self, ref: int | str) -> list[SlurmJobView]:
        """Accounting records of a job (every record of a requeued job; [] when none)."""
        if self._accounting is False:
            raise SlurmUnsupported(f"accounting is not available through {self.version}")
        path_ref = self._dialect.job_ref_path(ref)
        template = self._routes.template("get_job_accounting")
        try:
            answer = await self._routes.send("get_job_accounting", ref=path_ref)
        except SlurmUnsupported:
            self._accounting = False
            raise
        self._accounting = True
        return answer.parse(lambda p: self._dialect.parse_accounting_jobs(p).complete(), template)

    async def hold(self, job: VerifiedJob, held: bool) -> tuple[SlurmMessage, ...]:
        """Hold (or release) a pending job: `POST /job/{id}` with `{"hold": ...}` for every
        heterogeneous component by its own id, the leader's last (slurmrestd holds only the
        leader's component when given the leader's id, and the others, still eligible, would
        keep their reservation of nodes in the backfill plan).

        Job updates take the numeric id only (26.05 does not wire SLUIDs into updates).
        Returns the warnings; per-job refusals arrive as errors (raised) or, on v0.0.40+,
        as warnings in an HTTP 200, which are returned for the caller to show.
        """
        self._routes.vouch("hold", (job,))
        warnings: list[SlurmMessage] = []
        for component in job.components:
            answer = await self._routes.send(
                "hold",
                ref=self._dialect.job_ref_path(component),
                changes=(job,),
                body={"hold": held},
            )
            warnings.extend(answer.envelope.warnings)
        return tuple(warnings)

    async def set_dependency(self, job: VerifiedJob, dependency: str) -> tuple[SlurmMessage, ...]:
        """Replace a pending job's dependency (`POST /job/{id}` with `{"dependency": ...}`;
        an empty string clears it). Returns the warnings, as `hold` does."""
        self._routes.vouch("set_dependency", (job,))
        answer = await self._routes.send(
            "set_dependency",
            ref=self._dialect.job_ref_path(job.job_id),
            changes=(job,),
            body={"dependency": dependency},
        )
        return answer.envelope.warnings

    async def cancel(self, job: VerifiedJob, *, signal: str | None = None) -> CancelResult:
        """Cancel (or signal) a job by its id, read and verified in this step. A job that
        already ended is a success (`already_done` where the version says so); an unknown job
        raises SlurmNotFound."""
        self._routes.vouch("cancel", (job,))
        path_ref = self._dialect.job_ref_path(job.job_id)
        template = self._routes.template("cancel")
        params = [("signal", signal)] if signal else None
        answer = await self._routes.send(
            "cancel", ref=path_ref, changes=(job,), params=params, allow_empty=True
        )
        try:
            return answer.parse(
                lambda p: self._dialect.parse_cancel(p, path_ref), template, "DELETE"
            )
        except SlurmError as exc:
            exc.endpoint, exc.method = template, "DELETE"
            raise

    def bulk_ref(self, job: VerifiedJob) -> str:
        """How `cancel_many` sends `job` (and keys its outcome in the result)."""
        return self._dialect.job_ref_path(self.lifecycle_ref(job.job_id, job.sluid))

    async def cancel_many(self, jobs: Sequence[VerifiedJob]) -> BulkCancelResult:
        """Cancel several jobs with one `DELETE /jobs` (v0.0.40+); what happened to each is
        in the result, keyed by `bulk_ref`. Raises `SlurmUnsupported` where the version
        (or this v0.0.40's release) has no bulk cancel: cancel one by one then."""
        if not self._dialect.supports_bulk_cancel:
            raise SlurmUnsupported(f"bulk cancel is not served by {self.version}")
        self._routes.vouch("cancel_many", jobs)
        sent = [self.bulk_ref(job) for job in jobs]
        template = self._routes.template("cancel_many")
        answer = await self._routes.send(
            "cancel_many", changes=jobs, body=self._dialect.kill_jobs_body(sent)
        )
        return answer.parse(lambda p: self._dialect.parse_kill_jobs(p, sent), template, "DELETE")

    async def dbd_queue(self) -> int | None:
        """Job records slurmctld has yet to send to slurmdbd (`GET /diag`); None when the
        answer does not say."""
        template = self._routes.template("diag")
        answer = await self._routes.send("diag")
        return answer.parse(parse_dbd_queue, template)

    async def list_partitions(self) -> list[str]:
        """Names of the partitions the controller knows (those the submit checks see)."""
        return [p.name for p in await self.partitions()]

    async def partitions(self) -> list[PartitionInfo]:
        """Every partition with its state and limits, hidden ones included (`flags=ALL`,
        v0.0.40+; v0.0.38 shows those the operator's user may see)."""
        template = self._routes.template("partitions")
        params = None if self.version == "v0.0.38" else [("flags", "ALL")]
        answer = await self._routes.send("partitions", params=params)
        return answer.parse(parse_partitions, template)

    async def conf(self) -> ConfFacts | None:
        """What slurmctld's configuration says that submissions depend on (`GET /conf`,
        served from v0.0.45); None where this version does not serve it."""
        if self.version != "v0.0.45":
            return None
        template = self._routes.template("conf")
        answer = await self._routes.send("conf")
        return answer.parse(parse_conf, template)

    async def account_names(self) -> frozenset[str]:
        """The accounts slurmdbd knows (lower-cased); needs accounting."""
        template = self._routes.template("accounts")
        answer = await self._routes.send("accounts")
        return answer.parse(parse_names("accounts"), template)

    async def qos_names(self) -> frozenset[str]:
        """The QOS slurmdbd knows (lower-cased); needs accounting."""
        template = self._routes.template("qos")
        answer = await self._routes.send("qos")
        return answer.parse(parse_names("qos"), template)

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node with its features and state (for site checks, not for polling)."""
        template = self._routes.template("nodes")
        answer = await self._routes.send("nodes")
        return answer.parse(parse_nodes, template)
