"""Runtime artifacts (SQSH/SIF) on the shared storage: where they are and whether they are intact.

An artifact is checked before every submission: it must exist under the storage root, start
with its format's magic, be complete and hash to the registry's sha256. Anything else is
fatal: there is never a fallback to pulling an image from a registry, since that would move
the pull into the GPU allocation exactly when something is already wrong.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from slurmjob_operator.config import Settings
from slurmjob_operator.site.catalogs import (
    PROFILE_FORMAT,
    ArtifactFormat,
    CollectiveProbe,
    RuntimeArtifact,
)

CHUNK = 1024 * 1024

# SquashFS 4 superblock: little-endian magic "hsqs" at 0, major version (u16) at 28,
# bytes_used (u64: the size of the filesystem proper) at 40; 96 bytes in all.
SQSH_MAGIC = b"hsqs"
SQSH_SUPERBLOCK = 96
_SQSH_MAJOR = struct.Struct("<H")
_SQSH_BYTES_USED = struct.Struct("<Q")
# SIF: a 32-byte launch-script field, then "SIF_MAGIC".
SIF_MAGIC = b"SIF_MAGIC"
SIF_MAGIC_OFFSET = 32


@dataclass(frozen=True)
class CachedImage:
    """An image-cache entry as the batch script checks it (docs/images.md): the import job
    hashed it in full on a CPU node and recorded what the job's node now compares, which costs
    the same for any size. Built by the image cache from its own record, never from a status.
    """

    id: str
    """The reference and digest it was imported from, for messages."""
    format: ArtifactFormat
    node_path: PurePosixPath
    """The entry as the compute nodes see it."""
    operator_path: Path
    """The entry as the operator sees it (its read-only mount of the cache)."""
    sha256: str
    size: int
    inode: int
    ctime_ns: int
    """The ctime the import's node saw, in nanoseconds."""
    owner_uid: int
    mode: int = 0o444
    """0444, or 0440 for a tenant's private image (0400 and an ACL for the tenant's uid)."""
    probe: None = None
    """Cached images carry no collective probe (the runtime registry's entries may)."""

    @property
    def recorded(self) -> str:
        """What `stat -c '%F %u %a %s %i %.9Z'` prints for the entry on a job's node: a
        read-only regular file of the cache user, its size, inode and ctime unchanged."""
        return _stat_line(self.owner_uid, self.mode, self.size, self.inode, self.ctime_ns)


@dataclass(frozen=True)
class VerifiedArtifact:
    """A runtime-registry artifact its site verifies once (SLURMJOB_ARTIFACT_VERIFY_JOBS,
    docs/images.md): a job of the cache user hashed it in full on a CPU node and checked that
    only root and its owner can change it or its directory; the batch script then compares
    what `stat` prints, as for an image-cache entry. Built by the image cache from its own
    record of that job, never from a status."""

    runtime: RuntimeArtifact
    node_path: PurePosixPath
    operator_path: Path
    size: int
    inode: int
    ctime_ns: int
    owner_uid: int
    mode: int
    verified_by: str
    """The verification job's name, for messages."""

    @property
    def id(self) -> str:
        return self.runtime.id

    @property
    def format(self) -> ArtifactFormat:
        return self.runtime.format

    @property
    def sha256(self) -> str:
        return self.runtime.sha256

    @property
    def probe(self) -> CollectiveProbe | None:
        runtime = self.runtime  # the registry's entry: its probe is the site's program
        return runtime.probe

    @property
    def recorded(self) -> str:
        """What `stat -c '%F %u %a %s %i %.9Z'` prints for the artifact on a job's node."""
        return _stat_line(self.owner_uid, self.mode, self.size, self.inode, self.ctime_ns)


#: Whatever a job runs: a registry artifact, hashed in full or verified once, or a cache entry.
Artifact = RuntimeArtifact | CachedImage | VerifiedArtifact


def _stat_line(uid: int, mode: int, size: int, inode: int, ctime_ns: int) -> str:
    seconds, ns = divmod(ctime_ns, 1_000_000_000)
    ctime = f"{seconds}.{ns:09d}"  # as `stat -c %.9Z` prints it
    return f"regular file {uid} {mode:o} {size} {inode} {ctime}"


class ArtifactError(Exception):
    """The runtime artifact cannot be used; fatal for the submission, never retried around."""


class ArtifactChanged(ArtifactError):
    """A recorded file (an image-cache entry, a verified artifact) is gone or is not the file
    its job recorded: the caller may have it made ready again rather than fail."""


