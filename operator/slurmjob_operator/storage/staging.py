"""The attempt's staging directory on the shared storage root.

Layout (see `naming`): `<root>/<namespace>/<name>-<uid8>/attempt-<n>/` holding `job.sh`
(0555), `job.env` (0444), `secrets.env` (0600, only with secret env vars; the batch script
deletes it as soon as it has read it) and, once the job runs, `stdout.log` / `stderr.log`.

Rules:
- An attempt's files are immutable. `job.sh` is written last and marks a complete stage; a
  second `stage_attempt` for the same directory is a no-op when `job.sh` and `job.env` are
  identical (an idempotent retry of the same attempt) and a `StagingError` when they differ.
  `secrets.env` is not compared: the job may already have consumed it.
- Every file is written atomically (temporary file, fsync, rename, fsync of the directory),
  created with mode 0600 and only then given its final mode, so a secret is never readable
  by others, not even for a moment.
- Symbolic links are refused anywhere below the storage root that this module creates or
  writes to; chown never follows them.

All functions block: async callers run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from slurmjob_operator.config import Settings
from slurmjob_operator.core import naming
from slurmjob_operator.core.launch import StagedFile
from slurmjob_operator.core.naming import SCRIPT_FILE, SECRETS_FILE
from slurmjob_operator.storage.files import write_atomically

PARENT_MODE = 0o755
ATTEMPT_MODE = 0o755
_ATTEMPT_RE = re.compile(r"^attempt-[1-9][0-9]*$")


class StagingError(RuntimeError):
    """The staging directory cannot be (re)written as asked; the message says why."""


def parse_owner(value: str | None) -> tuple[int, int] | None:
    """`uid:gid` (Settings.staging_owner) as a pair of ints."""
    if value is None:
        return None
    uid, _, gid = value.partition(":")
    return int(uid), int(gid)


def _refuse_symlink(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise StagingError(f"{path}: is a symbolic link; refusing to stage through it")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dir(path: Path, mode: int, owner: tuple[int, int] | None) -> None:
    _refuse_symlink(path)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        if not path.is_dir():
            raise StagingError(f"{path}: exists and is not a directory") from None
        return
    os.chmod(path, mode, follow_symlinks=False)  # mkdir's mode is filtered by the umask
    if owner is not None:
        os.chown(path, owner[0], owner[1], follow_symlinks=False)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _check_existing(staging_dir: Path, files: Mapping[str, StagedFile]) -> bool:
    """True when the attempt is already staged with the same content (nothing to do)."""
    current = _read(staging_dir / SCRIPT_FILE)
    if current is None:
        return False
    for name, staged in files.items():
        if name == SECRETS_FILE:
            continue
        if _read(staging_dir / name) != staged.content:
            raise StagingError(
                f"{staging_dir}: already staged with a different {name}; "
                "an attempt's files are immutable"
            )
    return True


def stage_attempt(
    settings: Settings,
    staging_dir: Path,
    files: Mapping[str, StagedFile],
    owner: tuple[int, int] | None = None,
) -> None:
    """Create the attempt directory below the storage root and write its files.

    `owner` (uid, gid) overrides `settings.staging_owner`; with neither, nothing is chowned.
    """
    if SCRIPT_FILE not in files:
        raise StagingError(f"nothing to stage: {SCRIPT_FILE} is missing")
    for name in files:
        if not name or "/" in name or name.startswith("."):
            raise StagingError(f"{name!r}: not a plain file name")
    owner = owner if owner is not None else parse_owner(settings.staging_owner)
    root = settings.storage_root
    try:
        relative = staging_dir.relative_to(root)
    except ValueError:
        raise StagingError(f"{staging_dir}: not below the storage root {root}") from None
    if not relative.parts or ".." in relative.parts:
        raise StagingError(f"{staging_dir}: not a directory below the storage root {root}")
    if not root.is_dir():
        raise StagingError(f"storage root {root} does not exist or is not a directory")

    current = root
    for part in relative.parts[:-1]:
        current = current / part
        _make_dir(current, PARENT_MODE, owner)
    _make_dir(staging_dir, ATTEMPT_MODE, owner)

    if _check_existing(staging_dir, files):
        return
    # job.sh last: its presence means the attempt is completely staged.
    for name in sorted(files, key=lambda n: n == SCRIPT_FILE):
        target = staging_dir / name
        _refuse_symlink(target)
        write_atomically(target, files[name].content, files[name].mode, owner=owner)
    _fsync_dir(staging_dir)


def _remove_tree(path: Path) -> None:
    _refuse_symlink(path)
    if not path.exists():
        return
    # Unlink the secrets first, so they are gone even when removing the rest fails.
    for secret in path.rglob(SECRETS_FILE):
        with contextlib.suppress(FileNotFoundError):
            secret.unlink()
    shutil.rmtree(path)


def remove_attempt(staging_dir: Path) -> None:
    """Delete one attempt's directory (an interrupted submit, before a retry). Idempotent."""
    if not _ATTEMPT_RE.fullmatch(staging_dir.name):
        raise StagingError(f"{staging_dir}: not an attempt directory")
    _remove_tree(staging_dir)


def remove_resource_dir(storage_root: Path, namespace: str, name: str, uid: str) -> None:
    """Delete every attempt of a resource (after its final logs are archived). Idempotent.

    The path is computed here (`naming.resource_dir`), never taken from a caller. The namespace
    directory above it stays: another resource may be staging into it.
    """
    _remove_tree(naming.resource_dir(storage_root, namespace, name, uid))


def remove_secrets(staging_dir: Path) -> None:
    """Delete an attempt's secrets file (its job ended, whether or not the script ran)."""
    if not _ATTEMPT_RE.fullmatch(staging_dir.name):
        raise StagingError(f"{staging_dir}: not an attempt directory")
    (staging_dir / SECRETS_FILE).unlink(missing_ok=True)
