"""The batch script's check of an image-cache entry (issue 44, section 4): the node compares
what the import job recorded (type, owner, mode, size, inode, ctime) and never hashes the
image, so the check costs the same for any size; anything that touched the file fails it."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from tests.unit.test_render_support import (
    artifact_bytes,
    make_context,
    make_spec,
    run_attempt,
    stand_in_settings,
)

from slurmjob_operator.site.artifacts import ArtifactError, CachedImage, verify_cached
from slurmjob_operator.site.catalogs import ArtifactFormat
from slurmjob_operator.site.render import render_attempt

WRONG_SHA256 = "0" * 64


def _entry(tmp_path: Path) -> tuple[Path, CachedImage]:
    """A published entry as the import job leaves it: read-only, recorded as `stat` sees it."""
    path = tmp_path / "cache" / "entries" / "tenant-a" / "sha256-ab.sqsh"
    path.parent.mkdir(parents=True)
    path.write_bytes(artifact_bytes(ArtifactFormat.SQSH, b"image" * 1000))
    path.chmod(0o444)
    return path, _recorded(path)


def _recorded(path: Path) -> CachedImage:
    info = path.lstat()
    return CachedImage(
        id="127.0.0.1:5000/slurmjob/base@sha256:" + "ab" * 32,
        format=ArtifactFormat.SQSH,
        node_path=PurePosixPath(path),
        operator_path=path,
        # Not the file's: a node that hashed the image would refuse it.
        sha256=WRONG_SHA256,
        size=info.st_size,
        inode=info.st_ino,
        ctime_ns=info.st_ctime_ns,
        owner_uid=info.st_uid,
    )


def test_an_unchanged_entry_runs_without_being_hashed(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    _, image = _entry(tmp_path)
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, image))
    script = rendered.files["job.sh"].content.decode()
    assert f"artifact_recorded='{image.recorded}'" in script
    run = run_attempt(rendered, settings, tmp_path / "w")
    assert run.returncode == 0, run.stderr
    assert run.steps


def _chmod(path: Path) -> None:
    path.chmod(0o644)
    path.chmod(0o444)


def _rewrite(path: Path) -> None:
    path.chmod(0o644)
    with path.open("r+b") as handle:
        handle.seek(100)
        handle.write(b"X")
    path.chmod(0o444)


def _replace(path: Path) -> None:
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    path.chmod(0o444)


def _symlink(path: Path) -> None:
    other = path.with_name("other.sqsh")
    path.rename(other)
    os.symlink(other, path)


def _writable(path: Path) -> None:
    path.chmod(0o644)


@pytest.mark.parametrize("change", [_chmod, _rewrite, _replace, _symlink, _writable])
def test_a_touched_entry_is_refused(tmp_path: Path, change: object) -> None:
    settings = stand_in_settings(tmp_path)
    path, image = _entry(tmp_path)
    assert callable(change)
    change(path)
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, image))
    run = run_attempt(rendered, settings, tmp_path / "w")
    assert run.returncode == 97
    assert "is not the file its import recorded" in run.stderr
    assert run.steps == []


def test_an_entry_without_its_magic_is_refused_first(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path)
    path, image = _entry(tmp_path)
    path.chmod(0o644)
    path.write_bytes(b"hsqz" + path.read_bytes()[4:])
    spec = make_spec("cpu")
    rendered = render_attempt(spec, make_context(spec, settings, image))
    run = run_attempt(rendered, settings, tmp_path / "w")
    assert run.returncode == 97
    assert "no hsqs magic" in run.stderr


def test_the_operator_checks_the_record_before_submission(tmp_path: Path) -> None:
    _path, image = _entry(tmp_path)
    verify_cached(image)  # unchanged: no hash, whatever sha256 says


@pytest.mark.parametrize("change", [_chmod, _rewrite, _replace, _symlink, _writable])
def test_the_operator_refuses_a_touched_entry(tmp_path: Path, change: object) -> None:
    path, image = _entry(tmp_path)
    assert callable(change)
    change(path)
    with pytest.raises(ArtifactError, match="is not the file its import recorded"):
        verify_cached(image)


def test_the_operator_refuses_a_missing_entry(tmp_path: Path) -> None:
    path, image = _entry(tmp_path)
    path.unlink()
    with pytest.raises(ArtifactError, match="missing from the image cache"):
        verify_cached(image)
