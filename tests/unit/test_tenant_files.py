"""A tenant's attempt files (issue 9): with a `uid`, the operator keeps them (no chown) and
POSIX ACLs let exactly that uid in; its logs are read as that uid's and another uid's are
refused; with real uids, the tenant uses its attempt and another tenant cannot even look."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmjob_operator.api.status import Phase
from slurmjob_operator.core.naming import SCRIPT_FILE, SECRETS_FILE, STDOUT_FILE
from slurmjob_operator.storage import acl
from slurmjob_operator.storage.acl import R, Tag, W, X

from .controller_fakes import SIF, Bed, make_bed
from .test_tenant_users import (
    ME,
    SECRET_ENV,
    STRANGER,
    TENANT,
    attempt_path,
    refresh,
    submit,
    tenant_settings,
)

SETPRIV = shutil.which("setpriv")


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return make_bed(tmp_path, **tenant_settings(tmp_path))


# -- the tenant's files ---------------------------------------------------------------------


def _acl_of(path: Path, *, default: bool = False) -> acl.Acl | None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return acl.read_acl(fd, default=default)
    finally:
        os.close(fd)


async def test_a_tenants_attempt_is_staged_in_acl_mode(tmp_path: Path) -> None:
    # SLURMJOB_STAGING_OWNER is for the other jobs: the tenant's uid takes precedence.
    bed = make_bed(tmp_path, **tenant_settings(tmp_path, staging_owner=f"{ME}:{os.getegid()}"))
    bed.store.secrets[("team-a", "hf")] = {"token": "s3cret-value"}
    ref = await submit(bed, env=SECRET_ENV)
    attempt = attempt_path(bed, ref)
    st = attempt.stat()
    assert st.st_uid == ME
    access, default = _acl_of(attempt), _acl_of(attempt, default=True)
    assert (access, default) == acl.dir_acls(TENANT, ME)
    assert stat.S_IMODE(st.st_mode) == 0o770, "the group bits are the mask"
    assert access is not None
    assert access.get(Tag.USER, STRANGER) is None
    expected = {SCRIPT_FILE: (R | X, 0o550), "job.env": (R, 0o440), SECRETS_FILE: (R | W, 0o660)}
    for name, (perm, mode) in expected.items():
        file_st = (attempt / name).stat()
        assert file_st.st_uid == ME
        assert stat.S_IMODE(file_st.st_mode) == mode, name
        got = _acl_of(attempt / name)
        assert got is not None
        assert got.get(Tag.USER, TENANT) == perm, name
        assert (got.get(Tag.GROUP_OBJ), got.get(Tag.OTHER)) == (0, 0), name
    for parent in (attempt.parent, attempt.parent.parent):
        got = _acl_of(parent)
        assert got is not None
        assert got.get(Tag.USER, TENANT) == X, parent
        assert got.get(Tag.OTHER) == 0, parent
        assert stat.S_IMODE(parent.stat().st_mode) == 0o710, parent
    # The copy of secrets.env for redaction is kept: the job's uid is not the operator's.
    assert (attempt.parent / ".redact-attempt-1").is_file()


async def test_jobs_of_a_tenant_without_uid_are_staged_as_before(bed: Bed) -> None:
    ref = await submit(bed, namespace="plain")
    attempt = attempt_path(bed, ref)
    assert _acl_of(attempt) is None
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o755


async def test_a_tenants_log_owned_by_its_uid_is_read_and_another_uids_refused(
    bed: Bed,
) -> None:
    if ME != 0:
        pytest.skip("needs root to give a file to another uid")
    ref = await submit(bed)
    attempt = attempt_path(bed, ref)
    log = attempt / STDOUT_FILE
    log.write_text("hello from team-a\n")
    os.chown(log, TENANT, TENANT)
    bed.slurm.set_state(100, "RUNNING")
    await refresh(bed, ref)
    logs = bed.store.status(ref).logs
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "hello from team-a\n"
    # The same file given to another tenant's uid is not this attempt's log.
    log.write_text("planted by team-b\n")
    os.chown(log, STRANGER, STRANGER)
    bed.slurm.set_state(100, "COMPLETED", 0)
    await refresh(bed, ref)
    logs = bed.store.status(ref).logs
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "hello from team-a\n", "the tails are kept as they were"


# -- with real uids -------------------------------------------------------------------------


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A storage root the tenants' uids may pass through (pytest's tmp_path is 0700)."""
    if ME != 0:
        pytest.skip("needs root to act as several uids")
    if SETPRIV is None:
        pytest.skip("setpriv (util-linux) is not installed")
    root = Path(tempfile.mkdtemp(prefix="slurmjob-tenant-"))
    try:
        os.chmod(root, 0o711)
        (root / "runtimes").mkdir()
        (root / "runtimes" / "unit.sif").write_bytes(SIF)
        yield root
    finally:
        shutil.rmtree(root)


def _as(uid: int, script: str) -> subprocess.CompletedProcess[str]:
    assert SETPRIV is not None
    return subprocess.run(
        [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        check=False,
    )


async def test_the_tenants_uid_uses_its_attempt_and_another_tenants_cannot(
    tmp_path: Path, shared: Path
) -> None:
    bed = make_bed(tmp_path, **tenant_settings(tmp_path, storage_root=shared))
    bed.store.secrets[("team-a", "hf")] = {"token": "s3cret-value"}
    ref = await submit(bed, env=SECRET_ENV)
    assert bed.store.status(ref).phase is Phase.QUEUED
    d = attempt_path(bed, ref)
    job = _as(
        TENANT,
        f"set -e; cd '{d}'; cat job.sh > /dev/null; cat job.env > /dev/null; "
        "shred -u secrets.env; test ! -e secrets.env; echo 'hello from team-a' > stdout.log",
    )
    assert job.returncode == 0, job.stderr
    for script in (f"ls '{d}'", f"cat '{d}/job.sh'", f"cat '{d}/stdout.log'", f"ls '{d.parent}'"):
        other = _as(STRANGER, script)
        assert other.returncode != 0, script
        assert "Permission denied" in other.stderr, (script, other.stderr)
    assert (d / STDOUT_FILE).stat().st_uid == TENANT
    bed.slurm.set_state(100, "COMPLETED", 0)
    await refresh(bed, ref)
    logs = bed.store.status(ref).logs
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "hello from team-a\n"
    await bed.controller.finalize(bed.store.body(ref))
    assert not d.parent.exists(), "the operator removes what the job wrote"
