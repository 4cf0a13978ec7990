"""A followed job waiting in Slurm on its upstreams' jobs (spec.dependsOn): repointed when an
upstream was retried (its new job replaces the old one in the Slurm dependency), cancelled when
one ended failed for good (`core.dependencies.repoint`). Only through a handle its identity
check made."""

from __future__ import annotations

import contextlib
import logging

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.controller.dependencies import Dependencies
from slurmjob_operator.controller.identity import JobIdentity
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.decisions import awaits_upstream
from slurmjob_operator.core.dependencies import Action, repoint, slurm_dependency
from slurmjob_operator.core.following import dependency_failed, dependency_repointed
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)


class Repointing:
    def __init__(
        self,
        dependencies: Dependencies | None,
        edge: ResourceEdge,
        identity: JobIdentity,
        backoff: float,
    ) -> None:
        self.dependencies = dependencies
        self.edge = edge
        self.identity = identity
        self._backoff = backoff

    async def follow(self, view: ResourceView) -> None:
        """A job waiting in Slurm on its upstreams' jobs: repoint it when one was retried,
        cancel it when one ended failed for good (`core.dependencies.repoint`)."""
        attempt = view.status.current_attempt
        if self.dependencies is None or attempt is None or attempt.job_id is None:
            return
        if not awaits_upstream(view.status) or not attempt.dependencies:
            return
        names = tuple(d.name for d in attempt.dependencies)
        upstreams = await self.dependencies.current(view, names)
        plan = repoint(attempt.dependencies, upstreams)
        if plan.action is Action.NOTHING:
            return
        update = plan.action is Action.UPDATE
        try:
            try:
                job = await self.identity.read(
                    view, attempt, "its dependency is not changed" if update else "not cancelled"
                )
            except SlurmNotFound:
                if update:
                    return  # gone: nothing queued to repoint (the fold says how it ended)
            else:
                if job is None:
                    return  # not the attempt's job: left alone, and nothing written
                acting = await self.identity.acting(job)
                if update:
                    if not await self.identity.upstream_jobs(view, plan.records):
                        return  # an upstream's id not proven its job: asked again next time
                    dependency = slurm_dependency(plan.records) or ""
                    for warning in await acting.set_dependency(job, dependency):
                        log.warning("repointing Slurm job %s: %s", job.job_id, warning)
                else:
                    # Written Failed only once Slurm no longer has it queued: a cancel that
                    # did not go through is tried again, never left behind a final status.
                    with contextlib.suppress(SlurmNotFound):
                        await acting.cancel(job)
        except SlurmError as exc:
            raise RetryLater(f"dependencies of job {attempt.job_id}: {exc}", self._backoff) from exc
        now = utc_now()
        if plan.action is Action.UPDATE:
            await self.edge.apply(
                view, dependency_repointed(view.status, plan.records, plan.message)
            )
        else:
            await self.edge.apply(
                view, dependency_failed(view.status, plan.message, view.generation, now)
            )
