"""Changing jobs: the submit, and every change of an existing job, which takes a `VerifiedJob`
(minted only by core.verified from a read in the same step): hold, release, dependency, cancel."""

from __future__ import annotations

from collections.abc import Sequence

from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.core.verified import VerifiedJob
from slurmjob_operator.slurm.dialects import (
    BulkCancelResult,
    CancelResult,
    SubmitReceipt,
)
from slurmjob_operator.slurm.errors import (
    ZERO_BYTES,
    SlurmAmbiguous,
    SlurmAuthError,
    SlurmError,
    SlurmMalformed,
    SlurmMessage,
    SlurmUnsupported,
)
from slurmjob_operator.slurm.session import Session


class JobChanges(Session):
    """The mutating operations (routes.MUTATING)."""

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
