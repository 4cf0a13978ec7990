"""The checks of what the operator reads and writes below the storage root: the root itself
and the runtime artifacts every job runs in."""

from __future__ import annotations

import asyncio
import tempfile

from slurmjob_operator.config import Settings
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.site.artifacts import ArtifactError, artifact_path, verify_artifact
from slurmjob_operator.site.catalogs import PROFILE_FORMAT, RuntimeRegistry


def check_storage(settings: Settings, report: Report) -> None:
    root = settings.storage_root
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".slurmjob-doctor-"):
            pass
    except OSError as exc:
        report.add(
            "storage root",
            Outcome.FAIL,
            f"{root} is not writable: {exc.strerror} (SLURMJOB_STORAGE_ROOT: the shared "
            "filesystem's mount in this pod)",
        )
        return
    detail = f"{root} is writable"
    if settings.slurm_storage_root:
        detail += f"; the cluster sees it as {settings.slurm_storage_root}"
    report.add("storage root", Outcome.OK, detail)


async def check_runtimes(settings: Settings, registry: RuntimeRegistry, report: Report) -> None:
    if not registry.runtimes:
        report.add("runtimes", Outcome.WARN, "the runtime registry lists no runtime")
        return
    wanted = PROFILE_FORMAT[settings.slurm_runtime_profile]
    for runtime in registry.runtimes:
        name = f"runtime {runtime.id}"
        if runtime.format is not wanted:
            report.add(
                name,
                Outcome.WARN,
                f"format {runtime.format.value} does not match the "
                f"{settings.slurm_runtime_profile.value} profile ({wanted.value}): jobs using it "
                "are refused",
            )
            continue
        try:
            path = artifact_path(settings, runtime)
            await asyncio.to_thread(verify_artifact, path, runtime)
        except ArtifactError as exc:
            report.add(name, Outcome.FAIL, f"{exc} (its entry in SLURMJOB_RUNTIME_REGISTRY_FILE)")
        else:
            report.add(name, Outcome.OK, f"{path}: {runtime.format.value}, sha256 verified")
