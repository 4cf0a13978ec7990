"""POSIX ACLs that let one tenant's Unix uid into one attempt's staging directory.

Why: the operator runs with every capability dropped (no CAP_CHOWN, CAP_FOWNER or
CAP_DAC_OVERRIDE), so it cannot hand staging files to the job's uid. The files stay owned by
the operator (uid O) and an ACL names the tenant's Slurm user (uid U) instead; every other
uid, including other tenants and members of the operator's group, gets nothing.

What is granted (`grant_dir`, `grant_file`, `grant_traverse`):

- `attempt-N/`, access ACL `user::rwx user:U:rwx group::--- mask::rwx other::---` (mode 0770
  as `ls` shows it: with an ACL the group bits are the mask, not the group's rights). The job
  needs w to create `stdout.log`/`stderr.log` and to delete `secrets.env`. No sticky bit: it
  would stop the job from deleting `secrets.env`, which the operator owns.
- `attempt-N/`, default ACL `user::rwx user:O:rwx group::--- mask::rwx other::---`. What the
  job creates there (Slurm opens its logs with mode 0666) inherits it, so O can read the logs
  whatever the job's umask (a default ACL replaces the umask), and can delete what the job
  leaves, subdirectories included (that needs w and x on them, hence rwx, not r-x). Files
  the operator itself creates there get only `user:O` and a mask cut by the create mode: no
  access for U until `grant_file`, so a forgotten grant fails closed.
- each file the operator writes, access ACL `user::<owner bits> user:U:r-[x] group::---
  mask::r-[x] other::---`; U gets x only when the owner has it (job.sh) and w only with
  `writable=True`. For `secrets.env` pass `writable=True`: the script shreds it (which opens
  it for writing) before it deletes it. The file's mode becomes e.g. 0440 for job.env.
- parents (`<namespace>/`, `<name>-<uid8>/`), optionally: `user::rwx user:U:--x group::---
  mask::--x other::---`, so other tenants cannot even list the resource names. `attempt-N/`
  alone already keeps the contents apart; mode 0711 parents are the simpler alternative.

Rules for the caller:

- Operate on a file descriptor opened with O_NOFOLLOW (a directory with O_DIRECTORY, never
  O_PATH): nothing here takes a path except `supported`, which makes its own probe.
- Grant after the last chmod/fchmod: setting an access ACL sets the mode bits, and a later
  chmod rewrites the mask (the group bits), which would take U's access away or widen it.
- Grant a file before it is renamed into place, so it never appears with other rights.
- The fd must be owned by this process's euid: an ACL set on a directory someone else owns
  could be changed by that owner, so it is refused (`AclError`) even when root could.

On disk: Linux keeps an ACL in the xattrs `system.posix_acl_access` / `system.posix_acl_default`
as a little-endian u32 version (2) followed by 8-byte entries (u16 tag, u16 perm, u32 id),
sorted by tag then id; the id is ACL_UNDEFINED_ID (0xFFFFFFFF) except for named users and
groups. `encode`/`decode` implement that format exactly (the kernel's own answer to a read,
byte for byte), so no libacl, setfacl or C extension is needed.

Limits: the job may rename or replace anything in its own `attempt-N/` (it needs w there), so
whatever the operator opens there later (logs, job.sh) must be opened with O_NOFOLLOW and
checked to be a regular file. A job can chmod a subdirectory it made to 0700; an operator
without CAP_DAC_OVERRIDE then cannot empty it. Uids must mean the same on the operator's
host and the compute nodes (they do on a shared filesystem with one user database).

`supported(directory)` tells whether the filesystem there keeps POSIX ACLs (NFSv4, some FUSE
and parallel filesystems, or ext4 mounted `noacl` do not): doctor and the operator check it
and refuse to stage (fail closed) rather than fall back to wider modes.

Everything here blocks and is cheap (a few syscalls); async callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

ACCESS_XATTR = "system.posix_acl_access"
DEFAULT_XATTR = "system.posix_acl_default"
VERSION = 2
UNDEFINED_ID = 0xFFFFFFFF
R, W, X = 4, 2, 1
RWX = R | W | X

_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_UNSUPPORTED = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP})


class AclError(OSError):
    """An ACL is malformed (errno EINVAL, as the kernel would say) or cannot be set or read.

    An OSError, so a caller that already treats I/O errors as a failed stage fails closed.
    """


class Tag(IntEnum):
    USER_OBJ = 0x01
    USER = 0x02
    GROUP_OBJ = 0x04
    GROUP = 0x08
    MASK = 0x10
    OTHER = 0x20


_NAMED = frozenset({Tag.USER, Tag.GROUP})
_TEXT_TAG = {
    Tag.USER_OBJ: "user",
    Tag.USER: "user",
    Tag.GROUP_OBJ: "group",
    Tag.GROUP: "group",
    Tag.MASK: "mask",
    Tag.OTHER: "other",
}


def _invalid(message: str) -> AclError:
    return AclError(errno.EINVAL, message)


@dataclass(frozen=True)
class Entry:
    """One ACL entry; `qualifier` is the uid (USER) or gid (GROUP), None for the others."""

    tag: Tag
    perm: int
    qualifier: int | None = None

    def text(self) -> str:
        """`user:12345:r-x`, as `getfacl -n` writes it."""
        perms = "".join(c if self.perm & bit else "-" for c, bit in (("r", R), ("w", W), ("x", X)))
        qualifier = "" if self.qualifier is None else str(self.qualifier)
        return f"{_TEXT_TAG[self.tag]}:{qualifier}:{perms}"


def _sort_key(entry: Entry) -> tuple[int, int]:
    return int(entry.tag), -1 if entry.qualifier is None else entry.qualifier


def _validate(entries: tuple[Entry, ...]) -> None:
    """The kernel's rules (posix_acl_valid), so a bad ACL fails here, with a reason."""
    counts: dict[Tag, int] = {}
    named: set[tuple[Tag, int]] = set()
    for entry in entries:
        if not isinstance(entry.tag, Tag):
            raise _invalid(f"unknown ACL tag {entry.tag!r}")
        if not 0 <= entry.perm <= RWX:
            raise _invalid(f"{entry.tag.name}: permission {entry.perm} is not within 0..7")
        counts[entry.tag] = counts.get(entry.tag, 0) + 1
        if entry.tag in _NAMED:
            q = entry.qualifier
            if q is None or not 0 <= q < UNDEFINED_ID:
                raise _invalid(f"{entry.tag.name}: id {q!r} is not a valid uid/gid")
            if (entry.tag, q) in named:
                raise _invalid(f"{entry.tag.name}: id {q} appears twice")
            named.add((entry.tag, q))
        elif entry.qualifier is not None:
            raise _invalid(f"{entry.tag.name}: takes no id (got {entry.qualifier})")
    for tag in (Tag.USER_OBJ, Tag.GROUP_OBJ, Tag.OTHER):
        if counts.get(tag, 0) != 1:
            raise _invalid(f"an ACL needs exactly one {tag.name} entry")
    if counts.get(Tag.MASK, 0) > 1:
        raise _invalid("an ACL has at most one MASK entry")
    if named and Tag.MASK not in counts:
        raise _invalid("an ACL with named user or group entries needs a MASK entry")


