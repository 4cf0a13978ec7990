"""Archiving a deleted SlurmJob's attempts before its staging directory is removed
(`storage.archive`), and keeping the archive to its retention and its owners' shares
(`storage.archivesweep`).

The values that hide the attempt's secrets are those it was given (kept in memory since the
submit, or in the operator's copy beside the attempt) and the Secrets' current ones. When none
can be had for an attempt (a Secret deleted with the SlurmJob, in the mode where no copy is
kept because jobs could read it), nothing is archived rather than an unredacted log, and an
Event says so. A failing archive root is reported the same way; the deletion goes on (a
namespace must be deletable whatever the archive's state). An entry the per-entry cap cut is
kept (each file's end) and a `LogsArchiveTruncated` Warning names the cap.

Who waits for whom (`ArchiveSlots`): one entry is written at a time per owner (its tenant,
else its namespace), and at most `ARCHIVE_WRITERS` owners' entries at once, the waiting owners
served in turn. So one tenant's deletions (an entry at the cap takes seconds to read and
redact) queue behind each other, not in front of another tenant's finalizer, and the
memory stays a few files' caps whatever comes at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.fairness import FairLimiter
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.core.shares import share_owner
from slurmjob_operator.kube.ports import NamespaceReader
from slurmjob_operator.storage.archive import ArchiveRecord, AttemptSource, write_entry
from slurmjob_operator.storage.archivesweep import sweep
from slurmjob_operator.storage.executors import Pool, run_in
from slurmjob_operator.storage.locate import attempt_dir
from slurmjob_operator.storage.logs import SecretsUnknown, attempt_redactor
from slurmjob_operator.storage.nofollow import job_owner

log = logging.getLogger(__name__)

DAY = 86400.0
#: How often the leader sweeps the archive.
SWEEP_INTERVAL = 600.0
#: Owners whose entries are written at once: each holds one file's cap (16 MiB by default)
#: and its redacted copy in memory while it is read, and a thread of the archive's pool.
ARCHIVE_WRITERS = 2


class ArchiveSlots:
    """One writer per owner, at most `writers` owners at once, the waiting owners in turn.

    The owner's lock is taken before the shared slot, so an owner with many deletions queued
    holds one slot at most and the others wait on its lock, not in the shared queue: another
    owner waits only while `writers` other owners are writing."""

    def __init__(self, writers: int = ARCHIVE_WRITERS) -> None:
        self._shared = FairLimiter[str](writers)
        self._owners: dict[str, tuple[asyncio.Lock, int]] = {}

    @property
    def idle(self) -> bool:
        """Nobody writes or waits (no owner's lock is kept)."""
        return not self._owners

    @asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        lock, users = self._owners.get(owner) or (asyncio.Lock(), 0)
        self._owners[owner] = (lock, users + 1)
        try:
            async with lock, self._shared.slot(owner):
                yield
        finally:
            lock, users = self._owners[owner]
            if users > 1:
                self._owners[owner] = (lock, users - 1)
            else:
                del self._owners[owner]  # no lock kept for an owner nobody waits on


class Archiver:
    def __init__(
        self,
        settings: Settings,
        edge: ResourceEdge,
        namespaces: NamespaceReader | None,
        job_uid: Callable[[str], int | None],
        clock: Callable[[], float] = time.time,
        *,
        tenant_of: Callable[[str], str | None] = lambda namespace: None,
        slots: ArchiveSlots | None = None,
    ) -> None:
        """`job_uid(namespace)`: the uid the namespace's jobs write their logs as (None: the
        job user of the settings); `tenant_of(namespace)`: the name of its tenant (None: no
        tenants file, or no tenant lists it), whose share its entries count against."""
        self.settings = settings
        self.edge = edge
        self.namespaces = namespaces
        self._job_uid = job_uid
        self._tenant_of = tenant_of
        self._clock = clock
        self.slots = slots or ArchiveSlots()

    def owner(self, namespace: str) -> str:
        """The owner of the namespace's entries, as the tenants file says now."""
        return share_owner(namespace, self._tenant_of(namespace))

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
            owner=self.owner(ref.namespace),
        )
        status = view.status.model_dump(mode="json", by_alias=True, exclude_none=True)
        try:
            async with self.slots.slot(self.owner(ref.namespace)):
                written = await run_in(
                    Pool.ARCHIVE,
                    lambda: write_entry(
                        root,
                        record,
                        sources(),
                        status,
                        file_cap=settings.archive_file_max_bytes,
                        entry_cap=settings.archive_entry_cap,
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
        if written.entry_cap is not None:
            await self.edge.event(
                ref,
                "Warning",
                "LogsArchiveTruncated",
                f"the logs exceed the archive's per-SlurmJob cap of {written.entry_cap} bytes "
                "(SLURMJOB_ARCHIVE_ENTRY_MAX_BYTES): the end of each file was kept, the cap "
                "shared among its files",
            )

    async def _not_archived(self, view: ResourceView, why: str) -> None:
        await self.edge.event(view.ref, "Warning", "LogsNotArchived", f"logs not archived: {why}")

    async def sweep(self) -> None:
        """One pass of the retention and the shares (the leader's, every SWEEP_INTERVAL).
        It runs beside the writers: it skips their temporary entries and only ever removes
        whole entries by name."""
        root = self.settings.archive_root
        if root is None:
            return
        settings = self.settings
        retention = settings.archive_retention_days * DAY
        swept = await run_in(
            Pool.ARCHIVE,
            lambda: sweep(
                root,
                self._clock(),
                retention,
                settings.archive_max_bytes,
                floor=settings.archive_entry_cap,
                owner_of=self.owner,
            ),
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
