"""Following a submitted job: folding what Slurm says (or that it forgot the job), the log
tails and, for a failed attempt, the retry rules into the status; scheduling the retry;
telling every followed job whether slurmrestd answers."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.status import Attempt, Logs, Phase, SlurmJobStatus
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.identity import JobIdentity, refuse_stranger
from slurmjob_operator.controller.registry import Tracked
from slurmjob_operator.controller.resource import ResourceEdge, ResourceGone, RetryLater
from slurmjob_operator.core.absence import Window, late_candidates, late_jobs
from slurmjob_operator.core.arrays import (
    ArrayObservation,
    array_total,
    observe_array,
    shown_index,
)
from slurmjob_operator.core.decisions import (
    belongs,
    stranger,
)
from slurmjob_operator.core.following import (
    OutputTarget,
    lacks_output,
    lost,
    not_retried,
    observed,
    observed_array,
    output_unwritable,
    reachability,
    retry_scheduled,
    with_logs,
)
from slurmjob_operator.core.jobview import JobSource, SlurmJobView, by_leader, leader
from slurmjob_operator.core.naming import log_files
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.retries import decide
from slurmjob_operator.core.states import Observation, observe
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound, SlurmUnsupported
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.logs import READ_TIMEOUT, attempt_dir_owner, read_attempt_logs
from slurmjob_operator.storage.nofollow import job_owner
from slurmjob_operator.storage.staging import remove_secrets
from slurmjob_operator.times import parse_rfc3339, utc_now

log = logging.getLogger(__name__)

#: The Event of a late job of an attempt proven absent, cancelled (`core.absence`).
LATE_SUBMIT_CANCELLED = "LateSubmitCancelled"


class Following:
    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        slurm: Callable[[], Awaitable[SlurmClient]],
        reconcile: Callable[[ObjectRef], Awaitable[None]],
        backoff: float,
        *,
        job_uid: Callable[[str], int | None] = lambda namespace: None,
        identity: JobIdentity,
        on_late: Callable[[], None] = lambda: None,
    ) -> None:
        """`job_uid(namespace)`: the uid that namespace's logs belong to when it is not the
        settings' job user (a tenant's own uid); `identity`: what makes a late job's handle
        before it is cancelled; `on_late`: counts a late submit cancelled."""
        self.settings = settings
        self.identity = identity
        self._on_late = on_late
        self._window = Window(
            settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
        )
        self._job_uid = job_uid
        self.edge = edge
        self.slurm = slurm
        self._reconcile = reconcile
        self._backoff = backoff
        self._background: set[asyncio.Task[None]] = set()
        self._reachable: bool | None = None

    async def refresh(
        self, tracked: Tracked, views: Sequence[SlurmJobView] | None, *, logs_only: bool = False
    ) -> None:
        """Fold a changed Slurm state (None: the job is gone from the controller) and the log
        tails into the resource's status; `logs_only` when only the log files moved."""
        ref = tracked.ref
        async with self.edge.step(ref.uid):
            view = await self.edge.fresh(ref)
            if view is not None:
                status = view.status
                attempt = status.current_attempt
                moved_on = status.next_attempt_at is not None or (
                    status.phase is not None and status.phase.is_terminal
                )
                if attempt is None or attempt.job_id != tracked.job_id or moved_on:
                    self.edge.observe(ref, status)
                else:
                    await self.fold(view, status, views, logs_only=logs_only)
        if view is None:
            self.edge.forget(ref)

    async def fold(
        self,
        view: ResourceView,
        status: SlurmJobStatus,
        views: Sequence[SlurmJobView] | None,
        *,
        logs_only: bool = False,
    ) -> bool:
        """Fold Slurm's view (None: gone from the controller), the log tails and, for a failed
        attempt, the retry rules into `status` (built on `view.status`) and write it.

        False when Slurm's job is not the attempt's (`core.decisions.belongs`): then nothing
        is written, and a Warning Event says so."""
        attempt = status.current_attempt
        assert attempt is not None
        generation, now = view.generation, utc_now()
        obs: Observation | None = None
        seen: ArrayObservation | None = None
        if logs_only:
            transition = Transition(status)
        else:
            if views is None:
                views = await self._from_accounting(view.ref.uid, attempt)
            other = stranger(views, view.ref.uid, attempt)
            if other is not None:
                await refuse_stranger(
                    self.edge, view.ref, attempt, other, "the status is not changed"
                )
                return False
            if not views:
                transition = lost(
                    status,
                    f"Slurm job {attempt.job_id} is no longer known to the controller and "
                    "there is no accounting record; it is not resubmitted",
                    generation,
                    now,
                )
            elif attempt.array is not None:
                seen = await self._observe_array(view.ref.uid, status, attempt, views)
                obs = seen.observation
            else:
                obs = observe(views)
        logs: Logs | None = None
        # An array's tails are one task's: the one this observation chose, else the last one's.
        index = seen.log_index if seen is not None else shown_index(status)
        if attempt.staging_dir:
            logs = await self.logs(view, attempt, index=index)
        decided = obs  # what the retry rules judge: Slurm's own reason, not the rewrite
        if obs is not None:
            assert views
            if lacks_output(obs, logs is not None and logs.stdout is None):
                target = await self._output_target(view, attempt, views, index)
                obs = output_unwritable(obs, target)
            if seen is not None:
                seen = dataclasses.replace(seen, observation=obs)
                transition = observed_array(status, seen, generation, now)
            else:
                transition = observed(status, obs, generation, now)
        if not logs_only:
            await self._cancel_late(view, status)
        new = transition.status
        if attempt.staging_dir:
            if logs is not None:
                new = with_logs(new, logs, self.settings.status_tail_bytes)
            if obs is not None and obs.final:
                # The script deletes it when it runs; a job that ended without running must
                # not leave secret values on the shared storage.
                staging = attempt_dir(
                    self.settings.storage_root, view.ref, attempt.number, attempt.staging_dir
                )
                await asyncio.to_thread(remove_secrets, self.settings, staging)
        transition = Transition(new, transition.events)
        if decided is not None and decided.final and decided.phase is Phase.FAILED:
            transition = self._after_failure(view, transition, decided, logs, now)
        await self.edge.apply(view, transition)
        if transition.status.next_attempt_at is not None:
            self._retry_later(view.ref, transition.status.next_attempt_at)
        return True

    async def _observe_array(
        self,
        uid: str,
        status: SlurmJobStatus,
        attempt: Attempt,
        views: Sequence[SlurmJobView],
    ) -> ArrayObservation:
        """The array's tasks as Slurm's views show them. Tasks the controller no longer has
        (it forgets ended tasks while the array runs) and the attempt does not remember are
        looked for in accounting, when there is one."""
        assert attempt.array is not None
        total = array_total(status.attempts)
        seen = observe_array(views, attempt.array, total=total)
        if not seen.unseen or any(v.source is JobSource.ACCOUNTING for v in views):
            return seen
        try:
            records = await self._from_accounting(uid, attempt)
        except SlurmError as exc:
            log.info("array %s: accounting: %s", attempt.job_id, exc)
            return seen
        found = [
            r
            for r in records
            if r.array_task_id in seen.unseen and belongs(r, uid, attempt) and r.is_final
        ]
        if not found:
            return seen
        return observe_array([*views, *found], attempt.array, total=total)

    async def _cancel_late(self, view: ResourceView, status: SlurmJobStatus) -> None:
        """A job of an attempt proven absent that shows up after all (its request held in a
        proxy longer than the fencing window) duplicates the newer attempt: cancel it and say
        that the window was too short. Looked for at each fold, for a while after the proof,
        of the attempts just before the current one (`core.absence.late_candidates`), in one
        listing of the controller's jobs: one `GET /jobs` a fold, whatever the status says."""
        now = utc_now()
        candidates = late_candidates(status.attempts, now, self._window)
        if not candidates:
            return
        try:
            listing = await (await self.slurm()).list_jobs()
        except SlurmError as exc:
            log.info("looking for late jobs of %s: %s", view.ref.name, exc)
            return
        for attempt, late in late_jobs(candidates, listing.jobs, view.ref.uid):
            for views in by_leader(late).values():
                job = await self.identity.check(view, attempt, views, "it is not cancelled")
                if job is None:
                    continue
                await self.identity.cancel_quietly(job)
                self._on_late()
                proven = parse_rfc3339(attempt.proven_absent_at)
                after = (now - proven).total_seconds() if proven else 0.0
                text = (
                    f"Slurm job {job.job_id} of attempt {attempt.number} appeared {after:.0f} s "
                    "after that attempt was proven absent (its request was held longer than "
                    f"the fencing window of {self._window.seconds:.0f} s: raise "
                    "SLURMJOB_ABSENCE_MARGIN); cancelled as a duplicate of attempt "
                    f"{status.attempts[-1].number}"
                )
                log.warning("%s/%s: %s", view.ref.namespace, view.ref.name, text)
                await self.edge.event(view.ref, "Warning", LATE_SUBMIT_CANCELLED, text)

    def _after_failure(
        self,
        view: ResourceView,
        transition: Transition,
        obs: Observation,
        logs: Logs | None,
        now: datetime,
    ) -> Transition:
        """Ask the retry rules about a failed attempt; schedule a new one when they say so."""
        spec = view.spec
        if spec is None:
            return transition
        tails = [logs.stdout, logs.stderr] if logs is not None else []
        text = "\n".join(t.tail for t in tails if t is not None)
        status = transition.status
        decision = decide(spec.retry, obs, text, status.attempts[:-1])
        if not decision.retries:
            return Transition(not_retried(status, decision), transition.events)
        scheduled = retry_scheduled(status, decision, view.generation, now)
        return Transition(scheduled.status, transition.events + scheduled.events)

    def reconcile_at(self, ref: ObjectRef, due: str, done: Callable[[], None]) -> None:
        """Reconcile `ref` at `due` (again after each RetryLater); `done` once it went
        through or the resource is gone."""
        self._retry_later(ref, due, done)

    def _retry_later(
        self, ref: ObjectRef, due: str, done: Callable[[], None] | None = None
    ) -> None:
        """Submit the scheduled retry when it is due (a restart finds it again on resume)."""

        async def later() -> None:
            when = parse_rfc3339(due)
            while True:
                await asyncio.sleep(max(0.0, (when - utc_now()).total_seconds()) if when else 0)
                try:
                    await self._reconcile(ref)
                    return
                except RetryLater as exc:
                    when = utc_now() + timedelta(seconds=exc.delay)
                except Exception:
                    log.exception("retry of %s/%s failed; trying again", ref.namespace, ref.name)
                    when = utc_now() + timedelta(seconds=self._backoff)

        task = asyncio.get_running_loop().create_task(later())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if done is not None:
            task.add_done_callback(lambda _: done())

    async def logs(
        self, view: ResourceView, attempt: Attempt, *, index: int | None = None
    ) -> Logs | None:
        """The attempt's log tails (of its task `index`, for an array); None (keep what the
        status has) when they cannot be read
        or are refused (`storage.nofollow`), when the read takes longer than `READ_TIMEOUT`
        (one job's storage must not hold up the others), or when the secret values to redact
        them are not known. The directory is derived from the resource, not the status."""
        ref = view.ref
        base = attempt_dir(self.settings.storage_root, ref, attempt.number, attempt.staging_dir)
        redact = await self.edge.redactions(view)
        owner = self._job_uid(ref.namespace)
        read = asyncio.to_thread(read_attempt_logs, self.settings, base, redact, owner, index=index)
        try:
            return await asyncio.wait_for(read, READ_TIMEOUT)
        except TimeoutError:  # an OSError too: first
            log.warning(
                "reading the logs of %s/%s took over %s s; the tails are kept as they were",
                ref.namespace,
                ref.name,
                READ_TIMEOUT,
            )
            return None
        except (OSError, ValueError) as exc:  # ValueError: a task index no file can have
            log.warning("cannot read the logs of %s/%s: %s", ref.namespace, ref.name, exc)
            return None

    async def _output_target(
        self,
        view: ResourceView,
        attempt: Attempt,
        views: Sequence[SlurmJobView],
        index: int | None = None,
    ) -> OutputTarget:
        """Where the job was to write its output and who it ran as, for the message of a job
        whose output could not be opened. The directory is derived from the resource."""
        base = attempt_dir(
            self.settings.storage_root, view.ref, attempt.number, attempt.staging_dir
        )
        uid = self._job_uid(view.ref.namespace)
        owner = await asyncio.to_thread(attempt_dir_owner, self.settings, base, uid)
        return OutputTarget(
            path=str(base / log_files(index)[0]),
            user=leader(views).user,
            uid=job_owner(self.settings) if uid is None else uid,
            directory=str(base),
            owner=owner,
        )

    async def _from_accounting(self, uid: str, attempt: Attempt) -> list[SlurmJobView]:
        """The attempt's accounting records. A job id is reused once Slurm wraps or resets its
        ids, so the records of other jobs under it are left out; when every record is another
        job's, they are returned for `fold` to refuse."""
        client = await self.slurm()
        assert attempt.job_id is not None
        try:
            records = await client.get_job_accounting(
                client.lifecycle_ref(attempt.job_id, attempt.sluid)
            )
        except (SlurmUnsupported, SlurmNotFound):
            return []
        return [r for r in records if belongs(r, uid, attempt)] or records

    async def report_reachability(
        self, followed: Sequence[Tracked], reachable: bool, reason: Reason, message: str
    ) -> None:
        """slurmrestd answered (or refused) the last sweep: say so on every followed job
        whose condition does not say so already, once per change, a few at a time."""
        if self._reachable is reachable:
            return
        wanted = ("True" if reachable else "False", str(reason))
        limit = asyncio.Semaphore(self.settings.refresh_concurrency)

        async def tell(item: Tracked) -> bool:
            async with limit, self.edge.step(item.ref.uid):
                try:
                    view = await self.edge.fresh(item.ref)
                    if view is not None:
                        transition = reachability(
                            view.status, reachable, reason, message, view.generation, utc_now()
                        )
                        await self.edge.apply(view, transition)
                except ResourceGone:
                    pass
                except Exception:  # one resource must not keep the others from hearing it
                    log.exception("cannot report reachability on %s", item.ref.name)
                    return False
                return True

        # A job that never had the condition needs none while slurmrestd answers (the jobs
        # submitted after the last report): only a failure is worth telling every one.
        due = [
            i for i in followed if i.reachable != wanted and not (reachable and i.reachable is None)
        ]
        told = await asyncio.gather(*(tell(i) for i in due))
        if all(told):
            self._reachable = reachable
