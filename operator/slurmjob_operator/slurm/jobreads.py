"""Reading jobs: one job (slurmctld's or accounting's), the sweeps the poller makes (`list_jobs`,
`jobs_state`) and the search by name adoption makes. An unreadable record of a sweep is left out
with a warning; of a one-job answer, it makes the answer `SlurmMalformed`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from slurmjob_operator.core.jobview import JobStateEntry, SlurmJobView, valid_job_id
from slurmjob_operator.slurm.errors import (
    SlurmNotFound,
    SlurmUnsupported,
)
from slurmjob_operator.slurm.joblists import (
    JobListResult,
    live_per_component,
    merge_named,
    query_known,
    usable,
)
from slurmjob_operator.slurm.session import Session

#: How far back adoption searches accounting for a job by name.
DEFAULT_LOOKBACK = timedelta(days=7)
# slurmrestd's warning when a listing since a time found nothing new.
NO_CHANGE_TEXT = "no job changes"


class JobReads(Session):
    """Reads of jobs; none changes anything."""

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
        no_change = any(NO_CHANGE_TEXT in (w.description or "").lower() for w in warnings)
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
