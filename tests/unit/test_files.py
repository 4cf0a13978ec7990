"""The one atomic-write helper (staging files and LocalStore's state files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmjob_operator.storage.files import write_atomically


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ns" / "obj.json"
    path.parent.mkdir()
    write_atomically(path, b"old\n")

    def broken_replace(src: str, dst: str, **dir_fds: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        write_atomically(path, b"new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in path.parent.iterdir()] == ["obj.json"]


def test_a_write_replaces_the_file_by_rename(tmp_path: Path) -> None:
    path = tmp_path / "obj.json"
    write_atomically(path, b"one\n")
    inode = path.stat().st_ino
    write_atomically(path, b"two\n")
    assert path.read_text() == "two\n"
    assert path.stat().st_ino != inode, "a new file renamed over the old one, not rewritten"


def test_exclusive_refuses_an_existing_name_and_leaves_it(tmp_path: Path) -> None:
    path = tmp_path / "obj.json"
    write_atomically(path, b"first\n", exclusive=True)
    with pytest.raises(FileExistsError):
        write_atomically(path, b"second\n", exclusive=True)
    assert path.read_bytes() == b"first\n"
    assert [p.name for p in tmp_path.iterdir()] == ["obj.json"]


def test_mode_and_no_write_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    link = tmp_path / "obj"
    link.symlink_to(target)
    write_atomically(link, b"new", 0o640)
    assert target.read_bytes() == b"keep", "the link is replaced, its target untouched"
    assert not link.is_symlink()
    assert link.stat().st_mode & 0o777 == 0o640
