"""POSIX ACLs for tenant staging directories: the xattr format, the grants, and what they let
real uids do (as root: dropped to unprivileged uids by fork+setresuid and setpriv)."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmjob_operator.storage import acl
from slurmjob_operator.storage.acl import (
    ACCESS_XATTR,
    DEFAULT_XATTR,
    UNDEFINED_ID,
    Acl,
    AclError,
    Entry,
    R,
    Tag,
    W,
    X,
)

TENANT = 12345  # the job's Slurm user
STRANGER = 12346  # another tenant
OPERATOR = 12347  # the operator, non-root, no capabilities
RWX = R | W | X

SETPRIV = shutil.which("setpriv")
SETFACL = shutil.which("setfacl")
GETFACL = shutil.which("getfacl")


def _fs_supports_acls(directory: Path) -> bool:
    try:
        return acl.supported(directory)
    except AclError:
        return False


@pytest.fixture
def acl_tmp(tmp_path: Path) -> Path:
    if not _fs_supports_acls(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} does not support POSIX ACLs")
    return tmp_path


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _new_file(path: Path, content: bytes, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.write(fd, content)
    os.fchmod(fd, mode)
    return fd


# --- the format ---------------------------------------------------------------------------


def test_the_attempt_directory_acl_encodes_to_the_kernel_layout() -> None:
    access, default = acl.dir_acls(TENANT, OPERATOR)
    assert acl.encode(access) == bytes.fromhex(
        "02000000"  # version 2
        "0100 0700 ffffffff"  # user::rwx
        "0200 0700 39300000"  # user:12345:rwx
        "0400 0000 ffffffff"  # group::---
        "1000 0700 ffffffff"  # mask::rwx
        "2000 0000 ffffffff"  # other::---
    )
    assert acl.encode(default) == bytes.fromhex(
        "02000000 0100 0700 ffffffff"
        "0200 0700 3b300000"  # user:12347:rwx, the operator
        "0400 0000 ffffffff 1000 0700 ffffffff 2000 0000 ffffffff"
    )
    assert access.text() == "user::rwx\nuser:12345:rwx\ngroup::---\nmask::rwx\nother::---\n"
    assert access.mode == 0o770


def test_build_computes_the_mask_and_the_entries_are_kept_sorted() -> None:
    built = Acl.build(owner=RWX, group=X, other=0, users={9: W, 3: R}, groups={5: 0})
    assert built.get(Tag.MASK) == RWX
    assert [(e.tag, e.qualifier) for e in built.entries] == [
        (Tag.USER_OBJ, None),
        (Tag.USER, 3),
        (Tag.USER, 9),
        (Tag.GROUP_OBJ, None),
        (Tag.GROUP, 5),
        (Tag.MASK, None),
        (Tag.OTHER, None),
    ]
    assert Acl.build(owner=R, group=R, other=0).get(Tag.MASK) is None
    assert acl.file_acl(0o5, TENANT).text() == (
        "user::r-x\nuser:12345:r-x\ngroup::---\nmask::r-x\nother::---\n"
    )
    assert acl.file_acl(0o6, TENANT).get(Tag.USER, TENANT) == R
    assert acl.file_acl(0o6, TENANT, writable=True).get(Tag.USER, TENANT) == R | W


_UO, _GO, _O, _M = (
    Entry(Tag.USER_OBJ, 7),
    Entry(Tag.GROUP_OBJ, 0),
    Entry(Tag.OTHER, 0),
    Entry(Tag.MASK, 7),
)


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ((_GO, _O), "exactly one USER_OBJ"),
        ((_UO, _UO, _GO, _O), "exactly one USER_OBJ"),
        ((_UO, _GO, _O, _M, _M), "at most one MASK"),
        ((Entry(Tag.USER_OBJ, 8), _GO, _O), "not within 0..7"),
        ((Entry(Tag.USER_OBJ, 7, 0), _GO, _O), "takes no id"),
        ((_UO, Entry(Tag.USER, 4, 1), _GO, _O), "needs a MASK"),
        ((_UO, Entry(Tag.GROUP, 4, 1), _GO, _O), "needs a MASK"),
        ((_UO, Entry(Tag.USER, 4), _GO, _M, _O), "not a valid uid"),
        ((_UO, Entry(Tag.USER, 4, UNDEFINED_ID), _GO, _M, _O), "not a valid uid"),
        ((_UO, Entry(Tag.USER, 4, 1), Entry(Tag.USER, 2, 1), _GO, _M, _O), "appears twice"),
    ],
)
def test_invalid_acls_are_refused_with_a_reason(entries: tuple[Entry, ...], reason: str) -> None:
    with pytest.raises(AclError, match=reason) as info:
        Acl(entries)
    assert info.value.errno == errno.EINVAL


def _pack(*entries: tuple[int, int, int], version: int = 2) -> bytes:
    return struct.pack("<I", version) + b"".join(struct.pack("<HHI", *e) for e in entries)


_U = UNDEFINED_ID
_GOOD = ((0x01, 6, _U), (0x02, 4, 7), (0x04, 0, _U), (0x10, 4, _U), (0x20, 0, _U))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "not 4 \\+ 8\\*n"),
        (_pack(*_GOOD)[:-1], "not 4 \\+ 8\\*n"),
        (_pack(*_GOOD, version=1), "version 1"),
        (_pack(*_GOOD, (0x40, 0, _U)), "unknown ACL tag 0x40"),
        (_pack((0x01, 6, 0), *_GOOD[1:]), "instead of ACL_UNDEFINED_ID"),
        (_pack(_GOOD[1], _GOOD[0], *_GOOD[2:]), "not sorted"),
        (_pack(_GOOD[0], (0x02, 4, 9), (0x02, 4, 3), *_GOOD[2:]), "not sorted"),
        (_pack(*_GOOD[:4]), "exactly one OTHER"),
        (_pack(_GOOD[0], (0x02, 0x0104, 7), *_GOOD[2:]), "within 0..7"),
    ],
)
def test_decode_refuses_anything_but_the_canonical_form(value: bytes, reason: str) -> None:
    assert acl.decode(_pack(*_GOOD)).get(Tag.USER, 7) == R
    with pytest.raises(AclError, match=reason):
        acl.decode(value)


_perms = st.integers(0, RWX)
_ids = st.integers(0, UNDEFINED_ID - 1)


@st.composite
def _acls(draw: st.DrawFn, *, named: bool = False) -> Acl:
    users = draw(st.dictionaries(_ids, _perms, min_size=1 if named else 0, max_size=6))
    groups = draw(st.dictionaries(_ids, _perms, max_size=6))
    explicit_mask = draw(st.none() | _perms)
    if explicit_mask is None and not (users or groups) and draw(st.booleans()):
        explicit_mask = draw(_perms)  # a mask with nothing to cap is valid too
    return Acl.build(
        owner=draw(_perms),
        group=draw(_perms),
        other=draw(_perms),
        users=users,
        groups=groups,
        mask=explicit_mask,
    )


@given(_acls())
def test_encode_then_decode_is_the_identity(value: Acl) -> None:
    encoded = acl.encode(value)
    assert acl.decode(encoded) == value
    assert acl.encode(acl.decode(encoded)) == encoded
    assert len(encoded) == 4 + 8 * len(value.entries)


_raw_entries = st.lists(
    st.tuples(
        st.sampled_from([0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x00, 0x03, 0x40, 0xFFFF]),
        st.sampled_from([0, 4, 6, 7, 8, 0xFFFF]),
        st.sampled_from([_U, 0, 1, 12345, _U - 1]),
    ),
    max_size=9,
)


@given(st.binary(max_size=80) | _raw_entries.map(lambda es: _pack(*es)))
@settings(max_examples=500)
def test_decode_accepts_exactly_the_canonical_bytes(value: bytes) -> None:
    try:
        decoded = acl.decode(value)
    except AclError as exc:
        code: int | None = exc.errno
    else:
        code = None
        assert acl.encode(decoded) == value
    assert code in (None, errno.EINVAL)


# --- against the kernel and libacl ----------------------------------------------------------


def test_grant_dir_sets_both_acls_and_the_mode(acl_tmp: Path) -> None:
    attempt = acl_tmp / "attempt-1"
    attempt.mkdir(mode=0o700)
    fd = _open_dir(attempt)
    try:
        acl.grant_dir(fd, TENANT, OPERATOR)
        access, default = acl.dir_acls(TENANT, OPERATOR)
        assert acl.read_acl(fd) == access
        assert acl.read_acl(fd, default=True) == default
        assert os.getxattr(fd, ACCESS_XATTR) == acl.encode(access)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o770
        acl.grant_dir(fd, TENANT, OPERATOR)  # idempotent: a retried stage sets the same
        assert acl.read_acl(fd) == access
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("mode", "writable", "job_perm", "final_mode"),
    [(0o444, False, R, 0o440), (0o555, False, R | X, 0o550), (0o600, True, R | W, 0o660)],
)
def test_grant_file_after_the_last_chmod_fixes_the_mode(
    acl_tmp: Path, mode: int, writable: bool, job_perm: int, final_mode: int
) -> None:
    fd = _new_file(acl_tmp / "job.env", b"export A=1\n", mode)
    try:
        acl.grant_file(fd, TENANT, writable=writable)
        got = acl.read_acl(fd)
        assert got is not None
        assert got.get(Tag.USER, TENANT) == job_perm
        assert (got.get(Tag.GROUP_OBJ), got.get(Tag.OTHER)) == (0, 0)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == final_mode == got.mode
    finally:
        os.close(fd)


def test_a_file_created_by_the_operator_in_a_granted_dir_stays_closed_to_the_job(
    acl_tmp: Path,
) -> None:
    """A staged file whose grant was forgotten fails closed: the default ACL gives the job
    user nothing, and the 0600 create mode zeroes the inherited mask."""
    attempt = acl_tmp / "attempt-1"
    attempt.mkdir(mode=0o700)
    dfd = _open_dir(attempt)
    try:
        acl.grant_dir(dfd, TENANT, OPERATOR)
    finally:
        os.close(dfd)
    fd = _new_file(attempt / "tmp", b"x", 0o600)
    try:
        inherited = acl.read_acl(fd)
        assert inherited is not None
        assert inherited.get(Tag.USER, TENANT) is None
        assert inherited.get(Tag.MASK) == 0
    finally:
        os.close(fd)


def test_grants_refuse_the_wrong_kind_of_file(acl_tmp: Path) -> None:
    fd = _new_file(acl_tmp / "f", b"", 0o600)
    try:
        with pytest.raises(AclError, match="not a directory"):
            acl.grant_dir(fd, TENANT)
        with pytest.raises(AclError, match="not a directory"):
            acl.grant_traverse(fd, [TENANT])
    finally:
        os.close(fd)
    dfd = _open_dir(acl_tmp)
    try:
        with pytest.raises(AclError, match="not a regular file"):
            acl.grant_file(dfd, TENANT)
    finally:
        os.close(dfd)


def test_grant_traverse_lets_exactly_the_named_uids_pass(acl_tmp: Path) -> None:
    parent = acl_tmp / "team-a"
    parent.mkdir(mode=0o755)
    fd = _open_dir(parent)
    try:
        acl.grant_traverse(fd, [TENANT, TENANT + 10])
        got = acl.read_acl(fd)
        assert got is not None
        assert got.text() == (
            "user::rwx\nuser:12345:--x\nuser:12355:--x\ngroup::---\nmask::--x\nother::---\n"
        )
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o710
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another uid")
def test_grants_refuse_a_directory_this_process_does_not_own(acl_tmp: Path) -> None:
    """Even root, which could set it, refuses: the owner could widen the ACL afterwards."""
    planted = acl_tmp / "attempt-1"
    planted.mkdir(mode=0o700)
    os.chown(planted, TENANT, TENANT)
    fd = _open_dir(planted)
    try:
        with pytest.raises(AclError, match="owned by uid 12345") as info:
            acl.grant_dir(fd, TENANT, OPERATOR)
        assert info.value.errno == errno.EPERM
        assert acl.read_acl(fd) is None
        assert acl.read_acl(fd, default=True) is None
    finally:
        os.close(fd)


def _setfacl_spec(value: Acl, prefix: str = "") -> str:
    return ",".join(prefix + entry.text() for entry in value.entries)


@pytest.mark.skipif(SETFACL is None, reason="setfacl is not installed (Debian package acl)")
@given(value=_acls(named=True))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_setfacl_stores_exactly_the_bytes_we_encode(acl_tmp: Path, value: Acl) -> None:
    target = acl_tmp / "f"
    target.touch()
    subprocess.run([str(SETFACL), "--set", _setfacl_spec(value), str(target)], check=True)
    assert os.getxattr(target, ACCESS_XATTR, follow_symlinks=False) == acl.encode(value)


@pytest.mark.skipif(
    SETFACL is None or GETFACL is None, reason="getfacl/setfacl are not installed (package acl)"
)
def test_libacl_reads_what_grant_dir_wrote_and_writes_what_it_would(acl_tmp: Path) -> None:
    access, default = acl.dir_acls(TENANT, OPERATOR)
    ours = acl_tmp / "ours"
    ours.mkdir(mode=0o700)
    fd = _open_dir(ours)
    try:
        acl.grant_dir(fd, TENANT, OPERATOR)
    finally:
        os.close(fd)
    shown = subprocess.run(
        [str(GETFACL), "-n", "-c", "-E", str(ours)], check=True, capture_output=True, text=True
    ).stdout
    assert shown == access.text() + default.text(default=True) + "\n"

    theirs = acl_tmp / "theirs"
    theirs.mkdir(mode=0o700)
    spec = _setfacl_spec(access) + "," + _setfacl_spec(default, "default:")
    subprocess.run([str(SETFACL), "--set", spec, str(theirs)], check=True)
    for name in (ACCESS_XATTR, DEFAULT_XATTR):
        assert os.getxattr(theirs, name) == os.getxattr(ours, name)


# --- supported() ----------------------------------------------------------------------------


def test_supported_leaves_no_probe_behind(acl_tmp: Path) -> None:
    assert acl.supported(acl_tmp)
    acl.require_supported(acl_tmp)
    assert list(acl_tmp.iterdir()) == []


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOTSUP])
def test_a_filesystem_without_acls_is_reported_and_grants_fail_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "setxattr", refuse)
    assert acl.supported(tmp_path) is False
    with pytest.raises(AclError, match="does not support POSIX ACLs"):
        acl.require_supported(tmp_path)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "attempt-1").mkdir(mode=0o700)
    fd = _open_dir(tmp_path / "attempt-1")
    try:
        with pytest.raises(AclError, match="does not support POSIX ACLs") as info:
            acl.grant_dir(fd, TENANT)
        assert info.value.errno == code
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o700, "nothing was opened up instead"
    finally:
        os.close(fd)


def test_a_filesystem_that_drops_acls_counts_as_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def accept(*args: object, **kwargs: object) -> None:
        return None

    def nothing(*args: object, **kwargs: object) -> bytes:
        raise OSError(errno.ENODATA, "No data available")

    monkeypatch.setattr(os, "setxattr", accept)
    monkeypatch.setattr(os, "getxattr", nothing)
    assert acl.supported(tmp_path) is False
    with pytest.raises(AclError, match="does not keep them"):
        acl.require_supported(tmp_path)


_RAMFS_PROBE = """
import os, sys
from pathlib import Path
from slurmjob_operator.storage import acl
d = Path(sys.argv[1])
assert acl.supported(d) is False
os.mkdir(d / "attempt-1", 0o700)
fd = os.open(d / "attempt-1", os.O_RDONLY | os.O_DIRECTORY)
try:
    acl.grant_dir(fd, 12345)
