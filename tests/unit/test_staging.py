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
    is_staged,
    parse_owner,
    remove_attempt,
    remove_resource_dir,
    remove_secrets,
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
    elsewhere = naming.staging_dir(other.storage_root, "team-b", "resnet", UID, 2)
    stage_attempt(other, elsewhere, FILES)
    assert elsewhere.stat().st_uid == 4321


def test_parse_owner() -> None:
    assert parse_owner(None) is None
    assert parse_owner("1000:100") == (1000, 100)


def test_remove(settings: Settings) -> None:
    stage_attempt(settings, _dir(settings, 1), FILES)
    stage_attempt(settings, _dir(settings, 2), FILES)
    remove_attempt(settings, _dir(settings, 1))
    remove_attempt(settings, _dir(settings, 1))  # idempotent
    assert not _dir(settings, 1).exists()
    assert _dir(settings, 2).exists()
    resource = naming.resource_dir(settings.storage_root, "team-a", "resnet", UID)
    remove_resource_dir(settings, "team-a", "resnet", UID)
    remove_resource_dir(settings, "team-a", "resnet", UID)
    assert not resource.exists()
    assert resource.parent.exists()  # the namespace directory stays
    with pytest.raises(StagingError):
        remove_attempt(settings, settings.storage_root)
    with pytest.raises(StagingError):
        remove_attempt(settings, resource)


# -- what a job (or anyone) may have planted (issue 9, finding 7) ----------------------------

ME = os.geteuid()
root_only = pytest.mark.skipif(ME != 0, reason="needs root (chown, mknod)")


def _plant(settings: Settings) -> Path:
    """An attempt directory someone made before the operator did."""
    attempt = _dir(settings)
    attempt.mkdir(parents=True)
    return attempt


def test_a_restage_after_a_crash_completes_and_drops_temporaries(settings: Settings) -> None:
    attempt = _plant(settings)
    (attempt / "job.env").write_bytes(b"partial")
    (attempt / ".job.sh.0123456789ab.tmp").write_bytes(b"half a scr")
    stage_attempt(settings, attempt, FILES)
    assert sorted(p.name for p in attempt.iterdir()) == ["job.env", "job.sh", "secrets.env"]
    assert (attempt / "job.sh").read_bytes() == FILES["job.sh"].content


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("stdout.log", "staging never writes"),  # the job cannot have run before the stage
        ("payload", "staging never writes"),
        (".job.sh.zz.tmp", "staging never writes"),
    ],
)
def test_a_planted_directory_with_other_files_is_refused(
    settings: Settings, name: str, why: str
) -> None:
    attempt = _plant(settings)
    (attempt / name).write_bytes(b"x")
    with pytest.raises(StagingError, match=why):
        stage_attempt(settings, attempt, FILES)
    assert not (attempt / "job.sh").exists()


