"""The attempt's staging directory on the shared storage root.

Layout (see `naming`): `<root>/<namespace>/<name>-<uid8>/attempt-<n>/` holding `job.sh`
(0555), `job.env` (0444), `secrets.env` (0600, only with secret env vars; the batch script
deletes it as soon as it has read it) and, once the job runs, `stdout.log` / `stderr.log`.
Beside it, `.redact-attempt-<n>` may keep a copy of secrets.env for redacting the attempt's
logs after a restart (`redactions`).

Rules:
- Nothing below the root is reached by path: every directory is opened from its parent's
  descriptor without following a link and with its owner checked (`nofollow`); files are
  created there O_EXCL | O_NOFOLLOW and renamed into place, so a link planted under a name is
  replaced, never written through, and chown/chmod act on descriptors only.
- An attempt directory is made here, exclusively. One that exists already is taken only as
  what an earlier `stage_attempt` of this same attempt left (the operator stopped half-way and
  is asked again): a real directory owned by the job user (`nofollow.job_owner`) holding
  nothing but the files this module writes (the staged names and their temporary files), each
  a regular file with one link, owned by the job user. Anything else there (a link, a FIFO, a
  directory, a log: the job never ran before the stage completed, a file of another owner)
  means someone else made or changed it: StagingError, nothing is written.
- An attempt's files are immutable. `job.sh` is written last and marks a complete stage; a
  second `stage_attempt` for the same directory is a no-op when `job.sh` and `job.env` are
  identical (an idempotent retry of the same attempt) and a `StagingError` when they differ;
  they are read only as regular files, at most their expected size + 1 byte. `secrets.env` is
  not compared: the job may already have consumed it.
- Every file is fsync'ed, and the directory after it; a file is 0600 until it has its owner and
  final mode, so a secret is never readable by others, not even for a moment.
- ACL mode (`job_uid`, a tenant's own uid): nothing is chowned (no CAP_CHOWN) and the files
  stay the operator's; POSIX ACLs (`acl`) let exactly that uid in. The attempt directory is
  made 0700 and then `acl.grant_dir` (the job may create its logs and delete secrets.env, and
  what it creates stays readable and removable by the operator), each file is granted with
  `acl.grant_file` before it is renamed into place (secrets.env writable, so the script can
  shred it), and the directories above it with `acl.grant_traverse` (pass, not list). A
  filesystem without ACLs fails the stage (`StagingError`): never a wider mode instead.
- Removal walks the same way: `shutil.rmtree` from a directory descriptor follows no link, and
  a link or file where a directory should be is unlinked itself, never its target.

All functions block: async callers run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
from collections.abc import Callable, Collection, Mapping
from functools import partial
from pathlib import Path

from slurmjob_operator.config import Settings, parse_owner
from slurmjob_operator.core import naming
from slurmjob_operator.core.launch import StagedFile
from slurmjob_operator.core.naming import SCRIPT_FILE, SECRETS_FILE
from slurmjob_operator.storage import acl, redactions
from slurmjob_operator.storage.files import write_at
from slurmjob_operator.storage.nofollow import (
    UnsafePath,
    below,
    dir_owners,
    job_owner,
    lstat_at,
    open_dir,
    open_file,
    open_root,
    read_at_most,
    walk,
)
from slurmjob_operator.storage.stagingtree import StagingError, StagingNotWritable, not_writable

PARENT_MODE = 0o755
ATTEMPT_MODE = 0o755
#: ACL mode: a new directory is the operator's alone until its ACL names the job's uid.
ACL_DIR_MODE = 0o700
_ATTEMPT_RE = re.compile(r"^attempt-[1-9][0-9]*$")
_TEMPORARY_RE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{12}\.tmp$")

log = logging.getLogger(__name__)


def _parts(settings: Settings, staging_dir: Path) -> tuple[str, ...]:
    """The components below the root of an attempt directory."""
    try:
        parts = below(settings.storage_root, staging_dir)
    except UnsafePath as exc:
        raise StagingError(str(exc)) from None
    if not _ATTEMPT_RE.fullmatch(parts[-1]):
        raise StagingError(f"{staging_dir}: not an attempt directory")
    return parts


def enter_dir(
    parent: int,
    name: str,
    where: Path,
    mode: int,
    owner: tuple[int, int] | None,
    owners: Collection[int],
) -> tuple[int, bool]:
    """Open directory `name` of `parent`, made when missing (then given its mode and owner
    through the descriptor); whether it was made here."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
        made = True
    except FileExistsError:
        made = False
    fd = open_dir(parent, name, owners, str(where))
    if made:
        os.fchmod(fd, mode)  # mkdir's mode is filtered by the umask
        if owner is not None:
            os.fchown(fd, owner[0], owner[1])
    return fd, made


