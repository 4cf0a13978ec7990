"""Staging: layout, modes, atomic immutable files, idempotent retries, cleanup."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurmjob_operator.config import Settings
from slurmjob_operator.core import naming
from slurmjob_operator.storage.staging import (
    StagedFile,
    StagingError,
    parse_owner,
    remove_attempt,
    remove_resource_dir,
    stage_attempt,
)

UID = "3f2a9c1e-7b4d-4e8a-9c21-5d6e7f809a1b"
FILES = {
    "job.sh": StagedFile(b"#!/bin/bash\necho hi\n", 0o555),
    "job.env": StagedFile(b"export A=1\n", 0o444),
    "secrets.env": StagedFile(b"export TOKEN=hunter22\n", 0o600),
}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    root = tmp_path / "root"
    root.mkdir()
    return Settings(storage_root=root)


def _dir(settings: Settings, attempt: int = 1) -> Path:
    return naming.staging_dir(settings.storage_root, "team-a", "resnet", UID, attempt)


def test_layout_and_modes(settings: Settings) -> None:
    old = os.umask(0o077)
    try:
        stage_attempt(settings, _dir(settings), FILES)
    finally:
        os.umask(old)
    attempt = _dir(settings)
    assert attempt == settings.storage_root / "team-a" / "resnet-3f2a9c1e" / "attempt-1"
    assert _mode(attempt) == 0o755
    assert _mode(attempt.parent) == 0o755
    assert _mode(attempt.parent.parent) == 0o755
    assert {p.name: _mode(p) for p in attempt.iterdir()} == {
        "job.sh": 0o555,
        "job.env": 0o444,
        "secrets.env": 0o600,
    }
    for name, staged in FILES.items():
        assert (attempt / name).read_bytes() == staged.content
    assert "hunter22" not in repr(FILES["secrets.env"])


def test_identical_restage_is_a_noop(settings: Settings) -> None:
    stage_attempt(settings, _dir(settings), FILES)
    before = {p.name: p.stat().st_ino for p in _dir(settings).iterdir()}
    (_dir(settings) / "secrets.env").unlink()  # consumed by the job
    stage_attempt(settings, _dir(settings), FILES)
    after = {p.name: p.stat().st_ino for p in _dir(settings).iterdir()}
    assert after == {k: v for k, v in before.items() if k != "secrets.env"}


@pytest.mark.parametrize("name", ["job.sh", "job.env"])
def test_different_content_is_refused(settings: Settings, name: str) -> None:
    stage_attempt(settings, _dir(settings), FILES)
    changed = dict(FILES)
    changed[name] = StagedFile(b"something else\n", FILES[name].mode)
    with pytest.raises(StagingError, match="immutable"):
        stage_attempt(settings, _dir(settings), changed)
    assert (_dir(settings) / name).read_bytes() == FILES[name].content


def test_interrupted_stage_is_completed(settings: Settings) -> None:
    """Without job.sh (written last) a stage is incomplete and is simply written again."""
    attempt = _dir(settings)
    attempt.mkdir(parents=True)
    (attempt / "job.env").write_bytes(b"partial")
    stage_attempt(settings, attempt, FILES)
    assert (attempt / "job.env").read_bytes() == FILES["job.env"].content
    assert not [p for p in attempt.iterdir() if p.name.startswith(".")]


def test_refusals(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="storage root"):
        stage_attempt(settings, tmp_path / "elsewhere" / "attempt-1", FILES)
    with pytest.raises(StagingError, match=r"job\.sh"):
        stage_attempt(settings, _dir(settings), {"job.env": FILES["job.env"]})
    with pytest.raises(StagingError, match="plain file name"):
        stage_attempt(settings, _dir(settings), {**FILES, "../x": FILES["job.env"]})
    missing = Settings(storage_root=tmp_path / "absent")
    with pytest.raises(StagingError, match="does not exist"):
        stage_attempt(missing, _dir(missing), FILES)


def test_symlinks_are_refused(settings: Settings, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (settings.storage_root / "team-a").symlink_to(outside)
    with pytest.raises(StagingError, match="symbolic link"):
        stage_attempt(settings, _dir(settings), FILES)
    assert list(outside.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_owner(settings: Settings) -> None:
    stage_attempt(settings, _dir(settings), FILES, owner=(1234, 5678))
    for path in [_dir(settings), *_dir(settings).iterdir()]:
        assert (path.stat().st_uid, path.stat().st_gid) == (1234, 5678)
    other = Settings(storage_root=settings.storage_root, staging_owner="4321:8765")
    stage_attempt(other, _dir(other, 2), FILES)
    assert _dir(other, 2).stat().st_uid == 4321


def test_parse_owner() -> None:
    assert parse_owner(None) is None
    assert parse_owner("1000:100") == (1000, 100)


def test_remove(settings: Settings) -> None:
    stage_attempt(settings, _dir(settings, 1), FILES)
    stage_attempt(settings, _dir(settings, 2), FILES)
    remove_attempt(_dir(settings, 1))
    remove_attempt(_dir(settings, 1))  # idempotent
    assert not _dir(settings, 1).exists()
    assert _dir(settings, 2).exists()
    resource = naming.resource_dir(settings.storage_root, "team-a", "resnet", UID)
    remove_resource_dir(settings.storage_root, "team-a", "resnet", UID)
    remove_resource_dir(settings.storage_root, "team-a", "resnet", UID)
    assert not resource.exists()
    assert resource.parent.exists()  # the namespace directory stays
    with pytest.raises(StagingError):
        remove_attempt(settings.storage_root)