except acl.AclError as exc:
    print(exc.errno, exc)
print(oct(os.fstat(fd).st_mode & 0o7777), sorted(os.listdir(d)))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a filesystem")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is missing")
def test_a_real_filesystem_without_acls_is_refused(tmp_path: Path) -> None:
    """ramfs keeps no xattrs: the kernel's own EOPNOTSUPP, in a private mount namespace."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = 'mount -t ramfs ramfs "$1" || exit 77; exec "$2" -c "$3" "$1"'
    done = subprocess.run(
        [
            *("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"),
            *(str(mnt), sys.executable, _RAMFS_PROBE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode == 77:
        pytest.skip(f"cannot mount ramfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{errno.EOPNOTSUPP} [Errno {errno.EOPNOTSUPP}] setting system.posix_acl_default: "
        "the filesystem does not support POSIX ACLs (mount it with ACL support, or do not "
        "turn on tenant ACLs for this storage root)",
        "0o700 ['attempt-1']",
    ]


def test_supported_cannot_tell_for_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(AclError, match="cannot create an ACL probe") as info:
        acl.supported(tmp_path / "missing")
    assert info.value.errno == errno.ENOENT


# --- real uids ------------------------------------------------------------------------------


def _as_uid(uid: int, action: Callable[[], None]) -> None:
    """Run `action` in a child that dropped to uid:gid `uid`, no groups and (by the setresuid
    away from 0) no capabilities at all: an operator with every capability dropped."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            caps = Path("/proc/self/status").read_text().splitlines()
            assert "CapEff:\t0000000000000000" in caps, caps
            action()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the action as uid {uid} failed (see stderr)"


