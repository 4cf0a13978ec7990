"""SLURMJOB_ARTIFACT_VERIFY_JOBS through the controller (in-memory store and Slurm, real files
for the runtime and the cache): a SlurmJob naming a runtimeId waits (`ImageReady=False`,
`ArtifactVerifying`) while one job of the cache user verifies its artifact, then runs with
`ImageReady=True`, `ArtifactVerified`, its script comparing the recorded stat line and
carrying no sha256; a second SlurmJob makes no second job; a failed verification fails the
SlurmJob with nothing of it submitted; with the setting off nothing changes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from slurmjob_operator.api.status import Phase, get_condition
from slurmjob_operator.core.naming import SCRIPT_FILE

from .controller_fakes import Bed, cpu_spec, make_bed
from .controller_fakes import reconcile_once as reconcile

#: The cache user: the test's own uid where it is not root (the files it writes are then its).
CACHE_UID = os.getuid() or 990
CACHE_USER = "slurmimg"


def _bed(tmp_path: Path, **extra: Any) -> Bed:
    key = tmp_path / "jwt.key"
    key.write_bytes(b"k" * 32)
    cache = tmp_path / "cache"
    (cache / "logs").mkdir(parents=True)
    values: dict[str, Any] = {
        "artifact_verify_jobs": True,
        "slurm_jwt_key_file": key,
        "image_cache_root": cache,
        "image_cache_user": CACHE_USER,
        "image_cache_uid": CACHE_UID,
        "image_import_partition": "cpu",
        "pod_namespace": "ops",
        **extra,
    }
    bed = make_bed(tmp_path, **values)
    artifact = bed.settings.storage_root / "runtimes" / "unit.sif"
    artifact.chmod(0o444)
    return bed


def _condition(bed: Bed, ref: Any, type_: str) -> tuple[str, str, str] | None:
    cond = get_condition(bed.store.status(ref).conditions, type_)
    return (cond.status, cond.reason, cond.message) if cond is not None else None


def _verify_jobs(bed: Bed) -> list[Any]:
    return [r for r in bed.slurm.requests if r.job_name.startswith("slurmjob-verify-")]


def _finish(bed: Bed, code: int = 0, log: str = "") -> str:
    """End the one verification job as its script would: a result of what `stat` sees."""
    (request,) = _verify_jobs(bed)
    (job,) = bed.slurm.named(request.job_name)
    cache = bed.settings.image_cache_root
    assert cache is not None
    if code == 0:
        artifact = bed.settings.storage_root / "runtimes" / "unit.sif"
        info = artifact.lstat()
        result = cache / "verify" / f"{request.job_name}.result"
        result.parent.mkdir(exist_ok=True)
        result.write_text(
            f"job={request.job_name}\nformat=sif\nsha256={_sha(artifact)}\n"
            f"size={info.st_size}\ninode={info.st_ino}\n"
            f"ctime={info.st_ctime_ns // 10**9}.{info.st_ctime_ns % 10**9:09d}\n"
            f"uid={info.st_uid}\nmode={info.st_mode & 0o7777:o}\n"
        )
        _own(result.parent, result)
    if log:
        written = cache / "logs" / f"{request.job_name}.log"
        written.write_text(log)
        _own(written.parent, written)
    bed.slurm.set_state(job.job_id, "COMPLETED" if code == 0 else "FAILED", code)
    return request.job_name


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _own(*paths: Path) -> None:
    """The cache user's, as its job leaves them (the operator reads only its files)."""
    for path in paths:
        os.chown(path, CACHE_UID, -1)


