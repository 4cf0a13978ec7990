"""Runtime artifacts: location under the storage root, magic, completeness, hash, cache."""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmjob_operator.config import Settings
from slurmjob_operator.site import artifacts
from slurmjob_operator.site.artifacts import (
    ArtifactError,
    artifact_path,
    clear_cache,
    verify_artifact,
)
from slurmjob_operator.site.catalogs import RuntimeArtifact


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_cache()
    yield
    clear_cache()


def squashfs(payload: bytes = b"", *, major: int = 4, claimed: int | None = None) -> bytes:
    """A SquashFS 4 superblock (96 bytes) whose bytes_used matches the file, then payload."""
    size = 96 + len(payload)
    block = bytearray(96)
    block[0:4] = b"hsqs"
    struct.pack_into("<H", block, 28, major)
    struct.pack_into("<Q", block, 40, size if claimed is None else claimed)
    return bytes(block) + payload


def sif(payload: bytes = b"") -> bytes:
    return b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\0" + payload


def write(root: Path, rel: str, data: bytes, fmt: str = "sqsh") -> tuple[Path, RuntimeArtifact]:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    artifact = RuntimeArtifact(
        id=f"custom-{path.stem}", format=fmt, path=rel, sha256=hashlib.sha256(data).hexdigest()
    )
    return path, artifact


def test_good_sqsh_and_sif(tmp_path: Path) -> None:
    path, artifact = write(tmp_path, "rt/a.sqsh", squashfs(os.urandom(5000)))
    verify_artifact(path, artifact)
    path, artifact = write(tmp_path, "rt/b.sif", sif(os.urandom(3000)), "sif")
    verify_artifact(path, artifact)


def test_padded_sqsh_is_fine(tmp_path: Path) -> None:
    data = squashfs(b"x" * 100) + b"\0" * 4000  # images are padded past bytes_used
    path, artifact = write(tmp_path, "rt/a.sqsh", data)
    verify_artifact(path, artifact)


def test_large_file_hashes_in_chunks(tmp_path: Path) -> None:
    data = squashfs(os.urandom(artifacts.CHUNK * 2 + 17))
    path, artifact = write(tmp_path, "rt/big.sqsh", data)
    verify_artifact(path, artifact)


def test_missing(tmp_path: Path) -> None:
    _, artifact = write(tmp_path, "rt/a.sqsh", squashfs())
    with pytest.raises(ArtifactError, match=r"missing.*no fallback to a registry pull"):
        verify_artifact(tmp_path / "rt/gone.sqsh", artifact)


def test_directory_is_not_an_artifact(tmp_path: Path) -> None:
    _, artifact = write(tmp_path, "rt/a.sqsh", squashfs())
    with pytest.raises(ArtifactError, match="not a regular file"):
        verify_artifact(tmp_path / "rt", artifact)


@pytest.mark.parametrize(
    ("data", "fmt", "message"),
    [
        pytest.param(b"PK\x03\x04" + bytes(200), "sqsh", "not a SquashFS image", id="zip-as-sqsh"),
        pytest.param(sif(b"x" * 100), "sqsh", "not a SquashFS image", id="sif-as-sqsh"),
        pytest.param(squashfs(b"x" * 100), "sif", "not a SIF image", id="sqsh-as-sif"),
        pytest.param(bytes(32) + b"NOT_MAGIC" + bytes(10), "sif", "not a SIF image", id="bad-sif"),
        pytest.param(b"", "sqsh", "truncated: 0 bytes", id="empty-sqsh"),
        pytest.param(b"hsq", "sqsh", "truncated: 3 bytes", id="partial-magic"),
        pytest.param(squashfs()[:60], "sqsh", "truncated: 60 bytes", id="half-superblock"),
        pytest.param(
            squashfs(b"x" * 100, claimed=4096),
            "sqsh",
            "truncated: 196 bytes, but its superblock says 4096",
            id="cut-short",
        ),
        pytest.param(squashfs(major=3), "sqsh", "SquashFS version 3", id="old-squashfs"),
        pytest.param(sif()[:36], "sif", "truncated: 36 bytes", id="cut-sif-header"),
        pytest.param(b"", "sif", "truncated: 0 bytes", id="empty-sif"),
    ],
)
def test_wrong_or_truncated_files_are_fatal(
    tmp_path: Path, data: bytes, fmt: str, message: str
) -> None:
    path, artifact = write(tmp_path, f"rt/a.{fmt}", data, fmt)
    with pytest.raises(ArtifactError, match=message):
        verify_artifact(path, artifact)


