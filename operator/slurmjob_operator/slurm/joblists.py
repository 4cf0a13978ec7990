"""Lists of jobs as the client reads them: ids queried in batches with the unknown ones
isolated, one `/jobs/state` entry per component, controller views and accounting records merged
by name, and a sweep's unreadable records left out with a warning."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from slurmjob_operator.core.jobview import JobStateEntry, SlurmJobView
from slurmjob_operator.slurm.dialects import Records
from slurmjob_operator.slurm.errors import SlurmMessage, SlurmNotFound

log = logging.getLogger(__name__)
_T = TypeVar("_T")


def usable(records: Records[_T], template: str) -> list[_T]:
    """A sweep's readable records; the others are left out with a warning."""
    if records.skipped:
        log.warning(
            "%s: %d unreadable record(s) left out: %s",
            template,
            len(records.skipped),
            "; ".join(records.skipped[:3]),
        )
    return list(records)


async def query_known(
    query: Callable[[Sequence[int]], Awaitable[list[_T]]], ids: Sequence[int], batch: int
) -> list[_T]:
    """`query` over `ids`, `batch` at a time, leaving out the ids Slurm no longer knows."""
    found: list[_T] = []
    for start in range(0, len(ids), batch):
        found.extend(await skipping_unknown(query, ids[start : start + batch]))
    return found


async def skipping_unknown(
    query: Callable[[Sequence[int]], Awaitable[list[_T]]], ids: Sequence[int]
) -> list[_T]:
    """`query(ids)`, leaving out the ids Slurm no longer knows."""
    try:
        return await query(ids)
    except SlurmNotFound:
        # One purged id can fail the whole query: split until the unknown ids are isolated.
        if len(ids) <= 1:
            return []
        middle = len(ids) // 2
        return [
            *await skipping_unknown(query, ids[:middle]),
            *await skipping_unknown(query, ids[middle:]),
        ]


def live_per_component(entries: Iterable[JobStateEntry]) -> list[JobStateEntry]:
    """One entry per het component and per array task (Slurm may list one twice while it
    moves), the live one kept so that nothing looks done early."""
    result: dict[tuple[int, str | None], JobStateEntry] = {}
    for entry in entries:
        key = (entry.component_job_id, entry.array_task)
        previous = result.get(key)
        if previous is None or (previous.is_final and not entry.is_final):
            result[key] = entry
    return list(result.values())


def merge_named(
    name: str, controller: Iterable[SlurmJobView], accounted: Iterable[SlurmJobView]
) -> list[SlurmJobView]:
    """Jobs named `name` by job id: the controller's view, else the newest accounting record."""
    merged = {job.job_id: job for job in controller if job.name == name}
    controller_ids = set(merged)
    oldest = datetime.min.replace(tzinfo=UTC)
    for job in accounted:
        if job.name != name or job.job_id in controller_ids:
            continue
        # A requeued job has one record per run: keep the newest.
        previous = merged.get(job.job_id)
        if previous is None or (job.submit_time or oldest) >= (previous.submit_time or oldest):
            merged[job.job_id] = job
    return [merged[k] for k in sorted(merged)]


class JobListResult(BaseModel):
    """`GET /jobs`. When `not_modified` is True `jobs` is empty and means nothing: the
    controller had no change since `update_time` (v0.0.38: HTTP 304; v0.0.40+: a warning)."""

    model_config = ConfigDict(frozen=True)

    jobs: tuple[SlurmJobView, ...] = ()
    not_modified: bool = False
    warnings: tuple[SlurmMessage, ...] = ()