@dataclass(frozen=True)
class Acl:
    """A valid ACL; the entries are kept in the kernel's order (by tag, then id)."""

    entries: tuple[Entry, ...]

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.entries, key=_sort_key))
        _validate(ordered)
        object.__setattr__(self, "entries", ordered)

    @classmethod
    def build(
        cls,
        *,
        owner: int,
        group: int,
        other: int,
        users: Mapping[int, int] | None = None,
        groups: Mapping[int, int] | None = None,
        mask: int | None = None,
    ) -> Acl:
        """An ACL from permissions; `mask` defaults to the union of the group class (what
        setfacl computes), and is left out when there is no named entry to cap."""
        users = users or {}
        groups = groups or {}
        entries = [Entry(Tag.USER_OBJ, owner), Entry(Tag.GROUP_OBJ, group), Entry(Tag.OTHER, other)]
        entries += [Entry(Tag.USER, p, uid) for uid, p in users.items()]
        entries += [Entry(Tag.GROUP, p, gid) for gid, p in groups.items()]
        if mask is None and (users or groups):
            mask = group
            for p in (*users.values(), *groups.values()):
                mask |= p
        if mask is not None:
            entries.append(Entry(Tag.MASK, mask))
        return cls(tuple(entries))

    def get(self, tag: Tag, qualifier: int | None = None) -> int | None:
        """The permission of one entry, None when the ACL has no such entry."""
        for entry in self.entries:
            if entry.tag == tag and entry.qualifier == qualifier:
                return entry.perm
        return None

    @property
    def mode(self) -> int:
        """The permission bits an inode carrying this access ACL has (group bits = mask)."""
        group = self.get(Tag.MASK)
        if group is None:
            group = self.get(Tag.GROUP_OBJ) or 0
        return ((self.get(Tag.USER_OBJ) or 0) << 6) | (group << 3) | (self.get(Tag.OTHER) or 0)

    def text(self, *, default: bool = False) -> str:
        """One entry per line, as `getfacl -n -c -E` prints it (with `default:` prefixes)."""
        prefix = "default:" if default else ""
        return "".join(f"{prefix}{entry.text()}\n" for entry in self.entries)