def test_hash_mismatch_shows_both_hashes(tmp_path: Path) -> None:
    path, artifact = write(tmp_path, "rt/a.sqsh", squashfs(b"original"))
    path.write_bytes(squashfs(b"replaced"))
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ArtifactError) as caught:
        verify_artifact(path, artifact)
    text = str(caught.value)
    assert artifact.sha256 in text
    assert actual in text
    assert "custom-a" in text


@pytest.fixture
def hash_calls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = artifacts._hash_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(artifacts, "_hash_file", counting)
    return calls


def test_unchanged_file_is_hashed_once(tmp_path: Path, hash_calls: list[Path]) -> None:
    path, artifact = write(tmp_path, "rt/a.sqsh", squashfs(b"abc"))
    for _ in range(3):
        verify_artifact(path, artifact)
    assert len(hash_calls) == 1


def test_changed_mtime_is_hashed_again(tmp_path: Path, hash_calls: list[Path]) -> None:
    path, artifact = write(tmp_path, "rt/a.sqsh", squashfs(b"abc"))
    verify_artifact(path, artifact)
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    verify_artifact(path, artifact)
    assert len(hash_calls) == 2


def test_failures_are_not_cached(tmp_path: Path, hash_calls: list[Path]) -> None:
    path, artifact = write(tmp_path, "rt/a.sqsh", squashfs(b"abc"))
    good = path.read_bytes()
    path.write_bytes(squashfs(b"abd"))
    for _ in range(2):
        with pytest.raises(ArtifactError, match="sha256"):
            verify_artifact(path, artifact)
    assert len(hash_calls) == 2
    path.write_bytes(good)
    verify_artifact(path, artifact)


def test_cache_is_keyed_by_expected_hash(tmp_path: Path, hash_calls: list[Path]) -> None:
    path, artifact = write(tmp_path, "rt/a.sqsh", squashfs(b"abc"))
    verify_artifact(path, artifact)
    other = artifact.model_copy(update={"sha256": "f" * 64})
    with pytest.raises(ArtifactError, match="sha256"):
        verify_artifact(path, other)
    assert len(hash_calls) == 2


# -- artifact_path ------------------------------------------------------------------------------


def test_artifact_path_is_under_the_root(tmp_path: Path) -> None:
    path, artifact = write(tmp_path, "rt/a.sqsh", squashfs())
    assert artifact_path(Settings(storage_root=tmp_path), artifact) == path


def test_symlink_inside_the_root_is_fine(tmp_path: Path) -> None:
    real, artifact = write(tmp_path, "rt/v2/a.sqsh", squashfs())
    link = tmp_path / "rt" / "current.sqsh"
    link.symlink_to(real)
    current = artifact.model_copy(update={"path": "rt/current.sqsh"})
    assert artifact_path(Settings(storage_root=tmp_path), current) == link
    verify_artifact(link, current)


def test_symlink_escaping_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside, artifact = write(tmp_path, "elsewhere/a.sqsh", squashfs())
    (root / "rt").mkdir(parents=True)
    (root / "rt" / "a.sqsh").symlink_to(outside)
    escaping = artifact.model_copy(update={"path": "rt/a.sqsh"})
    with pytest.raises(ArtifactError, match="outside the storage root"):
        artifact_path(Settings(storage_root=root), escaping)


def test_symlinked_directory_escaping_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    write(tmp_path, "elsewhere/a.sqsh", squashfs())
    (root / "rt").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    artifact = RuntimeArtifact(id="custom-a", format="sqsh", path="rt/a.sqsh", sha256="0" * 64)
    with pytest.raises(ArtifactError, match="outside the storage root"):
        artifact_path(Settings(storage_root=root), artifact)


def test_symlinked_root_is_fine(tmp_path: Path) -> None:
    real_root = tmp_path / "lustre"
    _, artifact = write(real_root, "rt/a.sqsh", squashfs())
    root = tmp_path / "root-link"
    root.symlink_to(real_root, target_is_directory=True)
    assert artifact_path(Settings(storage_root=root), artifact) == root / "rt" / "a.sqsh"
