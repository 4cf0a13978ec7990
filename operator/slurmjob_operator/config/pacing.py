"""The pace of the work loops in `Settings`: how often jobs are polled and deletions retried,
how much runs at once, and how much of each log tail a status keeps."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class PacingSettings(BaseSettings):
    """A part of `Settings`, never read alone: intervals, concurrency and status size."""

    poll_interval: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two polls of slurmrestd for every tracked job.",
    )
    ttl_after_finished_default: int | None = Field(
        default=None,
        ge=0,
        le=366 * 24 * 3600,
        description=(
            "Seconds after it finished when a SlurmJob without spec.ttlSecondsAfterFinished is "
            "deleted; unset: never."
        ),
    )
    ttl_after_finished_max: int | None = Field(
        default=None,
        ge=0,
        le=366 * 24 * 3600,
        description=(
            "The longest a finished SlurmJob is kept: a larger spec.ttlSecondsAfterFinished "
            "counts as this; unset: no maximum (a SlurmJob without a TTL is still kept)."
        ),
    )
    delete_timeout: float = Field(
        default=120.0,
        gt=0,
        description="Seconds a deletion waits for a cancelled job to end before trying again.",
    )
    submit_concurrency: int = Field(
        default=16,
        ge=1,
        le=256,
        description=(
            "Submissions (render, stage, POST) in progress at once; the waiting ones are served "
            "round-robin across namespaces."
        ),
    )
    refresh_concurrency: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Status refreshes (apiserver read and patch) in progress at once in a poll.",
    )
    log_refresh: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds between two log-tail refreshes of a running job (a state change, and the "
            "job's end, always refresh them)."
        ),
    )
    status_tail_bytes: int = Field(
        default=8192,
        ge=256,
        le=65536,
        description=(
            "Bytes of each log tail (stdout, stderr) kept in the status: the last whole lines "
            "of the 64 KiB the log reader takes (the retry rules' patterns see all of that). "
            "Every status is stored in etcd with each revision, so this bounds a SlurmJob's "
            "size there."
        ),
    )
    watch_page_size: int = Field(
        default=500,
        ge=0,
        le=100_000,
        description=(
            "SlurmJobs per page of the watch's first list (at start and after a watch "
            "expires); 0 reads the whole list in one answer. Paging keeps the start-up burst's "
            "memory from being pinned for the process's life."
        ),
    )
    worker_idle_timeout: float = Field(
        default=0.5,
        gt=0,
        le=300,
        description=(
            "Seconds a resource's event worker stays after its last event; a short one lets "
            "a burst's per-object tasks and queues go at once."
        ),
    )
    memory_trim_interval: float = Field(
        default=30.0,
        ge=0,
        description=(
            "Seconds between two returns of the allocator's free memory to the system "
            "(jemalloc's purge where jemalloc is the process's malloc, as the image preloads "
            "it, else glibc's malloc_trim; the image runs with PYTHONMALLOC=malloc so that "
            "Python's objects are in that heap); 0 never trims."
        ),
    )