def encode(acl: Acl) -> bytes:
    """The xattr value of `acl`."""
    parts = [_HEADER.pack(VERSION)]
    for entry in acl.entries:
        qualifier = UNDEFINED_ID if entry.qualifier is None else entry.qualifier
        parts.append(_ENTRY.pack(entry.tag, entry.perm, qualifier))
    return b"".join(parts)


def decode(value: bytes) -> Acl:
    """The ACL in an xattr value. Strict: exactly the canonical form the kernel returns, so a
    value that is truncated, unsorted or carries unknown tags or bits is an `AclError`."""
    if len(value) < _HEADER.size or (len(value) - _HEADER.size) % _ENTRY.size:
        raise _invalid(f"an ACL xattr of {len(value)} bytes is not 4 + 8*n bytes")
    (version,) = _HEADER.unpack_from(value)
    if version != VERSION:
        raise _invalid(f"ACL xattr version {version}, expected {VERSION}")
    entries = []
    for tag_value, perm, qualifier in _ENTRY.iter_unpack(value[_HEADER.size :]):
        try:
            tag = Tag(tag_value)
        except ValueError:
            raise _invalid(f"unknown ACL tag {tag_value:#x}") from None
        if tag in _NAMED:
            entries.append(Entry(tag, perm, qualifier))
        elif qualifier != UNDEFINED_ID:
            raise _invalid(f"{tag.name}: id {qualifier:#x} instead of ACL_UNDEFINED_ID")
        else:
            entries.append(Entry(tag, perm))
    acl = Acl(tuple(entries))
    if acl.entries != tuple(entries):
        raise _invalid("ACL entries are not sorted by tag and id")
    return acl


def _os_error(exc: OSError, what: str) -> AclError:
    if exc.errno in _UNSUPPORTED:
        return AclError(
            exc.errno,
            f"{what}: the filesystem does not support POSIX ACLs (mount it with ACL support, "
            "or do not turn on tenant ACLs for this storage root)",
        )
    return AclError(exc.errno, f"{what}: {exc.strerror}")


def write_acl(fd: int, acl: Acl, *, default: bool = False) -> None:
    """Set the access (or, for a directory, default) ACL of an open file; replaces it."""
    name = DEFAULT_XATTR if default else ACCESS_XATTR
    try:
        os.setxattr(fd, name, encode(acl))
    except OSError as exc:
        raise _os_error(exc, f"setting {name}") from exc


def read_acl(fd: int, *, default: bool = False) -> Acl | None:
    """The ACL of an open file; None when it has none (an access ACL that says no more than
    the mode bits is not stored: the kernel keeps just the mode)."""
    name = DEFAULT_XATTR if default else ACCESS_XATTR
    try:
        value = os.getxattr(fd, name)
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        raise _os_error(exc, f"reading {name}") from exc
    return decode(value)


_KIND_NAME = {stat.S_IFDIR: "directory", stat.S_IFREG: "regular file"}


