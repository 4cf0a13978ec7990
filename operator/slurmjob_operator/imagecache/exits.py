"""The import script's exit codes (templates/image/import.sh.j2, sysexits.h numbers) and
what each says of a failed import: permanent (the waiting SlurmJobs fail) or transient
(retried per the site's policy). An exit without a code of the script's (a node failure, a
timeout, a cancel) and any code not listed is transient."""

from __future__ import annotations

from dataclasses import dataclass

from slurmjob_operator.imagecache.record import FailureKind

EXIT_OK = 0
EXIT_USAGE = 64  # permanent: the script was called wrongly (an operator bug)
EXIT_DATA = 65  # permanent: bad magic, no linux/amd64 manifest, checksum mismatch
EXIT_NOT_FOUND = 66  # permanent: unknown repository, tag or manifest
EXIT_UNAVAILABLE = 69  # transient: registry unreachable or answering 5xx
EXIT_CANT_CREATE = 73  # transient: the cache is full or refuses a file
EXIT_IO = 74  # transient: I/O error on the cache's filesystem
EXIT_TEMPORARY = 75  # transient: timeout, 429, the entry's lock not had in time
EXIT_DENIED = 77  # permanent: the registry said 401/403
EXIT_CONFIG = 78  # permanent: enroot/apptainer missing or misconfigured on the node


@dataclass(frozen=True)
class ExitClass:
    kind: FailureKind
    reason: str
    text: str


EXIT_CLASSES: dict[int, ExitClass] = {
    EXIT_USAGE: ExitClass(FailureKind.PERMANENT, "ImportUsage", "the import was misconfigured"),
    EXIT_DATA: ExitClass(FailureKind.PERMANENT, "BadImage", "the image is unusable"),
    EXIT_NOT_FOUND: ExitClass(FailureKind.PERMANENT, "ManifestUnknown", "no such image"),
    EXIT_UNAVAILABLE: ExitClass(
        FailureKind.TRANSIENT, "RegistryUnavailable", "the registry is unavailable"
    ),
    EXIT_CANT_CREATE: ExitClass(
        FailureKind.TRANSIENT, "CacheUnwritable", "the cache refused the image"
    ),
    EXIT_IO: ExitClass(FailureKind.TRANSIENT, "CacheIOError", "I/O error in the cache"),
    EXIT_TEMPORARY: ExitClass(FailureKind.TRANSIENT, "TemporaryFailure", "temporary failure"),
    EXIT_DENIED: ExitClass(FailureKind.PERMANENT, "AccessDenied", "the registry denied access"),
    EXIT_CONFIG: ExitClass(
        FailureKind.PERMANENT, "RuntimeMisconfigured", "the node's runtime is misconfigured"
    ),
}


def classify_exit(exit_code: int | None) -> ExitClass:
    """The class of an import job's failure by its exit code (None: no code of the
    script's, e.g. the node failed or the job was cancelled)."""
    if exit_code is None:
        return ExitClass(FailureKind.TRANSIENT, "ImportInterrupted", "the import job ended early")
    known = EXIT_CLASSES.get(exit_code)
    if known is not None:
        return known
    return ExitClass(FailureKind.TRANSIENT, "ImportFailed", f"exit code {exit_code}")
