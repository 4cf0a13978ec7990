"""Where a SlurmJob that names a runtimeId waits until its artifact is verified, where the
site verifies registry artifacts (SLURMJOB_ARTIFACT_VERIFY_JOBS, docs/images.md).

Called by the submit's checks (controller/checks.py) once the spec resolved to a registry
artifact: it says `ArtifactNotVerified` (the SlurmJob stays Pending, `ImageReady=False`,
reason `ArtifactVerifying`, the verification job's id in the message) while the job runs,
`ArtifactVerifyFailed` when it failed for good (the reason and the end of its log), and
otherwise gives the artifact with what its job recorded (`site.artifacts.VerifiedArtifact`),
built from the operator's record only: a SlurmJob's status is never read here.

Every call compares the record with what the operator's `lstat` shows: a file replaced,
touched or gone since its verification is verified again (`verifydecide`), never passed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import PurePosixPath

from slurmjob_operator.config import Settings
from slurmjob_operator.core.absence import Window
from slurmjob_operator.imagecache.attempts import ImportJob, JobState, submitted
from slurmjob_operator.imagecache.importer import Importer
from slurmjob_operator.imagecache.verifydecide import (
    AdoptVerify,
    SubmitVerify,
    Verified,
    VerifyFailed,
    VerifyLater,
    VerifyPolicy,
    WaitVerify,
    decide_verify,
)
from slurmjob_operator.imagecache.verifyjob import (
    Verifier,
    artifact_operator_path,
    observe,
    verify_request,
)
from slurmjob_operator.imagecache.verifyrecord import (
    ArtifactRecord,
    VerifiedFile,
    VerifyResult,
)
from slurmjob_operator.imagecache.verifystore import ArtifactRecordStore
from slurmjob_operator.kube.ports import ConfigMapStore
from slurmjob_operator.servingcert import operator_namespace
from slurmjob_operator.site.artifacts import VerifiedArtifact
from slurmjob_operator.site.catalogs import RuntimeArtifact
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

#: Decisions in one pass (submit, then look at what it did): a bound on the loop, not a wait.
MAX_STEPS = 4


class ArtifactNotVerified(RuntimeError):
    """The verification job runs (or waits to be retried): the SlurmJob waits."""


class ArtifactVerifyFailed(RuntimeError):
    """The verification failed for good: the SlurmJob fails, nothing of it was submitted."""


class ArtifactGate:
    def __init__(
        self,
        settings: Settings,
        store: ArtifactRecordStore,
        verifier: Verifier,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        assert settings.image_cache_uid is not None  # Settings: verification needs it
        self.settings = settings
        self._store = store
        self._verifier = verifier
        self._clock = clock
        self.policy = VerifyPolicy(
            cache_uid=settings.image_cache_uid,
            max_retries=settings.image_import_retries,
            backoff_seconds=max(30.0, settings.poll_interval * 3),
        )

    async def verified(self, runtime: RuntimeArtifact) -> VerifiedArtifact:
        """`runtime` as its verification job recorded it; see the module docstring for what
        is raised meanwhile."""
        request = verify_request(self.settings, runtime)
        where = artifact_operator_path(self.settings, runtime)
        async with self._store.lock(request.key):
            stored = await self._store.read(request.key)
            record = stored
            job: ImportJob | None = None
            result: VerifyResult | None = None
            for _ in range(MAX_STEPS):
                now = self._clock()
                seen = await asyncio.to_thread(observe, where)
                action = decide_verify(request, record, now, self.policy, seen, job, result)
                record = action.record
                if isinstance(action, SubmitVerify):
                    if action.why:
                        log.warning("runtime %s (%s): %s", runtime.id, where, action.why)
                    record = await self._submit(record, action)
                    stored, job, result = record, None, None
                    continue
                if isinstance(action, AdoptVerify | WaitVerify) and job is None:
                    job, result = await self._look(action, record, now)
                    if job.job_id is not None or job.state is not JobState.PENDING:
                        continue  # decide again with what was found
                if record != stored:
                    await self._store.write(record)
                    stored = record
                if isinstance(action, Verified):
                    return self._artifact(runtime, record, action.file)
                if isinstance(action, VerifyFailed):
                    raise ArtifactVerifyFailed(action.message + await self._tail(record))
                if isinstance(action, VerifyLater):
                    failure = record.failure
                    why = f" ({failure.reason}: {failure.message})" if failure else ""
                    raise ArtifactNotVerified(
                        f"runtime {runtime.id}: its verification is tried again at "
                        f"{action.at.isoformat()}{why}"
                    )
                shown = f"job {action.job_id}" if isinstance(action, WaitVerify) else "a job"
                raise ArtifactNotVerified(
                    f"runtime {runtime.id} ({request.path}) is being verified by {shown} of "
                    f"the cache user on partition {self.settings.image_import_partition}"
                )
            raise ArtifactNotVerified(f"runtime {runtime.id}: its verification is on its way")

    async def _submit(self, record: ArtifactRecord, action: SubmitVerify) -> ArtifactRecord:
        """Write the record's write-ahead, send the job, record its id."""
        await self._store.write(record)  # the write-ahead, before the POST
        try:
            job_id = await self._verifier.submit(record, action.attempt)
        except SlurmError as exc:
            # Unconfirmed: the next pass looks the job up by its name.
            raise ArtifactNotVerified(
                f"runtime {record.runtime_id}: the verification job's submit is unconfirmed ({exc})"
            ) from exc
        record = submitted(record, job_id)
        await self._store.write(record)
        return record

    async def _look(
        self, action: AdoptVerify | WaitVerify, record: ArtifactRecord, now: datetime
    ) -> tuple[ImportJob, VerifyResult | None]:
        attempt = record.attempt
        assert attempt is not None
        if isinstance(action, AdoptVerify):
            job = await self._verifier.find(attempt, now)
        else:
            job = await self._verifier.state(attempt)
        result = None
        if job.state not in (JobState.PENDING, JobState.RUNNING):
            result = await asyncio.to_thread(self._verifier.result, attempt)
        return job, result

    async def _tail(self, record: ArtifactRecord) -> str:
        attempt = record.attempt
        if attempt is None:
            return ""
        tail = await asyncio.to_thread(self._verifier.log_tail, attempt)
        return f"; the verification's log ends: {tail}" if tail else ""

    def _artifact(
        self, runtime: RuntimeArtifact, record: ArtifactRecord, file: VerifiedFile
    ) -> VerifiedArtifact:
        return VerifiedArtifact(
            runtime=runtime,
            node_path=PurePosixPath(record.path),
            operator_path=artifact_operator_path(self.settings, runtime),
            size=file.size,
            inode=file.inode,
            ctime_ns=file.ctime_ns,
            owner_uid=file.owner_uid,
            mode=file.mode,
            verified_by=file.job_name,
        )


def artifact_gate(
    settings: Settings,
    store: object,
    slurm_as: Callable[[str | None], Awaitable[SlurmClient]],
) -> ArtifactGate | None:
    """The cluster's gate (None: the site does not verify artifacts, or the store keeps no
    ConfigMaps, as the local runner's files do: every node then hashes in full)."""
    if not settings.artifact_verify_jobs:
        return None
    if not isinstance(store, ConfigMapStore):
        log.warning(
            "SLURMJOB_ARTIFACT_VERIFY_JOBS: this store keeps no records; every job's node "
            "hashes its runtime artifact in full"
        )
        return None
    window = Window(
        settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
    )
    verifier = Verifier(settings, Importer(settings, slurm_as, window))
    return ArtifactGate(
        settings, ArtifactRecordStore(store, operator_namespace(settings)), verifier
    )