async def test_a_runtime_is_verified_once_then_run_with_the_cheap_check(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    ref = bed.store.create("train", cpu_spec())
    assert await reconcile(bed, ref) is not None  # waits: polled again
    status = bed.store.status(ref)
    assert status.phase is Phase.PENDING
    assert not status.attempts
    ready = _condition(bed, ref, "ImageReady")
    assert ready is not None
    assert ready[:2] == ("False", "ArtifactVerifying")
    assert "custom-sif" in ready[2]
    assert "job 100 of the cache user on partition cpu" in ready[2]
    (request,) = _verify_jobs(bed)
    assert bed.slurm.made_as(CACHE_USER).count("submit") == 1
    assert (request.partition, request.components[0].cpus_per_task) == ("cpu", 4)
    # Still running: the SlurmJob waits, nothing more is sent.
    assert await reconcile(bed, ref) is not None
    assert len(_verify_jobs(bed)) == 1

    name = _finish(bed)
    assert await reconcile(bed, ref) is None
    status = bed.store.status(ref)
    assert status.phase is Phase.QUEUED
    ready = _condition(bed, ref, "ImageReady")
    assert ready is not None
    assert ready[:2] == ("True", "ArtifactVerified")
    assert ready[2].startswith("runs runtime custom-sif, sha256 ")
    assert ready[2].endswith(f"verified by {name}")
    (attempt,) = status.attempts
    assert attempt.staging_dir is not None
    script = (Path(attempt.staging_dir) / SCRIPT_FILE).read_text()
    info = (bed.settings.storage_root / "runtimes" / "unit.sif").lstat()
    assert f"artifact_recorded='regular file {info.st_uid} 444 {info.st_size} {info.st_ino} " in (
        script
    )
    assert "artifact_sha256=''" in script

    second = bed.store.create("again", cpu_spec())
    assert await reconcile(bed, second) is None
    assert bed.store.status(second).phase is Phase.QUEUED
    assert len(_verify_jobs(bed)) == 1  # no second verification


async def test_a_touched_runtime_is_verified_again_before_it_runs(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    _finish(bed)
    assert await reconcile(bed, ref) is None
    artifact = bed.settings.storage_root / "runtimes" / "unit.sif"
    artifact.chmod(0o644)
    artifact.chmod(0o444)  # the same bytes and mode, a new ctime
    later = bed.store.create("later", cpu_spec())
    assert await reconcile(bed, later) is not None
    assert bed.store.status(later).phase is Phase.PENDING
    ready = _condition(bed, later, "ImageReady")
    assert ready is not None
    assert ready[1] == "ArtifactVerifying"
    assert len(_verify_jobs(bed)) == 2


async def test_a_failed_verification_fails_the_slurmjob_unsubmitted(tmp_path: Path) -> None:
    bed = _bed(tmp_path)
    ref = bed.store.create("train", cpu_spec())
    await reconcile(bed, ref)
    _finish(bed, code=77, log="slurmjob-verify: the artifact's directory has mode 777\n")
    assert await reconcile(bed, ref) is None
    status = bed.store.status(ref)
    assert status.phase is Phase.FAILED
    assert not status.attempts
    ready = _condition(bed, ref, "ImageReady")
    assert ready is not None
    assert ready[:2] == ("False", "ArtifactVerifyFailed")
    assert "ArtifactUnsafe" in ready[2]
    assert "has mode 777" in ready[2]
    assert _condition(bed, ref, "Failed") is not None
    assert bed.slurm.requests == _verify_jobs(bed)  # nothing of the SlurmJob was sent


async def test_with_the_setting_off_nothing_changes(tmp_path: Path) -> None:
    bed = make_bed(tmp_path)  # SLURMJOB_ARTIFACT_VERIFY_JOBS off: the default
    ref = bed.store.create("train", cpu_spec())
    assert await reconcile(bed, ref) is None
    status = bed.store.status(ref)
    assert status.phase is Phase.QUEUED
    assert _condition(bed, ref, "ImageReady") is None
    assert _verify_jobs(bed) == []
    (attempt,) = status.attempts
    assert attempt.staging_dir is not None
    script = (Path(attempt.staging_dir) / SCRIPT_FILE).read_text()
    artifact = bed.settings.storage_root / "runtimes" / "unit.sif"
    assert "artifact_recorded=''" in script
    assert f"artifact_sha256={_sha(artifact)}" in script
