"""The image cache's sweep: the leader's periodic pass over the records and the housekeeping
job of the cache user that acts on the files.

Each pass: follows the housekeeping job in flight (its report, or why there is none, goes in
the sweep's state, `SLURMJOB`'s own ConfigMap `slurmjob-imagecache-sweep`, which `doctor`
reads); lists the records and the SlurmJobs; releases the users that are final or gone, forgets
the entries the last check found missing and evicts what is over the cap
(`evict.plan_sweep`); writes the records (each under its lock, skipped when it changed since
it was listed: the next pass decides again); then submits one housekeeping job when a file is
to be deleted or a check is due. The job deletes an evicted file only if it was published
before the pass decided (a new import of the same digest keeps its file).

Whether a SlurmJob is final is read from its status through `core.finality`: a user who
rewrites a status to a final phase only lets the cache evict the entry of that SlurmJob.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from pathlib import PurePosixPath

from pydantic import ValidationError

from slurmjob_operator.config import Settings
from slurmjob_operator.core.launch import StagedFile
from slurmjob_operator.imagecache.attempts import JobState
from slurmjob_operator.imagecache.evict import SweepPlan, cached_files, plan_sweep
from slurmjob_operator.imagecache.housekeeping import (
    MAX_MISSING,
    MAX_REPORT_BYTES,
    ReportError,
    SweepReport,
    SweepState,
    check_due,
    parse_report,
)
from slurmjob_operator.imagecache.importer import SCRIPT_FILE, Importer, staging_dir
from slurmjob_operator.imagecache.record import ImageRecord, ImportAttempt
from slurmjob_operator.imagecache.script import layout_for, operator_path, render_sweep
from slurmjob_operator.imagecache.store import RecordStore
from slurmjob_operator.kube.ports import ConfigMapStore
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.storage.logs import read_tail
from slurmjob_operator.storage.nofollow import UnsafePath
from slurmjob_operator.storage.staging import stage_attempt
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

STATE_CONFIGMAP = "slurmjob-imagecache-sweep"
STATE_KEY = "state"
DELETE_FILE = "delete"
KEEP_FILE = "keep"

LiveUids = Callable[[], Awaitable[frozenset[str]]]
SizesHook = Callable[[Iterable[ImageRecord]], None]


class CacheSweeper:
    def __init__(
        self,
        settings: Settings,
        store: RecordStore,
        configmaps: ConfigMapStore,
        importer: Importer,
        namespace: str,
        live_uids: LiveUids,
        on_records: SizesHook | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.settings = settings
        self._store = store
        self._configmaps = configmaps
        self._importer = importer
        self._namespace = namespace
        self._live_uids = live_uids
        self._on_records = on_records
        self._clock = clock

    async def run(self) -> None:
        """Sweep every `image_cache_sweep_seconds` until cancelled; a failed pass is logged
        and the next one tries again."""
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("image cache sweep failed; trying again next time")
            await asyncio.sleep(self.settings.image_cache_sweep_seconds)

    async def sweep(self) -> SweepState:
        """One pass (see the module docstring); the sweep's state after it."""
        state = await self.read_state()
        if state.in_flight:
            state = await self._follow(state)
            await self._write_state(state)
            if state.in_flight:
                return state
        now = self._clock()
        if state.since is None:
            state = state.model_copy(update={"since": now})
        records = await self._store.read_all()
        live = await self._live_uids()
        missing = state.report.missing if state.report is not None else []
        plan = plan_sweep(
            records,
            live,
            self.settings.image_cache_max_bytes,
            self.settings.image_cache_floor,
            missing,
            now,
        )
        paths, after = await self._apply(plan, {r.key: r for r in records})
        if missing and state.report is not None:
            # Forgotten once: the same path may be published again by a later import.
            state = state.model_copy(
                update={"report": state.report.model_copy(update={"missing": []})}
            )
        if paths:
            state = state.model_copy(update={"evicted": state.evicted + len(paths)})
            log.info("image cache: %d entries evicted over the cap: %s", len(paths), paths)
        if self._on_records is not None:
            self._on_records(after)
        if paths or check_due(state, now, self.settings.image_cache_check_seconds):
            state = await self._submit(state, now, paths, after)
        await self._write_state(state)
        return state

    async def _apply(
        self, plan: SweepPlan, listed: dict[str, ImageRecord]
    ) -> tuple[list[str], list[ImageRecord]]:
        """Write the plan's records, each only if it is still what was listed. The paths no
        record names any more (those the job deletes), and the records as they now are (a
        record made since the listing is not among them: the next pass sees it)."""
        now = dict(listed)
        changes: list[tuple[str, ImageRecord | None]] = [
            *((r.key, r) for r in plan.write),
            *((key, None) for key in plan.delete),
        ]
        for key, wanted in changes:
            async with self._store.lock(key):
                current = await self._store.read(key)
                if current != listed.get(key):
                    wanted = current  # changed meanwhile: left as it is
                elif wanted is None:
                    await self._store.delete(key)
                else:
                    await self._store.write(wanted)
            if wanted is None:
                now.pop(key, None)
            else:
                now[key] = wanted
        records = list(now.values())
        still = {f.path for f in cached_files(records)}
        return [p for p in plan.paths if p not in still], records

    async def _submit(
        self, state: SweepState, now: datetime, paths: list[str], records: list[ImageRecord]
    ) -> SweepState:
        """Write the next job's name ahead, stage its lists and submit it."""
        state = state.submitting(now)
        await self._write_state(state)
        name = state.job_name
        assert name is not None
        settings = self.settings
        where = staging_dir(settings, name)
        node = PurePosixPath(settings.to_cluster_path(where))
        keep = sorted({f.path for f in cached_files(records)})
        launch = render_sweep(
            settings, name, node / DELETE_FILE, node / KEEP_FILE, int(now.timestamp())
        )
        files = {
            SCRIPT_FILE: StagedFile(launch.script.encode(), 0o500),
            DELETE_FILE: StagedFile("".join(f"{p}\n" for p in paths).encode(), 0o400),
            KEEP_FILE: StagedFile("".join(f"{p}\n" for p in keep).encode(), 0o400),
        }
        await asyncio.to_thread(
            stage_attempt, settings, where, files, job_uid=settings.image_cache_uid
        )
        try:
            client = await self._importer.client()
            receipt = await client.submit(launch)
        except SlurmError as exc:
            # Unconfirmed: the next pass looks the job up by its name.
            log.warning("image cache sweep %s: submit unconfirmed (%s)", name, exc)
            return state
        return state.model_copy(update={"job_id": int(receipt.job_id)})

    async def _follow(self, state: SweepState) -> SweepState:
        """The job in flight: still running (unchanged), or its report recorded."""
        assert state.job_name is not None
        assert state.submitted_at is not None
        attempt = ImportAttempt(
            number=1,
            job_name=state.job_name,
            job_id=state.job_id,
            submitted_at=state.submitted_at,
            write_ahead=state.job_id is None,
        )
        now = self._clock()
        job = await (
            self._importer.state(attempt)
            if state.job_id is not None
            else self._importer.find(attempt, now)
        )
        if job.state in (JobState.PENDING, JobState.RUNNING):
            if state.job_id is None and job.job_id is not None:
                return state.model_copy(update={"job_id": job.job_id})
            return state
        await asyncio.to_thread(self._importer.clean, attempt)
        report, problem = await asyncio.to_thread(self._report, state.job_name)
        if job.state is not JobState.COMPLETED and problem is None:
            problem = f"job {state.job_name} ended {job.state.value} (exit {job.exit_code})"
        if problem is not None:
            log.warning("image cache sweep: %s", problem)
        return state.ended(now, report, problem)

    def _report(self, job_name: str) -> tuple[SweepReport | None, str | None]:
        settings = self.settings
        layout = layout_for(settings)
        path = operator_path(settings, layout.result_path(job_name))
        assert settings.image_cache_root is not None
        assert settings.image_cache_uid is not None
        try:
            tail = read_tail(
                path,
                root=settings.image_cache_root,
                owner=settings.image_cache_uid,
                max_bytes=MAX_REPORT_BYTES + 1,
                max_lines=MAX_MISSING + 16,
            )
        except (UnsafePath, OSError) as exc:
            return None, f"{job_name}: its report cannot be read ({exc})"
        if tail is None:
            return None, f"{job_name}: it wrote no report"
        if tail.truncated:
            return None, f"{job_name}: its report is over {MAX_REPORT_BYTES} bytes"
        try:
            return parse_report(tail.tail.encode(), layout, job_name), None
        except ReportError as exc:
            return None, f"{job_name}: {exc}"

    async def read_state(self) -> SweepState:
        data = await self._configmaps.read_configmap(self._namespace, STATE_CONFIGMAP)
        text = (data or {}).get(STATE_KEY)
        if text is None:
            return SweepState()
        try:
            return SweepState.model_validate_json(text)
        except ValidationError as exc:
            log.warning("image cache sweep state does not parse (%s): starting it over", exc)
            return SweepState()

    async def _write_state(self, state: SweepState) -> None:
        # Not caught: the write-ahead must be on the apiserver before its job is submitted.
        await self._configmaps.merge_configmap(
            self._namespace, STATE_CONFIGMAP, {STATE_KEY: state.model_dump_json(by_alias=True)}
        )