class _Key(NamedTuple):
    path: str
    size: int
    mtime_ns: int
    sha256: str


_verified: set[_Key] = set()
_lock = threading.Lock()


def clear_cache() -> None:
    """Forget every verified artifact (for tests, or after the registry changes)."""
    with _lock:
        _verified.clear()


#: Where each format's magic is, as the batch script checks it (offset, text).
ARTIFACT_MAGIC: dict[ArtifactFormat, tuple[int, str]] = {
    ArtifactFormat.SQSH: (0, SQSH_MAGIC.decode()),
    ArtifactFormat.SIF: (SIF_MAGIC_OFFSET, SIF_MAGIC.decode()),
}


def node_path(settings: Settings, artifact: Artifact) -> PurePosixPath:
    """The artifact as the compute nodes see it."""
    if isinstance(artifact, CachedImage | VerifiedArtifact):
        return artifact.node_path
    return PurePosixPath(settings.to_cluster_path(settings.storage_root / artifact.path))


def artifact_values(settings: Settings, artifact: Artifact) -> dict[str, object]:
    """What the batch script's artifact check reads (templates/job.sh.j2); ArtifactError when
    the artifact's format is not the one the cluster's runtime profile runs."""
    profile = settings.slurm_runtime_profile
    if PROFILE_FORMAT[profile] is not artifact.format:
        raise ArtifactError(
            f"runtime {artifact.id} is a {artifact.format.value} artifact; the "
            f"{profile.value} profile runs {PROFILE_FORMAT[profile].value} artifacts"
        )
    offset, magic = ARTIFACT_MAGIC[artifact.format]
    return {
        "artifact_path": node_path(settings, artifact),
        "artifact_format": artifact.format.value,
        # A verified artifact's script carries no hash to compare: its node cannot fall back
        # to hashing it (an empty expected hash fails), the stat line is the check.
        "artifact_sha256": "" if isinstance(artifact, VerifiedArtifact) else artifact.sha256,
        # A recorded stat line instead of the full hash, where a job of the cache user
        # hashed the file once; empty: the node hashes it.
        "artifact_recorded": (
            artifact.recorded if isinstance(artifact, CachedImage | VerifiedArtifact) else ""
        ),
        "artifact_magic": magic,
        "artifact_magic_offset": offset,
    }


def artifact_path(settings: Settings, artifact: RuntimeArtifact) -> Path:
    """The artifact's path under the storage root, as the operator sees it.

    Refuses a path that resolves outside the root, symlinks included.
    """
    root = settings.storage_root
    path = root / artifact.path
    real_root = root.resolve()
    real = path.resolve()
    if not real.is_relative_to(real_root):
        raise ArtifactError(
            f"runtime {artifact.id}: {path} resolves to {real}, outside the storage root "
            f"{real_root}"
        )
    return path


