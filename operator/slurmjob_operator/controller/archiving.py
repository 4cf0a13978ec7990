"""Archiving a deleted SlurmJob's attempts before its staging directory is removed
(`storage.archive`), and keeping the archive to its retention and size cap.

The values that hide the attempt's secrets are those it was given (kept in memory since the
submit, or in the operator's copy beside the attempt) and the Secrets' current ones. When none
can be had for an attempt (a Secret deleted with the SlurmJob, in the mode where no copy is
kept because jobs could read it), nothing is archived rather than an unredacted log, and an
Event says so. A failing archive root is reported the same way; the deletion goes on (a
namespace must be deletable whatever the archive's state).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.kube.ports import NamespaceReader
from slurmjob_operator.storage.archive import ArchiveRecord, AttemptSource, sweep, write_entry
from slurmjob_operator.storage.executors import Pool, run_in
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.logs import SecretsUnknown, attempt_redactor
from slurmjob_operator.storage.nofollow import job_owner

log = logging.getLogger(__name__)

DAY = 86400.0
#: How often the leader sweeps the archive.
SWEEP_INTERVAL = 600.0


class Archiver:
    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        namespaces: NamespaceReader | None,
        job_uid: Callable[[str], int | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`job_uid(namespace)`: the uid the namespace's jobs write their logs as (None: the
        job user of the settings)."""
        self.settings = settings
        self.edge = edge
        self.namespaces = namespaces
        self._job_uid = job_uid
        self._clock = clock
        # One entry written at a time: its memory is one file's cap, whatever comes at once.
        self._writing = asyncio.Semaphore(1)

    @property
    def enabled(self) -> bool:
        return self.settings.archive_root is not None and self.namespaces is not None

    async def archive(self, view: ResourceView) -> None:
        """Archive every attempt of `view` (read afresh by the caller) that has files."""
        root = self.settings.archive_root
        if root is None or self.namespaces is None or not view.status.attempts:
            return
        ref = view.ref
        namespace_uid = await self.namespaces.namespace_uid(ref.namespace)
        if namespace_uid is None:
            await self._not_archived(view, f"namespace {ref.namespace} cannot be read")
            return
        current = await self.edge.redactions(view)
        uid = self._job_uid(ref.namespace)
        owner = job_owner(self.settings) if uid is None else uid
        settings = self.settings
        numbers = [a.number for a in view.status.attempts]

        def sources() -> list[AttemptSource]:
            out = []
            for number in numbers:
                base = attempt_dir(settings.storage_root, ref, number, None)
                redactor = attempt_redactor(settings, base, current, owner)
                out.append(
                    AttemptSource(
                        number, settings.storage_root, base, owner, job_owner(settings), redactor
                    )
                )
            return out

        record = ArchiveRecord(
            namespace=ref.namespace,
            namespace_uid=namespace_uid,
            name=ref.name,
            uid=ref.uid,
            archived_at=self._clock(),
            phase=str(view.status.phase) if view.status.phase is not None else None,
        )
        status = view.status.model_dump(mode="json", by_alias=True, exclude_none=True)
        try:
            async with self._writing:
                written = await run_in(
                    Pool.ARCHIVE,
                    lambda: write_entry(
                        root,
                        record,
                        sources(),
                        status,
                        file_cap=settings.archive_file_max_bytes,
                        entry_cap=settings.archive_max_bytes,
                    ),
                )
        except SecretsUnknown:
            await self._not_archived(
                view,
                "the secret values to hide in its logs are unknown (a Secret was deleted, and "
                "no copy is kept where jobs could read it); nothing is archived rather than an "
                "unredacted log",
            )
            return
        except (OSError, ValueError) as exc:
            log.warning("cannot archive %s/%s: %s", ref.namespace, ref.name, exc)
            await self._not_archived(view, f"the archive root cannot take it: {exc}")
            return
        kept = [a.number for a in written.attempts if a.files]
        cut = sorted({f for a in written.attempts for f in (*a.truncated, *a.skipped)})
        text = (
            f"logs of attempt(s) {', '.join(map(str, kept)) or 'none'} archived for "
            f"{settings.archive_retention_days} day(s): kubectl slurmjob logs {ref.name} "
            f"--uid {ref.uid}"
        )
        if cut:
            text += f" (cut or left out by the archive's caps: {', '.join(cut[:8])})"
        await self.edge.event(ref, "Normal", "LogsArchived", text)

    async def _not_archived(self, view: ResourceView, why: str) -> None:
        await self.edge.event(view.ref, "Warning", "LogsNotArchived", f"logs not archived: {why}")

    async def sweep(self) -> None:
        """One pass of the retention and the size cap (the leader's, every SWEEP_INTERVAL)."""
        root = self.settings.archive_root
        if root is None:
            return
        retention = self.settings.archive_retention_days * DAY
        async with self._writing:
            swept = await run_in(
                Pool.ARCHIVE, sweep, root, self._clock(), retention, self.settings.archive_max_bytes
            )
        if swept.removed:
            log.info(
                "archive: %d entr(y/ies) removed, %d kept (%d bytes)",
                swept.removed,
                swept.kept,
                swept.kept_bytes,
            )

    async def sweep_periodically(self, interval: float = SWEEP_INTERVAL) -> None:
        while True:
            try:
                await self.sweep()
            except OSError as exc:
                log.warning("cannot sweep the archive %s: %s", self.settings.archive_root, exc)
            await asyncio.sleep(interval)
