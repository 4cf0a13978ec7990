"""One cheap sweep of slurmrestd per poll interval for every tracked job.

v0.0.40+: `GET /jobs/state` for the tracked ids (batched; unfiltered, one request, once that
is cheaper: `core.sweep`), then `GET /job/{id}` only for the jobs whose state changed since
the last sweep. v0.0.38 has no `/jobs/state`: `GET /jobs` with
`update_time` answers 304 when nothing changed, the whole list otherwise (which then carries
every detail, so no per-job GET is needed). Either way an unchanged job costs no request of
its own: the sweep is one request per 500 tracked ids, or a single unfiltered one. Log
tails are re-read with every state change, and between changes only for running jobs whose log
files changed, at most every `SLURMJOB_LOG_REFRESH` seconds. After a restart the states and
tails the statuses recorded stand in for the last sweep. Refreshes run concurrently, at most
`SLURMJOB_REFRESH_CONCURRENCY` at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from slurmjob_operator.controller.controller import Controller
from slurmjob_operator.controller.registry import Tracked
from slurmjob_operator.controller.resource import ResourceGone
from slurmjob_operator.controller.statesweep import StateSweep
from slurmjob_operator.core.jobview import SlurmJobView, by_leader
from slurmjob_operator.core.naming import log_files
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.statekeys import StateKey, array_key, state_key
from slurmjob_operator.slurm.auth import TokenError
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmAuthError, SlurmError, SlurmNotFound
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.logs import tail_signatures
from slurmjob_operator.storage.nofollow import job_owner

log = logging.getLogger(__name__)


class _Skip:
    """A job whose details could not be read this cycle."""


SKIP = _Skip()


class Poller:
    def __init__(
        self,
        controller: Controller,
        *,
        phase_counts: Callable[[], Mapping[str, int]] | None = None,
        primary: bool = True,
    ) -> None:
        """One per cluster. `phase_counts`: the jobs by phase across every cluster (the gauge
        is the process's); only the `primary` one (the default cluster's) sets the
        process-wide gauges."""
        self.controller = controller
        self._phase_counts = phase_counts or controller.phase_counts
        self._primary = primary
        several = len(controller.clusters.names) > 1
        self._what = f"slurmrestd of cluster {controller.name}" if several else "slurmrestd"
        self._seen: dict[int, StateKey] = {}
        self._logs: dict[str, tuple[object, object]] = {}  # by resource uid
        self._logs_read: dict[str, float] = {}  # uid -> monotonic time of its last tail read
        self._list_since: datetime | None = None
        self._next_since: datetime | None = None
        self._states = StateSweep()  # v0.0.40+: the /jobs/state sweep, array tasks' ids
        self._keys: dict[int, StateKey] = {}  # this cycle's keys of the arrays read again

    async def run(self) -> None:
        interval = self.controller.settings.poll_interval
        while True:
            started = time.monotonic()
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop outlives any one bad cycle
                log.exception("poll cycle failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def cycle(self) -> None:
        controller = self.controller
        metrics = controller.metrics
        cluster = controller.name
        with metrics.cycle(cluster):
            try:
                metrics.set_token_expiry(controller.token.expires_at, cluster=cluster)
            except TokenError:  # reported below, when slurmrestd is asked
                metrics.set_token_expiry(None, cluster=cluster)
            if self._primary:
                metrics.set_jobs_by_phase(self._phase_counts())
            # By job id, and a list: two resources may claim one job id (a status is only a
            # claim); each is refreshed, and the identity check decides which one it is.
            tracked: dict[int, list[Tracked]] = defaultdict(list)
            for item in controller.followed():
                tracked[item.job_id].append(item)
            self._forget_untracked(tracked)
            if not tracked:
                return
            self._remember(tracked)
            try:
                client = await controller.slurm()
                changed = await self._changed(client, tracked)
            except (SlurmError, TokenError) as exc:
                log.warning("poll: %s: %s", self._what, exc)
                auth = isinstance(exc, SlurmAuthError | TokenError)
                metrics.set_reachable(cluster, False)
                await controller.report_reachability(
                    False,
                    Reason.SLURM_AUTH_FAILED if auth else Reason.SLURM_UNAVAILABLE,
                    f"{self._what} {'refused the credentials' if auth else 'failed'}: {exc}",
                )
                return
            metrics.set_reachable(cluster, True)
            await controller.report_reachability(
                True, Reason.SLURM_ANSWERING, f"{self._what} answers"
            )
            limit = asyncio.Semaphore(controller.settings.refresh_concurrency)

            async def bounded(
                item: Tracked, views: Sequence[SlurmJobView] | None, logs_only: bool = False
            ) -> bool:
                async with limit:
                    return await self._refresh(item, views, logs_only=logs_only)

            done = await asyncio.gather(
                *(
                    bounded(item, views)
                    for job_id, views in changed.items()
                    for item in tracked[job_id]
                )
            )
            if all(done) and self._next_since is not None:
                self._list_since = self._next_since
            now = time.monotonic()
            await asyncio.gather(
                *(
                    bounded(item, None, logs_only=True)
                    for job_id, items in tracked.items()
                    if job_id not in changed
                    for item in items
                    if self._logs_due(item, now) and self._logs_changed(item)
                )
            )

    def _forget_untracked(self, tracked: dict[int, list[Tracked]]) -> None:
        self._keys.clear()
        for job_id in list(self._seen):
            if job_id not in tracked:
                self._seen.pop(job_id, None)
        self._states.forget(tracked)
        uids = {item.ref.uid for items in tracked.values() for item in items}
        for uid in list(self._logs):
            if uid not in uids:
                self._logs.pop(uid, None)
                self._logs_read.pop(uid, None)

    def _remember(self, tracked: dict[int, list[Tracked]]) -> None:
        """Jobs seen for the first time (a restart, or a new submission): take Slurm's state
        and the log tails as the status recorded them, so only what moved since costs a
        request and a write. A wrong guess costs one detail read, never a missed change: the
        sweep's state is compared with it."""
        for job_id, items in tracked.items():
            # An array's recorded state is one task's: its sweep entries are read again once.
            if (
                job_id not in self._seen
                and len(items) == 1
                and items[0].native
                and not items[0].array
            ):
                self._seen[job_id] = (items[0].native,)
            for item in items:
                if item.running and item.ref.uid not in self._logs:
                    self._logs[item.ref.uid] = self._signature(item)

    async def _changed(
        self, client: SlurmClient, tracked: dict[int, list[Tracked]]
    ) -> dict[int, list[SlurmJobView] | None]:
        """Job id -> fresh views (None: gone from the controller) for jobs whose state moved."""
        out: dict[int, list[SlurmJobView] | None] = {}
        if client.dialect.supports_jobs_state:
            groups, strays = await self._states.sweep(client, tracked)
            for job_id, items in tracked.items():
                group = groups.get(job_id)
                array = any(item.array for item in items)
                key = array_key(group or ()) if array else state_key(group or ())
                if group is None or self._seen.get(job_id) != key:
                    details = await self._details(client, items[0])
                    if not isinstance(details, _Skip):
                        out[job_id] = details
                        if array and details:
                            self._keys[job_id] = self._states.learn(job_id, details, group, strays)
            return out
        # Moved forward only once the listing and every refresh went through (see cycle), so
        # a change inside a failed cycle's window is not lost behind a 304.
        self._next_since = datetime.now(tz=UTC) - timedelta(seconds=1)
        listing = await client.list_jobs(update_time=self._list_since)
        if listing.not_modified:
            return out
        groups_v = by_leader(listing.jobs)
        for job_id, items in tracked.items():
            views = groups_v.get(job_id)
            if views is None:
                details = await self._details(client, items[0])
                if not isinstance(details, _Skip):
                    out[job_id] = details
            else:
                array = any(item.array for item in items)
                key = array_key(views) if array else state_key(views)
                if self._seen.get(job_id) != key:
                    out[job_id] = views
                    if array:
                        self._keys[job_id] = key
        return out

    async def _details(
        self, client: SlurmClient, item: Tracked
    ) -> list[SlurmJobView] | _Skip | None:
        """The job's views, None when Slurm no longer knows it, or SKIP when this one job's
        answer failed (it is asked again next cycle; the other jobs go on)."""
        try:
            return await client.get_job(client.lifecycle_ref(item.job_id, item.sluid))
        except SlurmNotFound:
            return None
        except SlurmAuthError:
            raise
        except SlurmError as exc:
            log.warning("poll: job %s: %s", item.job_id, exc)
            return SKIP

    async def _refresh(
        self,
        item: Tracked,
        views: Sequence[SlurmJobView] | None,
        *,
        logs_only: bool = False,
    ) -> bool:
        # Signed before the read: a line written while the tails are read (or between the
        # read and the signing) must show as a change at the next look, not as already read.
        signature = self._signature(item)
        try:
            await self.controller.refresh(item, views, logs_only=logs_only)
        except ResourceGone:  # deleted meanwhile: its watch event forgets it
            log.debug("%s/%s is gone", item.ref.namespace, item.ref.name)
            return True
        except Exception:
            log.exception("cannot refresh %s/%s", item.ref.namespace, item.ref.name)
            return False
        if views is not None and not logs_only:
            key = self._keys.get(item.job_id)
            self._seen[item.job_id] = key if key is not None else state_key(views)
        self._logs[item.ref.uid] = signature
        self._logs_read[item.ref.uid] = time.monotonic()
        return True

    def _signature(self, item: Tracked) -> tuple[object, object]:
        """The log files' signatures, by the same no-link walk the read takes, in the
        directory derived from the resource (never the status's); it never raises."""
        if not item.staging_dir or item.attempt is None:
            return (None, None)
        settings = self.controller.settings
        root = settings.storage_root
        base = attempt_dir(root, item.ref, item.attempt, item.staging_dir)
        try:
            names = log_files(item.log_index)
        except ValueError:  # a task index no file can have (a status written by others)
            return (None, None)
        out, err = tail_signatures(root, base, names, job_owner(settings))
        return (out, err)

    def _logs_due(self, item: Tracked, now: float) -> bool:
        """Between state changes, a job's log files are looked at only while it runs, and its
        tails re-read at most every `log_refresh` seconds."""
        if not item.running:
            return False
        last = self._logs_read.get(item.ref.uid)
        return last is None or now - last >= self.controller.settings.log_refresh

    def _logs_changed(self, item: Tracked) -> bool:
        return self._logs.get(item.ref.uid) != self._signature(item)