def test_a_planted_job_sh_link_is_refused_and_not_read(settings: Settings, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.sh"
    elsewhere.write_bytes(FILES["job.sh"].content)  # even with the right content
    attempt = _plant(settings)
    (attempt / "job.sh").symlink_to(elsewhere)
    with pytest.raises(StagingError, match="not a regular file"):
        stage_attempt(settings, attempt, FILES)
    (attempt / "job.sh").unlink()
    # /dev/zero read by path would take all memory (it did, before the fix); /dev/null shows
    # the same refusal without taking the test run down if the fix is ever lost.
    (attempt / "job.sh").symlink_to("/dev/null")
    with pytest.raises(StagingError, match="not a regular file"):
        stage_attempt(settings, attempt, FILES)
    assert elsewhere.read_bytes() == FILES["job.sh"].content


@pytest.mark.timeout(10)
def test_a_planted_fifo_is_refused_at_once(settings: Settings) -> None:
    attempt = _plant(settings)
    os.mkfifo(attempt / "job.env")
    with pytest.raises(StagingError, match="not a regular file"):
        stage_attempt(settings, attempt, FILES)


@root_only
@pytest.mark.timeout(10)
def test_a_planted_device_is_refused(settings: Settings) -> None:
    attempt = _plant(settings)
    os.mknod(attempt / "job.sh", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
    with pytest.raises(StagingError, match="not a regular file"):
        stage_attempt(settings, attempt, FILES)


def test_a_planted_hard_link_is_refused(settings: Settings, tmp_path: Path) -> None:
    other = settings.storage_root / "other-file"
    other.write_bytes(FILES["job.env"].content)
    attempt = _plant(settings)
    os.link(other, attempt / "job.env")
    with pytest.raises(StagingError, match="one link"):
        stage_attempt(settings, attempt, FILES)


def test_a_planted_subdirectory_is_refused(settings: Settings) -> None:
    attempt = _plant(settings)
    (attempt / "job.sh").mkdir()
    with pytest.raises(StagingError, match="not a regular file"):
        stage_attempt(settings, attempt, FILES)


@root_only
def test_a_planted_directory_of_another_owner_is_refused(settings: Settings) -> None:
    attempt = _plant(settings)
    os.chown(attempt, 4242, 4242)
    with pytest.raises(StagingError, match="owned by uid 4242"):
        stage_attempt(settings, attempt, FILES)
    os.chown(attempt, ME, ME)
    (attempt / "job.env").write_bytes(b"partial")
    os.chown(attempt / "job.env", 4242, 4242)
    with pytest.raises(StagingError, match="job user"):
        stage_attempt(settings, attempt, FILES)


def test_an_oversized_job_sh_is_read_only_up_to_its_expected_size(settings: Settings) -> None:
    import tracemalloc

    attempt = _plant(settings)
    with (attempt / "job.sh").open("wb") as f:
        f.truncate(256 * 1024 * 1024)  # sparse: read whole, it costs 256 MiB
    tracemalloc.start()
    try:
        with pytest.raises(StagingError, match="immutable"):
            stage_attempt(settings, attempt, FILES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


@pytest.mark.parametrize("level", [0, 1])
def test_a_link_at_the_attempt_or_resource_directory_is_refused(
    settings: Settings, tmp_path: Path, level: int
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = [_dir(settings), _dir(settings).parent][level]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside)
    with pytest.raises(StagingError, match="symbolic link"):
        stage_attempt(settings, _dir(settings), FILES)
    assert list(outside.iterdir()) == []


def test_removal_unlinks_a_planted_link_never_its_target(
    settings: Settings, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secrets.env").write_bytes(b"keep")
    (victim / "data").write_bytes(b"keep")
    attempt = _dir(settings)
    attempt.parent.mkdir(parents=True)
    attempt.symlink_to(victim)
    remove_secrets(settings, attempt)
    assert (victim / "secrets.env").exists(), "no secrets.env removed through a link"
    remove_attempt(settings, attempt)
    assert not attempt.is_symlink()
    assert sorted(p.name for p in victim.iterdir()) == ["data", "secrets.env"]
    resource = attempt.parent
    resource.rmdir()
    resource.symlink_to(victim)
    remove_resource_dir(settings, "team-a", "resnet", UID)
    assert not resource.is_symlink()
    assert sorted(p.name for p in victim.iterdir()) == ["data", "secrets.env"]


def test_removal_goes_through_no_link_below(settings: Settings, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secrets.env").write_bytes(b"keep")
    stage_attempt(settings, _dir(settings), FILES)
    (_dir(settings) / "inner").symlink_to(victim)
    (_dir(settings, 2)).symlink_to(victim)
    remove_resource_dir(settings, "team-a", "resnet", UID)
    assert not _dir(settings).parent.exists()
    assert (victim / "secrets.env").read_bytes() == b"keep"


def test_is_staged(settings: Settings, tmp_path: Path) -> None:
    assert not is_staged(settings, _dir(settings))
    stage_attempt(settings, _dir(settings), FILES)
    assert is_staged(settings, _dir(settings))
    other = tmp_path / "other"
    other.mkdir()
    _dir(settings, 2).symlink_to(other)
    # Cannot be told safely: counted as staged, so an attempt that may have been sent is
    # never submitted again.
    assert is_staged(settings, _dir(settings, 2))


@root_only
def test_a_directory_the_operator_made_but_had_not_handed_over_is_taken(
    settings: Settings,
) -> None:
    """The operator stopped between its mkdir and the chown: its own directory, still root's."""
    attempt = _plant(settings)
    for path in (attempt.parent, attempt.parent.parent):
        os.chown(path, 1234, 5678)
    (attempt / ".job.env.0123456789ab.tmp").write_bytes(b"half")  # made before its fchown
    stage_attempt(settings, attempt, FILES, owner=(1234, 5678))
    assert attempt.stat().st_uid == 1234
    assert sorted(p.name for p in attempt.iterdir()) == ["job.env", "job.sh", "secrets.env"]