def _sh(uid: int, script: str, *, groups: str | None = None) -> subprocess.CompletedProcess[str]:
    """`script` run by /bin/sh as uid:gid `uid` with no capabilities (setpriv)."""
    assert SETPRIV is not None
    group_args = [f"--groups={groups}"] if groups else ["--clear-groups"]
    return subprocess.run(
        [
            SETPRIV,
            f"--reuid={uid}",
            f"--regid={uid}",
            *group_args,
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "/bin/sh",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        check=False,
    )


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A storage root every test uid can pass through (pytest's tmp_path is 0700 root), owned
    by the operator uid like a resource directory."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as several uids")
    if SETPRIV is None:
        pytest.skip("setpriv (util-linux) is not installed")
    root = Path(tempfile.mkdtemp(prefix="slurmjob-acl-"))
    try:
        if not _fs_supports_acls(root):
            pytest.skip(f"the filesystem of {root} does not support POSIX ACLs")
        os.chown(root, OPERATOR, OPERATOR)
        os.chmod(root, 0o711)
        yield root
    finally:
        shutil.rmtree(root)


def _stage(attempt: Path) -> None:
    """What staging does, as the unprivileged operator."""
    attempt.mkdir(mode=0o700)
    dfd = _open_dir(attempt)
    try:
        acl.grant_dir(dfd, TENANT)  # the operator is this process's euid
    finally:
        os.close(dfd)
    for name, content, mode, writable in [
        ("job.env", b"export A=1\n", 0o444, False),
        ("secrets.env", b"export TOKEN=hunter22\n", 0o600, True),
        ("job.sh", b"#!/bin/bash\necho hi\n", 0o555, False),
    ]:
        tmp = attempt / f".{name}.tmp"
        fd = _new_file(tmp, content, mode)
        try:
            acl.grant_file(fd, TENANT, writable=writable)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, attempt / name)


