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
from pathlib import Path
from typing import NamedTuple

from slurmjob_operator.config import Settings
from slurmjob_operator.site.catalogs import ArtifactFormat, RuntimeArtifact

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


class ArtifactError(Exception):
    """The runtime artifact cannot be used; fatal for the submission, never retried around."""


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
