"""The import jobs' edge: submitted through slurmrestd as the cache user, looked up by id or
by their unique name, and their result and log read from the cache (the operator's read-only
mount) without following a link, as files of the cache user only.

A private image's credentials are written for that import only, as the runtime's credentials
file (one netrc line), mode 0600 in the import's own staging directory on the storage root,
readable by the cache user through an ACL (as a tenant's staging is); never in the script, the
job description, a record, a status or a log. The directory goes when the import ends.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TypeVar

from slurmjob_operator.config import Settings
from slurmjob_operator.core.absence import Window
from slurmjob_operator.core.jobview import ACTIVE_STATES, BaseState, SlurmJobView
from slurmjob_operator.core.launch import StagedFile
from slurmjob_operator.imagecache.attempts import ImportJob, JobState
from slurmjob_operator.imagecache.record import (
    MAX_RESULT_BYTES,
    ImageRecord,
    ImportAttempt,
    ImportResult,
    parse_result,
)
from slurmjob_operator.imagecache.resultfile import ResultFileError
from slurmjob_operator.imagecache.script import layout_for, operator_path, render_import
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound
from slurmjob_operator.storage.logs import read_tail
from slurmjob_operator.storage.nofollow import UnsafePath
from slurmjob_operator.storage.staging import remove_attempt, stage_attempt

IMPORTS_DIR = ".slurmjob-image-imports"
CREDENTIALS_FILE = "credentials"
SCRIPT_FILE = "job.sh"
#: Bytes of an import's log shown with its failure.
LOG_TAIL_BYTES = 4096
LOG_TAIL_LINES = 40
DOCKER_CONFIG_KEY = ".dockerconfigjson"

T = TypeVar("T")


class CredentialsError(ValueError):
    """A tenant's registry Secret cannot give credentials for a registry."""


def netrc_line(secret: Mapping[str, bytes], registry: str) -> bytes:
    """The credentials of `registry` in a dockerconfigjson Secret, as one netrc line."""
    raw = secret.get(DOCKER_CONFIG_KEY)
    if raw is None:
        raise CredentialsError(f"the Secret has no {DOCKER_CONFIG_KEY} key")
    try:
        auths = json.loads(raw).get("auths", {})
        entry = auths.get(registry) or auths.get(f"https://{registry}") or {}
        user, password = entry.get("username"), entry.get("password")
        if (user is None or password is None) and "auth" in entry:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
    except (ValueError, AttributeError, binascii.Error, UnicodeDecodeError):
        raise CredentialsError(f"the Secret's {DOCKER_CONFIG_KEY} is not a Docker config") from None
    if not isinstance(user, str) or not isinstance(password, str) or not user or not password:
        raise CredentialsError(f"the Secret has no username and password for {registry}")
    for word in (user, password):
        if any(c.isspace() or not c.isprintable() for c in word):
            raise CredentialsError("a username or password with blanks cannot be a netrc word")
    # netrc names a host, without its port (curl and Enroot match the host alone).
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    return f"machine {host} login {user} password {password}\n".encode()


def staging_dir(settings: Settings, job_name: str) -> Path:
    return settings.storage_root / IMPORTS_DIR / job_name / "attempt-1"