def test_the_job_uses_its_directory_others_cannot_and_the_operator_reads_and_cleans_up(
    shared_root: Path,
) -> None:
    attempt = shared_root / "attempt-1"
    _as_uid(OPERATOR, lambda: _stage(attempt))
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o770
    assert attempt.stat().st_uid == OPERATOR

    # The job, with a umask that alone would shut the operator out of its logs (a default ACL
    # replaces the umask); `>` creates with 0666 like slurmstepd does.
    d = shlex.quote(str(attempt))
    job = _sh(
        TENANT,
        f"set -e; umask 077; cd {d}; cat job.env job.sh secrets.env; shred -u secrets.env; "
        "test ! -e secrets.env; echo 'hello from the job' > stdout.log; "
        "mkdir out; echo result > out/result.txt; echo 'only the job may' > out/private; "
        "chmod 600 out/private",
    )
    assert job.returncode == 0, job.stderr
    assert "export TOKEN=hunter22" in job.stdout
    assert "echo hi" in job.stdout

    # Another tenant, even one in the operator's and the job's groups, gets nothing.
    for script in (f"ls {d}", f"cat {d}/job.env", f"cat {d}/stdout.log", f"touch {d}/x"):
        other = _sh(STRANGER, script, groups=f"{TENANT},{OPERATOR}")
        assert other.returncode != 0, script
        assert "Permission denied" in other.stderr, (script, other.stderr)

    # The job cannot widen its directory's ACL: the operator owns it.
    def widen() -> None:
        fd = _open_dir(attempt)
        try:
            with pytest.raises(AclError) as info:
                acl.write_acl(fd, Acl.build(owner=RWX, group=0, other=RWX))
            assert info.value.errno == errno.EPERM
        finally:
            os.close(fd)

    _as_uid(TENANT, widen)

    # The operator (not root: root would bypass every ACL) reads what the job wrote.
    operator = _sh(OPERATOR, f"cat {d}/stdout.log {d}/out/result.txt")
    assert operator.returncode == 0, operator.stderr
    assert operator.stdout == "hello from the job\nresult\n"

    # ... and removes the attempt, the job's subdirectory included.
    _as_uid(OPERATOR, lambda: shutil.rmtree(attempt))
    assert not attempt.exists()