def _check_magic(path: Path, artifact: RuntimeArtifact, size: int) -> None:
    name = f"runtime {artifact.id}: {path}"
    if artifact.format is ArtifactFormat.SQSH:
        magic, offset, need, kind = SQSH_MAGIC, 0, SQSH_SUPERBLOCK, "SquashFS"
    else:
        magic, offset, kind = SIF_MAGIC, SIF_MAGIC_OFFSET, "SIF"
        need = SIF_MAGIC_OFFSET + len(SIF_MAGIC)
    with path.open("rb") as handle:
        head = handle.read(need)
    found = head[offset : offset + len(magic)]
    if found != magic[: len(found)]:
        raise ArtifactError(
            f"{name} is not a {kind} image (no {magic.decode()!r} magic at offset {offset}); "
            f"the registry says it is {artifact.format.value}"
        )
    if len(head) < need:
        raise ArtifactError(f"{name} is truncated: {size} bytes, shorter than a {kind} header")
    if artifact.format is ArtifactFormat.SQSH:
        (major,) = _SQSH_MAJOR.unpack_from(head, 28)
        if major != 4:
            raise ArtifactError(f"{name} is SquashFS version {major}, not 4")
        (used,) = _SQSH_BYTES_USED.unpack_from(head, 40)
        if size < used:
            raise ArtifactError(
                f"{name} is truncated: {size} bytes, but its superblock says {used}"
            )


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stat(path: Path, artifact: RuntimeArtifact) -> os.stat_result:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ArtifactError(
            f"runtime {artifact.id}: artifact {path} is missing; publish it to the shared "
            "storage (there is no fallback to a registry pull)"
        ) from None
    except OSError as exc:
        raise ArtifactError(f"runtime {artifact.id}: cannot read {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise ArtifactError(f"runtime {artifact.id}: {path} is not a regular file")
    return info


def verify_artifact(path: Path, artifact: RuntimeArtifact) -> None:
    """Raise `ArtifactError` unless `path` holds `artifact` intact.

    Blocking (it may hash gigabytes): run it with `asyncio.to_thread` from the event loop. A
    file whose path, size and mtime are unchanged since a successful check is not hashed again.
    """
    before = _stat(path, artifact)
    key = _Key(str(path.resolve()), before.st_size, before.st_mtime_ns, artifact.sha256.lower())
    with _lock:
        if key in _verified:
            return
    try:
        _check_magic(path, artifact, before.st_size)
        actual = _hash_file(path)
    except OSError as exc:
        raise ArtifactError(f"runtime {artifact.id}: cannot read {path}: {exc.strerror}") from exc
    if actual != key.sha256:
        raise ArtifactError(
            f"runtime {artifact.id}: {path} has sha256 {actual}, but the runtime registry "
            f"expects {key.sha256}: the file is damaged, incomplete or was replaced"
        )
    after = _stat(path, artifact)
    if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
        with _lock:
            _verified.add(key)


def verify_recorded(artifact: CachedImage | VerifiedArtifact) -> None:
    """`verify_cached` or `verify_verified`, whichever `artifact` is."""
    if isinstance(artifact, CachedImage):
        verify_cached(artifact)
    else:
        verify_verified(artifact)


def verify_cached(image: CachedImage) -> None:
    """Raise `ArtifactError` unless the operator sees the image-cache entry its import
    recorded: a read-only regular file (never a link) of the cache user, with the recorded
    mode, size, inode and ctime, and its format's magic (not read for a tenant's private
    image, which only that tenant's jobs may read). Costs the same for any size."""
    wanted = (True, image.owner_uid, image.mode, image.size, image.inode, image.ctime_ns)
    # A tenant's private image is not the operator's to read (its node checks the magic).
    _check_recorded(
        image.operator_path,
        f"image {image.id}",
        "its import",
        wanted,
        image.format,
        magic=image.mode == 0o444,
        missing="from the image cache",
    )


def verify_verified(artifact: VerifiedArtifact) -> None:
    """Raise `ArtifactError` unless the operator sees the registry artifact its verification
    job recorded (never a link; owner, mode, size, inode and ctime unchanged) with its
    format's magic. Costs the same for any size."""
    recorded = (artifact.owner_uid, artifact.mode, artifact.size, artifact.inode)
    wanted = (True, *recorded, artifact.ctime_ns)
    _check_recorded(
        artifact.operator_path,
        f"runtime {artifact.id}",
        f"its verification job {artifact.verified_by}",
        wanted,
        artifact.format,
        magic=True,
        missing="from the storage",
    )


def _check_recorded(
    path: Path,
    what: str,
    recorder: str,
    wanted: tuple[bool, int, int, int, int, int],
    fmt: ArtifactFormat,
    *,
    magic: bool,
    missing: str,
) -> None:
    name = f"{what}: {path}"
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise ArtifactChanged(f"{name} is missing {missing}") from None
    except OSError as exc:
        raise ArtifactError(f"{name}: cannot read it: {exc.strerror}") from exc
    seen = (
        stat.S_ISREG(info.st_mode),
        info.st_uid,
        stat.S_IMODE(info.st_mode),
        info.st_size,
        info.st_ino,
        info.st_ctime_ns,
    )
    if seen != wanted:
        raise ArtifactChanged(
            f"{name} is not the file {recorder} recorded (regular file, owner, mode, size, "
            f"inode, ctime): {seen}, expected {wanted}"
        )
    if not magic:
        return
    head_magic, offset = (
        (SQSH_MAGIC, 0) if fmt is ArtifactFormat.SQSH else (SIF_MAGIC, SIF_MAGIC_OFFSET)
    )
    try:
        # O_NOFOLLOW: a link swapped in since the lstat is refused, not followed.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            head = handle.read(offset + len(head_magic))
    except OSError as exc:
        raise ArtifactError(f"{name}: cannot read it: {exc.strerror}") from exc
    if head[offset:] != head_magic:
        raise ArtifactError(f"{name} has no {head_magic.decode()!r} magic at offset {offset}")
