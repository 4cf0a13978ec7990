"""The copy of what an attempt was given to hide (`storage.redactions`): written only where no
job can read it, read back only when the operator itself wrote it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurmjob_operator.config import Settings
from slurmjob_operator.core import naming
from slurmjob_operator.core.launch import StagedFile
from slurmjob_operator.core.naming import SECRETS_FILE
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.site.render import render_attempt
from slurmjob_operator.storage.logs import read_attempt_logs
from slurmjob_operator.storage.nofollow import UnsafePath
from slurmjob_operator.storage.redactions import parse_env, recall, record_name
from slurmjob_operator.storage.staging import remove_attempt, stage_attempt

from .test_render_support import fixed_artifact, make_context, make_spec

UID = "3f2a9c1e-7b4d-4e8a-9c21-5d6e7f809a1b"
ME = os.geteuid()
JOB = 4242
root_only = pytest.mark.skipif(ME != 0, reason="needs root (chown to the job user)")
VALUES = ["hunter22-token", 'it\'s a "quoted" = value\nwith a second line', "ünïcødé-pass"]


def secrets_env(values: list[str]) -> bytes:
    """secrets.env as the renderer writes it today, for these values."""
    env = [
        {"name": f"S{i}", "valueFrom": {"secretKeyRef": {"name": "s", "key": str(i)}}}
        for i in range(len(values))
    ]
    spec = make_spec("cpu", env=env)
    ctx = make_context(
        spec,
        Settings(),
        fixed_artifact(ArtifactFormat.SQSH),
        secret_values={f"S{i}": v for i, v in enumerate(values)},
    )
    return render_attempt(spec, ctx).files[SECRETS_FILE].content


def files(values: list[str]) -> dict[str, StagedFile]:
    return {
        "job.sh": StagedFile(b"#!/bin/bash\necho hi\n", 0o555),
        "job.env": StagedFile(b"", 0o444),
        SECRETS_FILE: StagedFile(secrets_env(values), 0o600),
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


def _dir(root: Path, attempt: int = 1) -> Path:
    return naming.staging_dir(root, "team-a", "train", UID, attempt)


def test_parse_env_reads_what_the_renderer_writes() -> None:
    """The copy is secrets.env itself: its format is the renderer's, checked here."""
    assert parse_env(secrets_env(VALUES)) == VALUES


def test_parse_env_reads_both_formats_and_refuses_others() -> None:
    assert parse_env(b"A=x\0B=y=z\0") == ["x", "y=z"]
    assert parse_env(b"export A='it'\"'\"'s'\nexport B=plain\n") == ["it's", "plain"]
    with pytest.raises(ValueError, match="NUL"):
        parse_env(b"A=x\0B=y")
    with pytest.raises(ValueError, match="NAME=value"):
        parse_env(b"export nothing-here\n")


def test_no_copy_when_the_operator_runs_as_the_job_user(root: Path) -> None:
    """Every job runs as that uid too and could read it: nothing is kept."""
    settings = Settings(storage_root=root)
    stage_attempt(settings, _dir(root), files(VALUES))
    assert not (_dir(root).parent / record_name("attempt-1")).exists()
    assert recall(root, _dir(root), ME) is None
    # A file planted under the name is not read either.
    (_dir(root).parent / record_name("attempt-1")).write_bytes(b"A=planted\0")
    assert recall(root, _dir(root), ME) is None


@root_only
def test_the_copy_is_the_operators_and_survives_a_restart(root: Path) -> None:
    settings = Settings(storage_root=root, staging_owner=f"{JOB}:{JOB}")
    stage_attempt(settings, _dir(root), files(VALUES))
    record = _dir(root).parent / record_name("attempt-1")
    st = record.lstat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, ME)
    assert _dir(root).stat().st_uid == JOB  # the attempt directory is the job's
    assert recall(root, _dir(root), JOB) == VALUES
    # "After a restart": nothing in memory, the Secret rotated. The old value is still hidden.
    log = _dir(root) / "stdout.log"
    log.write_text(f"token={VALUES[0]}\n")
    os.chown(log, JOB, JOB)
    logs = read_attempt_logs(settings, _dir(root), ["rotated-value"])
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "token=***\n"
    # Even with the Secret gone (current values unknown), the copy is enough to redact.
    logs = read_attempt_logs(settings, _dir(root), None)
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "token=***\n"
    remove_attempt(settings, _dir(root))
    assert not record.exists()
    assert read_attempt_logs(settings, _dir(root), None) is None


@root_only
@pytest.mark.parametrize("planted", ["job-owned", "readable", "link", "hard-link", "huge"])
def test_a_copy_the_operator_did_not_write_is_refused(root: Path, planted: str) -> None:
    settings = Settings(storage_root=root, staging_owner=f"{JOB}:{JOB}")
    stage_attempt(settings, _dir(root), files(VALUES))
    record = _dir(root).parent / record_name("attempt-1")
    if planted == "job-owned":
        os.chown(record, JOB, JOB)
    elif planted == "readable":
        record.chmod(0o644)
    elif planted == "link":
        record.unlink()
        record.symlink_to(root / "elsewhere")
    elif planted == "hard-link":
        os.link(record, root / "second-name")
    else:
        with record.open("ab") as f:
            f.truncate(2 * 1024 * 1024)
    with pytest.raises(UnsafePath):
        recall(root, _dir(root), JOB)
    # The logs are still read, redacted with the current values (the copy is ignored).
    log = _dir(root) / "stdout.log"
    log.write_text("token=current-secret\n")
    os.chown(log, JOB, JOB)
    logs = read_attempt_logs(settings, _dir(root), ["current-secret"])
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "token=***\n"
