"""The import job as slurmrestd receives it: the operator's own script
(`templates/image/import.sh.j2`) and its job description, from the site's settings and the
operator's record only.

The job runs as the cache user on the site's CPU partition with the site's CPUs, memory, time
limit and node-local temp directory; its output goes to the cache's `logs/`. The values that
reach the script are the parsed reference's parts and names built by `layout`: every one is a
checked word, and the template quotes each again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from slurmjob_operator.config import Settings
from slurmjob_operator.core.launch import JobComponent, LaunchRequest
from slurmjob_operator.imagecache.layout import CacheLayout
from slurmjob_operator.imagecache.record import ImageRecord, ImportAttempt
from slurmjob_operator.site.catalogs import PROFILE_FORMAT
from slurmjob_operator.site.templating import environment

TEMPLATE = "image/import.sh.j2"
#: What an import job's comment starts with: the record it serves (for people and `doctor`).
COMMENT_PREFIX = "slurmjob-image:"


def node_cache_root(settings: Settings) -> PurePosixPath:
    """The cache as the compute nodes see it."""
    if settings.slurm_image_cache_root is not None:
        return PurePosixPath(settings.slurm_image_cache_root)
    assert settings.image_cache_root is not None  # Settings: images need it
    return PurePosixPath(settings.image_cache_root)


def layout_for(settings: Settings) -> CacheLayout:
    """The cache's layout, in the nodes' paths (what the record and the scripts name)."""
    return CacheLayout(node_cache_root(settings))


def operator_path(settings: Settings, node_path: PurePosixPath | str) -> Path:
    """A path of the cache as the operator sees it (its read-only mount)."""
    assert settings.image_cache_root is not None
    relative = PurePosixPath(node_path).relative_to(node_cache_root(settings))
    if ".." in relative.parts:
        raise ValueError(f"{node_path} is not under the image cache")
    return settings.image_cache_root / relative


def cache_user_job(
    settings: Settings,
    template: str,
    name: str,
    comment: str,
    pool: str,
    values: Mapping[str, object],
    *,
    cpus: int | None = None,
    memory_mb: int | None = None,
    time_minutes: int | None = None,
) -> LaunchRequest:
    """A job the cache user runs (an import, a sweep, a verification) on the import
    partition and account: `template` rendered with `values`, the job's name and PATH; one
    node of `pool` with the imports' CPUs, memory and time limit unless given; started in the
    node's temp directory, its output in the cache's `logs/<name>.log`."""
    script = (
        environment(settings)
        .get_template(template)
        .render(job_path=settings.slurm_job_path, job_name=name, **values)
    )
    log = str(layout_for(settings).log_path(name))
    return LaunchRequest(
        job_name=name,
        comment=comment,
        script=script,
        working_directory=settings.image_import_tmp,
        standard_output=log,
        standard_error=log,
        environment={"PATH": settings.slurm_job_path},
        components=[
            JobComponent(
                pool=pool,
                nodes=1,
                cpus_per_task=settings.image_import_cpus if cpus is None else cpus,
                memory_mb=settings.image_import_memory_mb if memory_mb is None else memory_mb,
            )
        ],
        partition=settings.image_import_partition,
        account=settings.image_import_account,
        time_limit_minutes=(
            settings.image_import_time_minutes if time_minutes is None else time_minutes
        ),
    )


@dataclass(frozen=True)
class ImportScript:
    """One import attempt's job description and the credentials file it reads (None: an
    anonymous pull), as the nodes see that file."""

    launch: LaunchRequest
    credentials: PurePosixPath | None


def render_import(
    settings: Settings,
    record: ImageRecord,
    attempt: ImportAttempt,
    credentials: PurePosixPath | None = None,
    reader_uid: int | None = None,
) -> ImportScript:
    """The import job of `attempt` for `record`; `reader_uid`: the tenant's uid a private
    image (pulled with its credentials) is readable by, besides the cache user."""
    profile = settings.slurm_runtime_profile
    if PROFILE_FORMAT[profile] is not record.format:
        raise ValueError(
            f"record {record.key} is {record.format.value}, this cluster's profile "
            f"{profile.value} runs {PROFILE_FORMAT[profile].value}"
        )
    reference = record.parsed_reference
    values = {
        "reference": reference.canonical,
        "registry": reference.registry,
        "repository": reference.repository,
        "tag": reference.tag or "",
        "digest": reference.digest or "",
        "format": record.format.value,
        "profile": profile.value,
        "scope": record.scope,
        "cache_root": str(layout_for(settings).root),
        "node_tmp": settings.image_import_tmp,
        "credentials": str(credentials) if credentials is not None else "",
        "ca_file": settings.image_import_ca_file or "",
        "reader_uid": str(reader_uid) if reader_uid is not None else "",
    }
    comment = f"{COMMENT_PREFIX}{record.key}"
    launch = cache_user_job(settings, TEMPLATE, attempt.job_name, comment, "import", values)
    return ImportScript(launch, credentials)


SWEEP_TEMPLATE = "image/sweep.sh.j2"
#: A housekeeping job's time limit: it deletes, lists and stats; it never reads an image.
SWEEP_TIME_MINUTES = 15


def render_sweep(
    settings: Settings,
    job_name: str,
    delete_list: PurePosixPath,
    keep_list: PurePosixPath,
    decided_at: int,
) -> LaunchRequest:
    """The housekeeping job `job_name` (`templates/image/sweep.sh.j2`): it deletes the entries
    of `delete_list` and checks those of `keep_list` (files staged for it, in the nodes'
    paths); an import directory older than an import may run is a dead import's. An entry
    published at or after `decided_at` (Unix seconds) is kept: an import since made it."""
    grace = settings.image_import_time_minutes + SWEEP_TIME_MINUTES
    values = {
        "cache_root": str(layout_for(settings).root),
        "delete_list": str(delete_list),
        "keep_list": str(keep_list),
        "grace_minutes": str(grace),
        "decided_at": str(decided_at),
    }
    comment = f"{COMMENT_PREFIX}sweep"
    return cache_user_job(
        settings,
        SWEEP_TEMPLATE,
        job_name,
        comment,
        "sweep",
        values,
        cpus=1,
        memory_mb=256,
        time_minutes=SWEEP_TIME_MINUTES,
    )
