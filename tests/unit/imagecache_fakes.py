"""Stand-ins for the image cache's gates (test_imagecache_gate.py, test_imagecache_gate_metrics.py,
test_imagecache_verify_gate.py): a clock, an in-memory ConfigMap store, and the cache user's
jobs kept in a dict, ended by the test."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Generic, TypeVar

from slurmjob_operator.config import Settings
from slurmjob_operator.imagecache.attempts import ImportJob, JobState
from slurmjob_operator.imagecache.record import ImageRecord, ImportAttempt, ImportResult
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.slurm.errors import SlurmAmbiguous

DIGEST = "sha256:" + "cd" * 32
IMAGE = "127.0.0.1:5000/slurmjob/base:1"

R = TypeVar("R")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


class ConfigMaps:
    """The operator's ConfigMaps, read whole and merged key by key; `writes` counts merges."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, str]] = {}
        self.writes = 0

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        return dict(self.maps[name]) if name in self.maps else None

    async def merge_configmap(
        self, namespace: str, name: str, data: Mapping[str, str | None]
    ) -> None:
        self.writes += 1
        current = self.maps.setdefault(name, {})
        for key, value in data.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value


class ListedConfigMaps(ConfigMaps):
    """The apiserver's client also lists and deletes (the sweep, a forgotten entry)."""

    async def list_configmaps(self, namespace: str, prefix: str) -> dict[str, dict[str, str]]:
        return {k: dict(v) for k, v in self.maps.items() if k.startswith(prefix)}

    async def delete_configmap(self, namespace: str, name: str) -> None:
        self.maps.pop(name, None)


class FakeJobs(Generic[R]):
    """The cache user's jobs in a dict, numbered from 100; `lose_answer` loses the submit's
    answer (the job is there all the same), `end` ends one, `results` holds their results."""

    def __init__(self) -> None:
        self.jobs: dict[str, ImportJob] = {}
        self.results: dict[str, R] = {}
        self.lose_answer = False
        self.log = ""
        self.sent = 0

    def send(self, name: str) -> int:
        job_id = 100 + self.sent
        self.sent += 1
        self.jobs[name] = ImportJob(name, JobState.PENDING, job_id)
        if self.lose_answer:
            raise SlurmAmbiguous("the answer was lost")
        return job_id

    async def find(self, attempt: ImportAttempt, now: datetime) -> ImportJob:
        return self.jobs.get(attempt.job_name, ImportJob(attempt.job_name, JobState.ABSENT))

    async def state(self, attempt: ImportAttempt) -> ImportJob:
        return self.jobs[attempt.job_name]

    def result(self, attempt: ImportAttempt) -> R | None:
        return self.results.get(attempt.job_name)

    def end(self, name: str, code: int) -> None:
        job = self.jobs[name]
        state = JobState.COMPLETED if code == 0 else JobState.FAILED
        self.jobs[name] = ImportJob(name, state, job.job_id, code)


class FakeImporter(FakeJobs[ImportResult]):
    """Submits into a dict of jobs; a test ends a job with `finish`."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.submitted: list[tuple[str, bytes | None]] = []
        self.cleaned: list[str] = []
        self.readers: list[int | None] = []

    async def submit(
        self,
        record: ImageRecord,
        attempt: ImportAttempt,
        credentials: bytes | None,
        reader_uid: int | None = None,
    ) -> int:
        self.readers.append(reader_uid)
        self.submitted.append((attempt.job_name, credentials))
        return self.send(attempt.job_name)

    def log_tail(self, attempt: ImportAttempt, hidden: Collection[str] = ()) -> str:
        text = self.log
        for word in hidden:
            text = text.replace(word, "***")
        return text

    def clean(self, attempt: ImportAttempt) -> None:
        self.cleaned.append(attempt.job_name)

    def finish(self, name: str, digest: str = DIGEST, code: int = 0, scope: str = "public") -> None:
        self.end(name, code)
        if code == 0:
            self.results[name] = ImportResult(
                job=name,
                reference=IMAGE,
                format=ArtifactFormat.SQSH,
                platform="linux/amd64",
                digest=digest,
                sha256="12" * 32,
                size=4096,
                inode=77,
                ctime_ns=1_796_000_000_123_456_789,
            )


class InstantImporter(FakeImporter):
    """An import that has ended by the time its submit answers."""

    def send(self, name: str) -> int:
        job_id = super().send(name)
        self.finish(name)
        return job_id