def _check_leftover(
    fd: int, where: Path, files: Collection[str], owner: tuple[int, int] | None, uid: int
) -> None:
    """An attempt directory that exists already must be what an earlier stage of this attempt
    left (see the module docstring). Its temporary files are removed, and a directory the
    operator made but had not handed over yet is handed over now."""
    st = os.fstat(fd)
    if st.st_uid not in (uid, os.geteuid()):
        raise StagingError(f"{where}: exists, owned by uid {st.st_uid}, not by the job user {uid}")
    for name in os.listdir(fd):
        temporary = _TEMPORARY_RE.fullmatch(name)
        if temporary is not None and temporary["name"] in files:
            try:  # whatever it is: unlink removes a name, it follows nothing
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StagingError(f"{where}/{name}: cannot be removed: {exc.strerror}") from None
            continue
        if name not in files:
            raise StagingError(f"{where}: exists and holds {name!r}, which staging never writes")
        entry = lstat_at(fd, name)
        if entry is None:
            continue
        if not stat.S_ISREG(entry.st_mode) or entry.st_nlink != 1 or entry.st_uid != uid:
            raise StagingError(
                f"{where}/{name}: not a regular file of the job user with one link; "
                "the directory was not left by an earlier stage of this attempt"
            )
    if st.st_uid != uid and owner is not None:
        os.fchown(fd, owner[0], owner[1])


def _read(fd: int, name: str, limit: int, uid: int, where: Path) -> bytes | None:
    """At most `limit` bytes of a regular file; None when it does not exist."""
    try:
        file_fd = open_file(fd, name, uid, str(where / name))
    except FileNotFoundError:
        return None
    except UnsafePath as exc:
        raise StagingError(str(exc)) from None
    try:
        return read_at_most(file_fd, limit)
    finally:
        os.close(file_fd)


def _already_staged(fd: int, where: Path, files: Mapping[str, StagedFile], uid: int) -> bool:
    """True when the attempt is already staged with the same content (nothing to do)."""
    script = files[SCRIPT_FILE].content
    if _read(fd, SCRIPT_FILE, len(script) + 1, uid, where) is None:
        return False
    for name, staged in files.items():
        if name == SECRETS_FILE:
            continue
        if _read(fd, name, len(staged.content) + 1, uid, where) != staged.content:
            raise StagingError(
                f"{where}: already staged with a different {name}; an attempt's files are immutable"
            )
    return True


def stage_attempt(
    settings: Settings,
    staging_dir: Path,
    files: Mapping[str, StagedFile],
    owner: tuple[int, int] | None = None,
    *,
    job_uid: int | None = None,
) -> None:
    """Create the attempt directory below the storage root and write its files.

    `owner` (uid, gid) overrides `settings.staging_owner`; with neither, nothing is chowned
    and the files are the operator's. `job_uid`: the uid the job runs as when it is not the
    files' owner (a tenant's `uid`): ACL mode (see the module docstring), where neither
    `owner` nor `settings.staging_owner` applies. A copy of secrets.env is kept
    (`redactions`) only when the job's uid is not the operator's own.
    """
    if SCRIPT_FILE not in files:
        raise StagingError(f"nothing to stage: {SCRIPT_FILE} is missing")
    for name in files:
        if not name or "/" in name or name.startswith("."):
            raise StagingError(f"{name!r}: not a plain file name")
    if job_uid is not None and owner is not None:
        raise StagingError("an owner to chown to and a job uid to grant ACLs to are exclusive")
    if job_uid is None:
        owner = owner if owner is not None else parse_owner(settings.staging_owner)
    uid = owner[0] if owner is not None else os.geteuid()
    parts = _parts(settings, staging_dir)
    root = settings.storage_root
    try:
        fds = [open_root(root)]
    except OSError as exc:
        raise StagingError(f"storage root {root} does not exist or is not a directory") from exc
    try:
        where = root
        made = False
        for i, part in enumerate(parts):
            where = where / part
            last = i == len(parts) - 1
            mode = ATTEMPT_MODE if last else PARENT_MODE
            if job_uid is not None:
                mode = ACL_DIR_MODE
            fd, made = enter_dir(fds[-1], part, where, mode, owner, dir_owners(uid))
            fds.append(fd)
            if job_uid is not None and not last:
                _granted(where, partial(acl.grant_traverse, fd, [job_uid]))
        attempt, resource = fds[-1], fds[-2]
        if not made:
            _check_leftover(attempt, where, files, owner, uid)
        if job_uid is not None:
            # Again on a leftover: the operator may have stopped between mkdir and the grant.
            _granted(where, partial(acl.grant_dir, attempt, job_uid, os.geteuid()))
        if not made and _already_staged(attempt, where, files, uid):
            return
        if SECRETS_FILE in files and redactions.keeps_records(uid if job_uid is None else job_uid):
            redactions.write_record(resource, parts[-1], files[SECRETS_FILE].content)
            os.fsync(resource)
        # job.sh last: its presence means the attempt is completely staged.
        for name in sorted(files, key=lambda n: n == SCRIPT_FILE):
            _write(attempt, where, name, files[name], owner, job_uid)
        os.fsync(attempt)
    except UnsafePath as exc:
        raise StagingNotWritable(f"{exc}; refusing to stage through it") from None
    except PermissionError as exc:
        found = f"cannot be made or entered ({exc.strerror})"
        raise StagingNotWritable(not_writable(where, found, settings, job_uid)) from None
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _granted(where: Path, grant: Callable[[], None]) -> None:
    """Run an `acl` grant; its failure (no ACL support, a directory not the operator's) is a
    failed stage, named by the path."""
    try:
        grant()
    except acl.AclError as exc:
        raise StagingError(f"{where}: {exc.strerror}; nothing is staged without it") from None