class Importer:
    def __init__(
        self,
        settings: Settings,
        slurm_as: Callable[[str | None], Awaitable[SlurmClient]],
        window: Window,
    ) -> None:
        self.settings = settings
        self._slurm_as = slurm_as
        self._window = window

    async def client(self) -> SlurmClient:
        return await self._slurm_as(self.settings.image_cache_user)

    async def submit(
        self,
        record: ImageRecord,
        attempt: ImportAttempt,
        credentials: bytes | None,
        reader_uid: int | None = None,
    ) -> int:
        """Stage the import's files and submit its job; the job id. SlurmError (ambiguous or
        not) propagates: the record keeps the attempt write-ahead and it is looked up by name."""
        settings = self.settings
        where = staging_dir(settings, attempt.job_name)
        node_credentials = (
            PurePosixPath(settings.to_cluster_path(where / CREDENTIALS_FILE))
            if credentials is not None
            else None
        )
        script = render_import(settings, record, attempt, node_credentials, reader_uid)
        files = {SCRIPT_FILE: StagedFile(script.launch.script.encode(), 0o500)}
        if credentials is not None:
            files[CREDENTIALS_FILE] = StagedFile(credentials, 0o400)
        await asyncio.to_thread(
            stage_attempt, settings, where, files, job_uid=settings.image_cache_uid
        )
        client = await self.client()
        receipt = await client.submit(script.launch)
        return int(receipt.job_id)

    async def find(self, attempt: ImportAttempt, now: datetime) -> ImportJob:
        """The write-ahead attempt's job, by its unique name: adopted when found, ABSENT once
        the fencing window has passed without it (an import sent twice costs a CPU node's
        time, never a pull: the second finds the entry under its lock)."""
        client = await self.client()
        found = await client.find_by_name(attempt.job_name)
        if found:
            return _job(attempt.job_name, found[0])
        waited = (now - attempt.submitted_at).total_seconds()
        if waited > self._window.seconds:
            return ImportJob(attempt.job_name, JobState.ABSENT)
        return ImportJob(attempt.job_name, JobState.PENDING)

    async def state(self, attempt: ImportAttempt) -> ImportJob:
        assert attempt.job_id is not None
        client = await self.client()
        try:
            views = await client.get_job(int(attempt.job_id))
        except SlurmNotFound:
            views = []
        if not views:
            try:
                views = await client.get_job_accounting(int(attempt.job_id))
            except SlurmError:  # no accounting here: the job is gone either way
                views = []
        if not views:
            return ImportJob(attempt.job_name, JobState.ABSENT, int(attempt.job_id))
        return _job(attempt.job_name, views[-1])

    def result(self, attempt: ImportAttempt) -> ImportResult | None:
        """The attempt's result file (blocking); None when it is missing or unusable (the
        decision then fails the attempt with the reason)."""
        node = layout_for(self.settings).result_path(attempt.job_name)
        return read_result(self.settings, node, parse_result, MAX_RESULT_BYTES, 64)

    def log_tail(self, attempt: ImportAttempt, hidden: Collection[str] = ()) -> str:
        """The end of the import's log (blocking) with `hidden` redacted, or '' when it cannot
        be read."""
        path = operator_path(self.settings, layout_for(self.settings).log_path(attempt.job_name))
        try:
            tail = read_tail(
                path,
                root=_cache_root(self.settings),
                owner=_cache_uid(self.settings),
                max_bytes=LOG_TAIL_BYTES,
                max_lines=LOG_TAIL_LINES,
                redact=hidden,
            )
        except (UnsafePath, OSError):
            return ""
        return tail.tail if tail is not None else ""

    def clean(self, attempt: ImportAttempt) -> None:
        """Remove the attempt's staging directory (its credentials) once it ended (blocking)."""
        remove_attempt(self.settings, staging_dir(self.settings, attempt.job_name))


def read_result(
    settings: Settings,
    node: PurePosixPath,
    parse: Callable[[bytes], T],
    max_bytes: int,
    max_lines: int,
) -> T | None:
    """A job's result file in the cache (`node`, the nodes' path), parsed (blocking); None
    when it is missing, not the cache user's plain file, longer than `max_bytes` or
    unusable: the decision then fails the attempt with the reason."""
    try:
        tail = read_tail(
            operator_path(settings, node),
            root=_cache_root(settings),
            owner=_cache_uid(settings),
            max_bytes=max_bytes + 1,
            max_lines=max_lines,
        )
    except (UnsafePath, OSError):
        return None
    if tail is None or tail.truncated:
        return None
    try:
        return parse(tail.tail.encode())
    except ResultFileError:
        return None


def _cache_root(settings: Settings) -> Path:
    assert settings.image_cache_root is not None
    return settings.image_cache_root


def _cache_uid(settings: Settings) -> int:
    assert settings.image_cache_uid is not None
    return settings.image_cache_uid


def _job(name: str, view: SlurmJobView) -> ImportJob:
    state = view.base_state
    if state is None or state in ACTIVE_STATES or not view.is_final:
        running = state in (BaseState.RUNNING, BaseState.SUSPENDED)
        return ImportJob(name, JobState.RUNNING if running else JobState.PENDING, view.job_id)
    code = view.exit.return_code if view.exit.signal in (None, 0) else None
    if state is BaseState.COMPLETED:
        return ImportJob(name, JobState.COMPLETED, view.job_id, code)
    return ImportJob(name, JobState.FAILED, view.job_id, code)
