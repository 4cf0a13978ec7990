"""Following a submitted job: folding what Slurm says (or that it forgot the job), the log
tails and, for a failed attempt, the retry rules into the status; scheduling the retry;
telling every followed job whether slurmrestd answers."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.status import Attempt, Logs, SlurmJobStatus
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.identity import JobIdentity, refuse_stranger
from slurmjob_operator.controller.latejobs import LateJobs
from slurmjob_operator.controller.probing import Probing
from slurmjob_operator.controller.registry import Tracked
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.controller.wakes import Wakes
from slurmjob_operator.core.afterattempt import AttemptEnd, after_attempt
from slurmjob_operator.core.arrays import (
    ArrayObservation,
    array_total,
    observe_array,
    shown_index,
)
from slurmjob_operator.core.claims import probe_of, segment_of
from slurmjob_operator.core.decisions import (
    belongs,
    stranger,
)
from slurmjob_operator.core.following import (
    OutputTarget,
    lacks_output,
    lost,
    observed,
    observed_array,
    output_unwritable,
    with_logs,
)
from slurmjob_operator.core.jobview import JobSource, SlurmJobView, leader
from slurmjob_operator.core.naming import log_files
from slurmjob_operator.core.probe import ProbeKeys
from slurmjob_operator.core.segments import segment_end
from slurmjob_operator.core.states import Observation, observe
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound, SlurmUnsupported
from slurmjob_operator.storage import checkpoint
from slurmjob_operator.storage.executors import Pool, run_in
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.logs import READ_TIMEOUT, attempt_dir_owner, read_attempt_logs
from slurmjob_operator.storage.nofollow import job_owner
from slurmjob_operator.storage.staging import remove_secrets
from slurmjob_operator.times import parse_rfc3339, utc_now

log = logging.getLogger(__name__)


async def checkpoint_of(
    settings: Settings,
    view: ResourceView,
    attempt: Attempt,
    ended: Observation,
    job_uid: Callable[[str], int | None],
) -> str | None:
    """A walltime segment's checkpoint directory as it ended, scanned only when the end lets
    the chain go on (None: no scan, or one longer than `READ_TIMEOUT`: counted as progress)."""
    walltime = view.spec.walltime if view.spec is not None else None
    if segment_of(attempt) is None or walltime is None or segment_end(ended, walltime) is None:
        return None
    ref = view.ref
    read = asyncio.to_thread(
        checkpoint.scan, settings, ref.namespace, ref.name, ref.uid, job_uid(ref.namespace)
    )
    try:
        return await asyncio.wait_for(read, READ_TIMEOUT)
    except TimeoutError:
        log.warning("%s/%s: the checkpoint scan took too long", ref.namespace, ref.name)
        return None


async def read_tails(
    settings: Settings,
    base: Path,
    current: Collection[str] | None,
    owner: int | None,
    *,
    index: int | None = None,
) -> Logs | None:
    """`storage.logs.read_attempt_logs` on the log-reads pool (no removal or archive write
    ever waits in front of it), within `READ_TIMEOUT` (TimeoutError)."""
    read = run_in(Pool.LOG_READS, read_attempt_logs, settings, base, current, owner, index=index)
    return await asyncio.wait_for(read, READ_TIMEOUT)


class Following:
    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        slurm: Callable[[], Awaitable[SlurmClient]],
        wakes: Wakes,
        backoff: float,
        *,
        job_uid: Callable[[str], int | None] = lambda namespace: None,
        identity: JobIdentity,
        on_late: Callable[[], None] = lambda: None,
        probe_keys: Callable[[ResourceView, str | None], ProbeKeys | None] = lambda v, p: None,
    ) -> None:
        """`job_uid(namespace)`: the uid that namespace's logs belong to when it is not the
        settings' job user (a tenant's own uid); `identity`: what makes a late job's handle
        before it is cancelled; `on_late`: counts a late submit cancelled; `probe_keys`: a job's
        probe keys made from the resource (`pipeline.probe_keys_of`)."""
        self.settings = settings
        self.identity = identity
        self.late = LateJobs(settings, edge, slurm, identity, on_late)
        self._job_uid = job_uid
        self.edge = edge
        self.slurm = slurm
        self.wakes = wakes
        self._backoff = backoff
        self.probing = Probing(settings, slurm, job_uid, probe_keys)

    async def refresh(
        self, tracked: Tracked, views: Sequence[SlurmJobView] | None, *, logs_only: bool = False
    ) -> None:
        """Fold a changed Slurm state (None: the job is gone from the controller) and the log
        tails into the resource's status; `logs_only` when only the log files moved."""
        ref = tracked.ref

        async def fold_fresh(view: ResourceView) -> None:
            status = view.status
            attempt = status.current_attempt
            moved_on = status.next_attempt_at is not None or (
                status.phase is not None and status.phase.is_terminal
            )
            if attempt is None or attempt.job_id != tracked.job_id or moved_on:
                self.edge.observe(ref, status)
                return
            await self.fold(view, status, views, logs_only=logs_only)

        async with self.edge.step(ref.uid):
            # Conditioned: the fold rewrites status.attempts whole (a merge patch replaces a
            # list), so it lands only on the version it was computed from; a write of another
            # replica or handler meanwhile (a newer write-ahead record) makes it read and fold
            # again, once, here, and else at the next poll.
            view = await self.edge.on_fresh(ref, fold_fresh)
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
            await self.late.cancel(view, status)
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
        probe = probe_of(attempt)
        # The status says whether this attempt's record was taken already: a claim that can
        # only make this job's own record be taken again (under keys made from the resource).
        if probe is not None and probe.outcome is None and attempt.staging_dir:
            placed = leader(views).partition if views else None
            transition = await self.probing.fold(view, attempt, transition, now, placed)
        if decided is not None and decided.final and view.spec is not None:
            tails = [logs.stdout, logs.stderr] if logs is not None else []
            text = "\n".join(t.tail for t in tails if t is not None)
            end = AttemptEnd(
                transition,
                view.spec,
                decided,
                text,
                view.generation,
                now,
                probe_attempts=await self.probing.attempts(),
                checkpoint=await checkpoint_of(
                    self.settings, view, attempt, decided, self._job_uid
                ),
            )
            transition = after_attempt(end)
        await self.edge.apply(view, transition)
        due = parse_rfc3339(transition.status.next_attempt_at)
        if due is not None:
            # The retry is submitted when due (a restart finds it again on resume).
            self.wakes.at(view.ref, (due - utc_now()).total_seconds())
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
        try:
            return await read_tails(self.settings, base, redact, owner, index=index)
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
        ran_as = leader(views)
        expected = job_owner(self.settings) if uid is None else uid
        return OutputTarget(
            path=str(base / log_files(index)[0]),
            user=ran_as.user,
            # Slurm's word for who the job ran as; the site's only when Slurm gave none.
            uid=ran_as.user_id if ran_as.user_id is not None else expected,
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