def _write(
    attempt: int,
    where: Path,
    name: str,
    staged: StagedFile,
    owner: tuple[int, int] | None,
    job_uid: int | None,
) -> None:
    if job_uid is None:
        write_at(attempt, name, staged.content, staged.mode, owner=owner)
        return
    # The owner's bits only: the ACL gives the job's uid what the owner has (w only for
    # secrets.env, which the script shreds) and everyone else nothing.
    writable = name == SECRETS_FILE

    def grant(fd: int) -> None:
        _granted(where / name, partial(acl.grant_file, fd, job_uid, writable=writable))

    write_at(attempt, name, staged.content, staged.mode & 0o700, prepare=grant)


def is_staged(settings: Settings, staging_dir: Path) -> bool:
    """Whether the attempt's `job.sh` (written last) exists. A directory that cannot be
    walked safely counts as staged: an attempt that may have been sent is never restarted."""
    parts = _parts(settings, staging_dir)
    try:
        with walk(settings.storage_root, parts, dir_owners(job_owner(settings))) as fd:
            return lstat_at(fd, SCRIPT_FILE) is not None
    except FileNotFoundError:
        return False
    except UnsafePath as exc:
        log.warning("cannot tell whether %s is staged: %s", staging_dir, exc)
        return True


def _unlink_secrets(parent: int, name: str, owners: Collection[int], where: Path) -> None:
    """Unlink `secrets.env` in directory `name` of `parent` (first, so it is gone even when
    removing the rest fails), and in its attempt directories."""
    try:
        fd = open_dir(parent, name, owners, str(where))
    except (FileNotFoundError, UnsafePath):
        return
    try:
        if _ATTEMPT_RE.fullmatch(name):
            if lstat_at(fd, SECRETS_FILE) is not None:
                os.unlink(SECRETS_FILE, dir_fd=fd)
            return
        for entry in os.listdir(fd):
            if _ATTEMPT_RE.fullmatch(entry):
                _unlink_secrets(fd, entry, owners, where / entry)
    finally:
        os.close(fd)


def _remove(settings: Settings, parents: tuple[str, ...], name: str) -> None:
    """Remove `name` below `root/parents` whatever it is (a link itself, not its target)."""
    root = settings.storage_root
    owners = dir_owners(job_owner(settings))
    where = root.joinpath(*parents, name)
    try:
        with walk(root, parents, owners) as fd:
            entry = lstat_at(fd, name)
            if entry is None:
                return
            if not stat.S_ISDIR(entry.st_mode):
                os.unlink(name, dir_fd=fd)
                return
            _unlink_secrets(fd, name, owners, where)
            shutil.rmtree(name, dir_fd=fd)
    except FileNotFoundError:
        return
    except UnsafePath as exc:
        # What is there is not ours: whatever we made was moved away from this path.
        log.warning("not removing %s: %s", where, exc)


def remove_attempt(settings: Settings, staging_dir: Path) -> None:
    """Delete one attempt's directory (an interrupted submit, before a retry) and the copy of
    its secrets. Idempotent."""
    parts = _parts(settings, staging_dir)
    _remove(settings, parts[:-1], parts[-1])
    _remove(settings, parts[:-1], redactions.record_name(parts[-1]))


def remove_resource_dir(settings: Settings, namespace: str, name: str, uid: str) -> None:
    """Delete every attempt of a resource (after its final logs are archived). Idempotent.

    The path is computed here (`naming.resource_dir`), never taken from a caller. The namespace
    directory above it stays: another resource may be staging into it.
    """
    path = naming.resource_dir(settings.storage_root, namespace, name, uid)
    parts = below(settings.storage_root, path)
    _remove(settings, parts[:-1], parts[-1])


def remove_secrets(settings: Settings, staging_dir: Path) -> None:
    """Delete an attempt's secrets file (its job ended, whether or not the script ran)."""
    parts = _parts(settings, staging_dir)
    try:
        with walk(settings.storage_root, parts, dir_owners(job_owner(settings))) as fd:
            if lstat_at(fd, SECRETS_FILE) is not None:
                os.unlink(SECRETS_FILE, dir_fd=fd)
    except FileNotFoundError:
        return
    except UnsafePath as exc:
        log.warning("cannot remove the secrets of %s: %s", staging_dir, exc)
