"""The verification jobs' edge: the script (`templates/image/verify.sh.j2`) and its job
description, the submit through slurmrestd as the cache user, the lookups by id and by name
(the import jobs' own, `Importer.find` and `Importer.state`), the result file and the log read
from the cache without following a link, as files of the cache user only, and the operator's
`lstat` of the artifact on its storage mount.

The job runs as the cache user on the import partition with the imports' CPUs, memory, time
limit and account; its output goes to the cache's `logs/`. It needs no staging directory: it
reads no credentials and the script travels in the job description.
"""

from __future__ import annotations

import stat
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path, PurePosixPath

from slurmjob_operator.config import Settings
from slurmjob_operator.core.launch import JobComponent, LaunchRequest
from slurmjob_operator.imagecache.decide import ImportJob
from slurmjob_operator.imagecache.importer import LOG_TAIL_BYTES, LOG_TAIL_LINES, Importer
from slurmjob_operator.imagecache.record import ImportAttempt
from slurmjob_operator.imagecache.script import layout_for, node_cache_root, operator_path
from slurmjob_operator.imagecache.verifydecide import FileSeen, VerifyRequest
from slurmjob_operator.imagecache.verifyrecord import (
    MAX_RESULT_BYTES,
    ArtifactRecord,
    VerifyResult,
    VerifyResultError,
    parse_verify_result,
    verify_result_path,
)
from slurmjob_operator.site.artifacts import ARTIFACT_MAGIC, node_path
from slurmjob_operator.site.catalogs import RuntimeArtifact
from slurmjob_operator.site.templating import environment
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.storage.logs import read_tail
from slurmjob_operator.storage.nofollow import UnsafePath

TEMPLATE = "image/verify.sh.j2"
#: What a verification job's comment starts with: the record it serves (for people, doctor).
COMMENT_PREFIX = "slurmjob-verify:"


def verify_request(settings: Settings, runtime: RuntimeArtifact) -> VerifyRequest:
    """What verifying `runtime` on this cluster means: its id, the registry's sha256, its
    path as the nodes see it and its format."""
    return VerifyRequest(
        runtime_id=runtime.id,
        sha256=runtime.sha256,
        path=str(node_path(settings, runtime)),
        format=runtime.format,
    )


def artifact_operator_path(settings: Settings, runtime: RuntimeArtifact) -> Path:
    """The artifact as the operator sees it (its storage mount), not resolved: a link at the
    path is the operator's to refuse, never to follow."""
    return settings.storage_root / runtime.path


def render_verify(
    settings: Settings, record: ArtifactRecord, attempt: ImportAttempt
) -> LaunchRequest:
    """The verification job of `attempt` for `record`."""
    assert settings.image_cache_uid is not None  # Settings: verification needs it
    offset, magic = ARTIFACT_MAGIC[record.format]
    artifact = PurePosixPath(record.path)
    name = attempt.job_name
    script = (
        environment(settings)
        .get_template(TEMPLATE)
        .render(
            job_path=settings.slurm_job_path,
            job_name=name,
            artifact=str(artifact),
            artifact_dir=str(artifact.parent),
            sha256=record.sha256,
            format=record.format.value,
            magic=magic,
            magic_offset=offset,
            cache_root=str(node_cache_root(settings)),
            cache_uid=settings.image_cache_uid,
        )
    )
    log = str(layout_for(settings).log_path(name))
    return LaunchRequest(
        job_name=name,
        comment=f"{COMMENT_PREFIX}{record.key}",
        script=script,
        working_directory=settings.image_import_tmp,
        standard_output=log,
        standard_error=log,
        environment={"PATH": settings.slurm_job_path},
        components=[
            JobComponent(
                pool="verify",
                nodes=1,
                cpus_per_task=settings.image_import_cpus,
                memory_mb=settings.image_import_memory_mb,
            )
        ],
        partition=settings.image_import_partition,
        account=settings.image_import_account,
        time_limit_minutes=settings.image_import_time_minutes,
    )


def observe(path: Path) -> FileSeen | None:
    """The artifact as the operator's `lstat` shows it (blocking); None when it is gone or
    cannot be looked at. A link is seen as what it is, never followed."""
    try:
        info = path.lstat()
    except OSError:
        return None
    return FileSeen(
        regular=stat.S_ISREG(info.st_mode),
        uid=info.st_uid,
        mode=stat.S_IMODE(info.st_mode),
        size=info.st_size,
        inode=info.st_ino,
        ctime_ns=info.st_ctime_ns,
    )


class Verifier:
    """Submits and follows verification jobs as the cache user; `importer` lends its
    lookups (the same user, fencing window and normalisation of a job's state)."""

    def __init__(
        self,
        settings: Settings,
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]],
        importer: Importer,
    ) -> None:
        self.settings = settings
        self._slurm_as = slurm_as
        self._importer = importer

    async def submit(self, record: ArtifactRecord, attempt: ImportAttempt) -> int:
        """Submit the job; its id. SlurmError (ambiguous or not) propagates: the record keeps
        the attempt write-ahead and the job is looked up by its name."""
        launch = render_verify(self.settings, record, attempt)
        client = await self._slurm_as(self.settings.image_cache_user)
        receipt = await client.submit(launch)
        return int(receipt.job_id)

    async def find(self, attempt: ImportAttempt, now: datetime) -> ImportJob:
        return await self._importer.find(attempt, now)

    async def state(self, attempt: ImportAttempt) -> ImportJob:
        return await self._importer.state(attempt)

    def result(self, attempt: ImportAttempt) -> VerifyResult | None:
        """The attempt's result file (blocking); None when it is missing or unusable (the
        decision then fails the attempt with the reason)."""
        node = verify_result_path(node_cache_root(self.settings), attempt.job_name)
        try:
            tail = read_tail(
                operator_path(self.settings, node),
                root=self._root(),
                owner=self._owner(),
                max_bytes=MAX_RESULT_BYTES + 1,
                max_lines=32,
            )
        except (UnsafePath, OSError):
            return None
        if tail is None or tail.truncated:
            return None
        try:
            return parse_verify_result(tail.tail.encode())
        except VerifyResultError:
            return None

    def log_tail(self, attempt: ImportAttempt) -> str:
        """The end of the job's log (blocking), or '' when it cannot be read."""
        node = layout_for(self.settings).log_path(attempt.job_name)
        try:
            tail = read_tail(
                operator_path(self.settings, node),
                root=self._root(),
                owner=self._owner(),
                max_bytes=LOG_TAIL_BYTES,
                max_lines=LOG_TAIL_LINES,
            )
        except (UnsafePath, OSError):
            return ""
        return tail.tail if tail is not None else ""

    def _root(self) -> Path:
        assert self.settings.image_cache_root is not None
        return self.settings.image_cache_root

    def _owner(self) -> int:
        assert self.settings.image_cache_uid is not None
        return self.settings.image_cache_uid
