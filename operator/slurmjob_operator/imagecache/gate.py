"""Where a SlurmJob that names `spec.framework.image` waits until the cache has its image.

Called by the submit's checks (controller/checks.py) before anything is rendered: it refuses
an image the site or the tenant does not allow (`SpecError`, the setting or key named), says
`ImageNotReady` (the SlurmJob stays Pending, `ImageReady=False`, reason `ImagePulling`, the
import job's id in the message) while the import runs, `ImagePullFailed` when it failed for
good, and otherwise gives the entry the job runs (`site.artifacts.CachedImage`), built from
the operator's record only: a SlurmJob's status is never read here.

Each SlurmJob is bound to the digest it first ran: its uid is listed in the record with that
digest, and every later attempt, segment and array task uses the same entry (a tag that
moved in the registry changes nothing of it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import PurePosixPath

from slurmjob_operator.api.errors import SpecError
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.config import Settings
from slurmjob_operator.imagecache.attempts import ImportJob, JobState, submitted
from slurmjob_operator.imagecache.decide import (
    AdoptImport,
    Fail,
    ImportPolicy,
    Ready,
    RetryLater,
    SubmitImport,
    WaitImport,
    decide,
)
from slurmjob_operator.imagecache.evict import may_start_import, without_entry
from slurmjob_operator.imagecache.importer import CredentialsError, Importer, netrc_line
from slurmjob_operator.imagecache.meter import CacheMeter
from slurmjob_operator.imagecache.record import Entry, ImageRecord, ImportResult
from slurmjob_operator.imagecache.reference import ImageReferenceError
from slurmjob_operator.imagecache.request import ImageRefused, ImageRequest, image_request
from slurmjob_operator.imagecache.script import layout_for, operator_path
from slurmjob_operator.imagecache.store import RecordStore
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.site.artifacts import CachedImage
from slurmjob_operator.site.catalogs import PROFILE_FORMAT
from slurmjob_operator.site.tenants import TenantScope
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

FIELD = "spec.framework.image"
#: Decisions in one pass (submit, then look at what it did): a bound on the loop, not a wait.
MAX_STEPS = 4


class ImageNotReady(RuntimeError):
    """The import runs (or waits to be retried): the SlurmJob waits, nothing is submitted."""


class ImagePullFailed(RuntimeError):
    """The import failed for good: the SlurmJob fails, nothing of it was ever submitted."""


def requested_image(
    settings: Settings, spec: SlurmJobSpec, scope: TenantScope | None
) -> ImageRequest:
    """What `spec` asks of the cache, or a `SpecError` naming why it may not."""
    image = spec.framework.image
    assert image is not None
    if not settings.images_enabled:
        raise SpecError(
            [
                f"{FIELD}: this site does not enable images (SLURMJOB_IMAGES_ENABLED, chart "
                "value images.enabled): name a runtime of its registry with runtimeId"
            ]
        )
    if settings.slurm_jwt_key_file is None:
        raise SpecError(
            [
                f"{FIELD}: images are imported as the cache user, but this site runs every "
                "job as one user (a token file, SLURMJOB_SLURM_JWT_FILE): name a runtimeId"
            ]
        )
    tenant = scope.tenant if scope is not None else None
    if tenant is not None:
        registries = list(tenant.image_registries or [])
        where = f"tenant {tenant.name}'s imageRegistries"
    else:
        registries = list(settings.allowed_image_registries)
        where = "SLURMJOB_IMAGE_REGISTRIES"
    if not registries:
        raise SpecError([f"{FIELD}: {where} lists no registry"])
    try:
        return image_request(
            image,
            tenant=tenant.name if tenant is not None else None,
            allowed_registries=registries,
            with_credentials=tenant is not None and tenant.image_credentials_secret is not None,
            fmt=PROFILE_FORMAT[settings.slurm_runtime_profile],
        )
    except (ImageReferenceError, ImageRefused) as exc:
        raise SpecError([f"{FIELD}: {exc} ({where})"]) from None


SecretReader = Callable[[str, str], Awaitable[tuple[dict[str, bytes], str] | None]]


class ImageGate:
    def __init__(
        self,
        settings: Settings,
        store: RecordStore,
        importer: Importer,
        read_secret: SecretReader,
        secret_namespace: str,
        clock: Callable[[], datetime] = utc_now,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self._meter = CacheMeter(metrics)
        self.store = store
        self.importer = importer
        self._read_secret = read_secret
        self._secret_namespace = secret_namespace
        self._clock = clock
        #: Scopes with an import refused a slot, until one of theirs starts (the share rule).
        self._waiting: dict[str, float] = {}
        #: A waiting scope asks again at every pass of its SlurmJobs; one not heard of for
        #: this long (its SlurmJobs deleted or refused) no longer holds back the others.
        self._waiting_seconds = max(60.0, settings.poll_interval * 4)
        self.policy = ImportPolicy(
            tag_reuse_seconds=float(settings.image_tag_reuse_seconds),
            max_retries=settings.image_import_retries,
            backoff_seconds=max(30.0, settings.poll_interval * 3),
        )

    async def entry_for(
        self, spec: SlurmJobSpec, scope: TenantScope | None, uid: str
    ) -> CachedImage:
        """The entry the SlurmJob `uid` runs; see the module docstring for what is raised."""
        request = requested_image(self.settings, spec, scope)
        async with self.store.lock(request.key):
            record = await self.store.read(request.key)
            bound = _bound_entry(record, uid)
            if bound is not None:
                assert record is not None
                self._meter.hit(record.scope)
                return self._cached(record, bound)
            return await self._decide(request, record, uid, scope)

    async def forget(
        self, spec: SlurmJobSpec, scope: TenantScope | None, uid: str, path: str, why: str
    ) -> None:
        """The entry at `path` is not the file its import recorded (evicted, deleted or
        changed by hand): the record forgets it and SlurmJob `uid`'s binding, so the next
        pass imports it again instead of failing the SlurmJob."""
        key = requested_image(self.settings, spec, scope).key
        async with self.store.lock(key):
            record = await self.store.read(key)
            if record is None:
                return
            kept = without_entry(record.released_by(uid), path)
            log.warning("image record %s forgets %s: %s", key, path, why)
            if kept is None:
                await self.store.delete(key)
            else:
                await self.store.write(kept)

    async def _decide(
        self,
        request: ImageRequest,
        record: ImageRecord | None,
        uid: str,
        scope: TenantScope | None,
    ) -> CachedImage:
        layout = layout_for(self.settings)
        job: ImportJob | None = None
        result: ImportResult | None = None
        sent = False  # this pass sent an import: its entry, if it ends now, is no hit
        for _ in range(MAX_STEPS):
            now = self._clock()
            action = decide(request, record, now, self.policy, layout, job, result)
            before, record = record, action.record
            if isinstance(action, SubmitImport):
                record = submitted(record, await self._submit(request, record, action, scope))
                await self.store.write(record)
                job, result, sent = None, None, True
                continue
            if isinstance(action, AdoptImport | WaitImport) and job is None:
                attempt = record.attempt
                assert attempt is not None
                if isinstance(action, AdoptImport):
                    job = await self.importer.find(attempt, now)
                else:
                    job = await self.importer.state(attempt)
                if job.state not in (JobState.PENDING, JobState.RUNNING):
                    # Ended (or proven never sent): its staging, the credentials, goes.
                    await asyncio.to_thread(self.importer.clean, attempt)
                    result = await asyncio.to_thread(self.importer.result, attempt)
                if job.job_id is not None or job.state is not JobState.PENDING:
                    continue  # decide again with what was found
            if isinstance(action, AdoptImport | WaitImport):
                await self.store.write(record)
                shown = f"job {action.job_id}" if isinstance(action, WaitImport) else "its job"
                raise ImageNotReady(f"{record.reference} is being imported by {shown}")
            try:
                cached = await self._settle(action, record, uid, request, scope)
            except (ImageNotReady, ImagePullFailed):
                self._meter.written(before, record)  # written, then raised (failed, retried)
                raise
            self._meter.written(before, record)
            if not sent:
                self._meter.hit(record.scope)
            return cached
        raise ImageNotReady(f"{request.reference.canonical}: the import is on its way")

    async def _submit(
        self,
        request: ImageRequest,
        record: ImageRecord,
        action: SubmitImport,
        scope: TenantScope | None,
    ) -> int:
        """Take an import slot, write the record's write-ahead, then send the import. What
        may refuse it (no slot, the tenant's Secret or uid missing) comes before the
        write-ahead: a record is in flight only once its job may be sent."""
        credentials = await self._credentials(request, scope)
        reader = None
        if record.tenant is not None:  # a private image: its tenant's uid alone reads it
            tenant = scope.tenant if scope is not None else None
            reader = tenant.uid if tenant is not None else None
            if reader is None:
                raise ImagePullFailed(f"{FIELD}: a private image needs the tenant's uid")
        now = time.monotonic()
        self._waiting = {s: t for s, t in self._waiting.items() if now - t < self._waiting_seconds}
        self._waiting[record.scope] = now
        slot = may_start_import(
            record.scope,
            self.store.in_flight(),
            self._waiting,
            self.settings.image_imports_per_tenant,
            self.settings.image_imports_max,
        )
        if not slot.allowed:
            raise ImageNotReady(f"{record.reference} waits for an import: {slot.reason}")
        self._waiting.pop(record.scope, None)
        await self.store.write(record)  # the write-ahead, before the POST
        self._meter.miss(record.scope)
        try:
            return await self.importer.submit(record, action.attempt, credentials, reader)
        except SlurmError as exc:
            # Unconfirmed: the next pass looks the job up by its name.
            raise ImageNotReady(
                f"{record.reference}: the import's submit is unconfirmed ({exc})"
            ) from exc

    async def _settle(
        self,
        action: Ready | Fail | RetryLater | SubmitImport | AdoptImport | WaitImport,
        record: ImageRecord,
        uid: str,
        request: ImageRequest,
        scope: TenantScope | None,
    ) -> CachedImage:
        attempt = record.attempt
        if isinstance(action, Ready):
            record = record.used_by(uid, self._clock())
            await self.store.write(record)
            return self._cached(record, action.entry)
        if isinstance(action, Fail):
            await self.store.write(record)
            tail = ""
            if attempt is not None:
                hidden = await self._secret_words(request, scope)
                tail = await asyncio.to_thread(self.importer.log_tail, attempt, hidden)
            shown = f"; the import's log ends: {tail}" if tail else ""
            raise ImagePullFailed(action.message + shown)
        if isinstance(action, RetryLater):
            await self.store.write(record)
            failure = record.failure
            why = f" ({failure.reason}: {failure.message})" if failure is not None else ""
            raise ImageNotReady(
                f"{record.reference}: the import is tried again at {action.at.isoformat()}{why}"
            )
        await self.store.write(record)
        raise ImageNotReady(f"{record.reference} is being imported")

    async def _secret_words(self, request: ImageRequest, scope: TenantScope | None) -> list[str]:
        """The login and password an import of `request` used: hidden in its log's tail."""
        try:
            line = await self._credentials(request, scope)
        except (ImageNotReady, ImagePullFailed):
            return []
        if line is None:
            return []
        words = line.decode().split()
        return [words[3], words[5]] if len(words) == 6 else []

    async def _credentials(self, request: ImageRequest, scope: TenantScope | None) -> bytes | None:
        tenant = scope.tenant if scope is not None else None
        if tenant is None or tenant.image_credentials_secret is None:
            return None
        name = tenant.image_credentials_secret
        found = await self._read_secret(self._secret_namespace, name)
        if found is None:
            raise ImageNotReady(
                f"{FIELD}: tenant {tenant.name}'s imageCredentialsSecret {name} is missing"
            )
        try:
            return netrc_line(found[0], request.reference.registry)
        except CredentialsError as exc:
            raise ImagePullFailed(f"{FIELD}: Secret {name}: {exc}") from None

    def _cached(self, record: ImageRecord, entry: Entry) -> CachedImage:
        settings = self.settings
        assert settings.image_cache_uid is not None
        node = PurePosixPath(entry.path)
        return CachedImage(
            id=f"{record.reference}@{entry.digest}",
            format=record.format,
            node_path=node,
            operator_path=operator_path(settings, node),
            sha256=entry.sha256,
            size=entry.size,
            inode=entry.inode,
            ctime_ns=entry.ctime_ns,
            owner_uid=settings.image_cache_uid,
            mode=0o444 if record.tenant is None else 0o440,
        )


def _bound_entry(record: ImageRecord | None, uid: str) -> Entry | None:
    """The entry of the digest SlurmJob `uid` was bound to, if the record still has it."""
    if record is None:
        return None
    digest = next((u.digest for u in record.users if u.uid == uid), None)
    if digest is None:
        return None
    for entry in (record.entry, *record.retired):
        if entry is not None and entry.digest == digest:
            return entry
    return None
