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
from datetime import datetime
from pathlib import Path, PurePosixPath

from slurmjob_operator.config import Settings
from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.imagecache.attempts import ImportJob
from slurmjob_operator.imagecache.importer import Importer, read_result
from slurmjob_operator.imagecache.record import ImportAttempt
from slurmjob_operator.imagecache.script import cache_user_job, node_cache_root
from slurmjob_operator.imagecache.verifydecide import FileSeen, VerifyRequest
from slurmjob_operator.imagecache.verifyrecord import (
    MAX_RESULT_BYTES,
    ArtifactRecord,
    VerifyResult,
    parse_verify_result,
    verify_result_path,
)
from slurmjob_operator.site.artifacts import ARTIFACT_MAGIC, node_path
from slurmjob_operator.site.catalogs import RuntimeArtifact

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
    values = {
        "artifact": str(artifact),
        "artifact_dir": str(artifact.parent),
        "sha256": record.sha256,
        "format": record.format.value,
        "magic": magic,
        "magic_offset": offset,
        "cache_root": str(node_cache_root(settings)),
        "cache_uid": settings.image_cache_uid,
    }
    comment = f"{COMMENT_PREFIX}{record.key}"
    return cache_user_job(settings, TEMPLATE, name, comment, "verify", values)


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
    """Submits and follows verification jobs as the cache user; `importer` lends its client
    and lookups (the same user, fencing window and normalisation of a job's state) and its
    reading of a log."""

    def __init__(self, settings: Settings, importer: Importer) -> None:
        self.settings = settings
        self._importer = importer

    async def submit(self, record: ArtifactRecord, attempt: ImportAttempt) -> int:
        """Submit the job; its id. SlurmError (ambiguous or not) propagates: the record keeps
        the attempt write-ahead and the job is looked up by its name."""
        launch = render_verify(self.settings, record, attempt)
        client = await self._importer.client()
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
        return read_result(self.settings, node, parse_verify_result, MAX_RESULT_BYTES, 32)

    def log_tail(self, attempt: ImportAttempt) -> str:
        """The end of the job's log (blocking), or '' when it cannot be read."""
        return self._importer.log_tail(attempt)