def _own(fd: int, kind: int, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_IFMT(st.st_mode) != kind:
        raise AclError(errno.EINVAL, f"{what}: fd {fd} is not a {_KIND_NAME[kind]}")
    if st.st_uid != os.geteuid():
        raise AclError(
            errno.EPERM, f"{what}: owned by uid {st.st_uid}, not by this process ({os.geteuid()})"
        )
    return st


def dir_acls(job_uid: int, operator_uid: int) -> tuple[Acl, Acl]:
    """(access, default) ACL of an attempt directory; see the module docstring."""
    access = Acl.build(owner=RWX, group=0, other=0, users={job_uid: RWX})
    default = Acl.build(owner=RWX, group=0, other=0, users={operator_uid: RWX})
    return access, default


def file_acl(owner_perm: int, job_uid: int, *, writable: bool = False) -> Acl:
    """The access ACL of a file the operator wrote for the job (see the module docstring)."""
    job_perm = R | (owner_perm & X) | (W if writable else 0)
    return Acl.build(owner=owner_perm, group=0, other=0, users={job_uid: job_perm})


def grant_dir(fd: int, job_uid: int, operator_uid: int | None = None) -> None:
    """Let `job_uid` into the attempt directory open at `fd` and make what it creates there
    readable (and removable) by `operator_uid` (default: this process's euid).

    Sets the default ACL before the access ACL, so the directory never admits the job while
    files it creates would still be closed to the operator.
    """
    _own(fd, stat.S_IFDIR, "grant_dir")
    operator = os.geteuid() if operator_uid is None else operator_uid
    access, default = dir_acls(job_uid, operator)
    write_acl(fd, default, default=True)
    write_acl(fd, access)


def grant_file(fd: int, job_uid: int, *, writable: bool = False) -> None:
    """Let `job_uid` read (and execute, when the owner may; write, with `writable`) the
    regular file open at `fd`. Call it after the file's last fchmod: it sets the mode too."""
    st = _own(fd, stat.S_IFREG, "grant_file")
    write_acl(fd, file_acl((st.st_mode >> 6) & RWX, job_uid, writable=writable))


def grant_traverse(fd: int, job_uids: Iterable[int]) -> None:
    """Let exactly `job_uids` pass through (not list) the directory open at `fd`: a parent of
    attempt directories. Replaces the whole ACL: pass every uid that needs to pass."""
    st = _own(fd, stat.S_IFDIR, "grant_traverse")
    users = dict.fromkeys(job_uids, X)
    owner = (st.st_mode >> 6) & RWX
    write_acl(fd, Acl.build(owner=owner, group=0, other=0, users=users))


def require_supported(directory: Path) -> None:
    """Raise an `AclError` saying why when the filesystem at `directory` does not keep POSIX
    ACLs (errno ENOTSUP) or the probe cannot run there (the errno of what failed).

    The probe is a fresh directory that gets an access and a default ACL naming this uid,
    which are read back: a filesystem that accepts ACLs but drops them counts as unsupported.
    """
    try:
        probe = tempfile.mkdtemp(prefix=".slurmjob-acl-probe-", dir=directory)
    except OSError as exc:
        raise AclError(
            exc.errno, f"{directory}: cannot create an ACL probe: {exc.strerror}"
        ) from exc
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            uid = os.geteuid()
            access, default = dir_acls(uid, uid)
            try:
                write_acl(fd, default, default=True)
                write_acl(fd, access)
                back = (read_acl(fd), read_acl(fd, default=True))
            except AclError as exc:
                raise AclError(exc.errno, f"{directory}: {exc.strerror}") from exc
            if back != (access, default):
                raise AclError(
                    errno.ENOTSUP,
                    f"{directory}: the filesystem accepts POSIX ACLs but does not keep them",
                )
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def supported(directory: Path) -> bool:
    """Whether the filesystem at `directory` keeps POSIX ACLs. Errors other than "not
    supported" (no such directory, not writable, ...) raise `AclError`: they tell nothing."""
    try:
        require_supported(directory)
    except AclError as exc:
        if exc.errno in _UNSUPPORTED:
            return False
        raise
    return True
