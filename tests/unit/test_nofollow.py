"""A job owns its staging directory: what it can plant there must never make the log reader
publish a file the operator can read and the job cannot (issue 9, findings 1 and 2).

Each case builds the real layout below a storage root in tmp_path, plants one thing, and reads
the logs the way the operator does (`read_attempt_logs`, `tail_signatures`).
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from slurmjob_operator.config import Settings
from slurmjob_operator.core import naming
from slurmjob_operator.storage.logs import read_attempt_logs, read_tail, tail_signatures
from slurmjob_operator.storage.nofollow import UnsafePath, job_owner

UID = "3f2a9c1e-7b4d-4e8a-9c21-5d6e7f809a1b"
MARKER = "OPERATOR-ONLY-MARKER-5d2f"
ME = os.geteuid()
NAMES = ("stdout.log", "stderr.log")
root_only = pytest.mark.skipif(ME != 0, reason="needs root (chown, mknod)")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    root = tmp_path / "root"
    root.mkdir()
    return Settings(storage_root=root)


@pytest.fixture
def staging(settings: Settings) -> Path:
    path = naming.staging_dir(settings.storage_root, "team-a", "train", UID, 1)
    path.mkdir(parents=True)
    return path


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A file only the operator may read, outside the storage root (a token, a key)."""
    path = tmp_path / "operator-only" / "token"
    path.parent.mkdir()
    path.write_text(MARKER + "\n")
    path.chmod(0o600)
    return path


def read(settings: Settings, staging: Path) -> str:
    """What the operator would publish (UnsafePath propagates)."""
    logs = read_attempt_logs(settings, staging, [])
    assert logs is not None
    return repr(logs)


def test_a_regular_log_is_read(settings: Settings, staging: Path) -> None:
    (staging / "stdout.log").write_text("epoch 1\n")
    logs = read_attempt_logs(settings, staging, [])
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "epoch 1\n"
    assert logs.stderr is None


def test_a_symlink_at_the_log_is_not_followed(
    settings: Settings, staging: Path, secret_file: Path
) -> None:
    (staging / "stdout.log").symlink_to(secret_file)
    with pytest.raises(UnsafePath, match="symbolic link") as caught:
        read(settings, staging)
    assert MARKER not in str(caught.value)
    (staging / "stdout.log").unlink()
    (staging / "stderr.log").symlink_to("/proc/self/environ")
    with pytest.raises(UnsafePath, match="symbolic link"):
        read(settings, staging)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_a_symlink_at_a_parent_directory_is_not_followed(
    settings: Settings, staging: Path, tmp_path: Path, level: int
) -> None:
    """O_NOFOLLOW on the file alone would not do: the job owns the directories above it. A
    tree outside the root mirrors the layout, its stdout.log a plain file of the operator's
    (nothing but the link on the way is wrong); the attempt (0), resource (1) or namespace (2)
    directory is replaced by a link into it."""
    relative = staging.relative_to(settings.storage_root)
    outside = tmp_path / "outside"
    (outside / relative).mkdir(parents=True)
    (outside / relative / "stdout.log").write_text(MARKER + "\n")
    replaced = [staging, staging.parent, staging.parent.parent][level]
    replaced.rename(replaced.with_name(replaced.name + ".moved"))
    replaced.symlink_to(outside / replaced.relative_to(settings.storage_root))
    assert MARKER in (staging / "stdout.log").read_text()  # by path, it would be read
    with pytest.raises(UnsafePath, match="symbolic link"):
        read(settings, staging)
    assert tail_signatures(settings.storage_root, staging, NAMES, ME) == (None, None)


def test_a_hard_link_is_refused(settings: Settings, staging: Path, tmp_path: Path) -> None:
    other = tmp_path / "root" / "team-b-file"
    other.write_text(MARKER + "\n")
    os.link(other, staging / "stdout.log")
    with pytest.raises(UnsafePath, match="2 hard links"):
        read(settings, staging)


@root_only
def test_another_owners_file_is_refused(settings: Settings, staging: Path) -> None:
    """A hard link whose other name is gone again has one link; its owner still tells."""
    log = staging / "stdout.log"
    log.write_text(MARKER + "\n")
    os.chown(log, 4242, 4242)
    with pytest.raises(UnsafePath, match="owned by uid 4242"):
        read(settings, staging)


@root_only
def test_a_file_of_the_operator_is_refused_when_the_job_is_another_user(
    tmp_path: Path, secret_file: Path
) -> None:
    """With SLURMJOB_STAGING_OWNER the job user writes the logs: root's own files are not."""
    root = tmp_path / "root"
    root.mkdir()
    settings = Settings(storage_root=root, staging_owner="4242:4242")
    assert job_owner(settings) == 4242
    staging = naming.staging_dir(root, "team-a", "train", UID, 1)
    staging.mkdir(parents=True)
    for path in (staging, staging.parent, staging.parent.parent):
        os.chown(path, 4242, 4242)
    os.link(secret_file, staging / "stdout.log")
    secret_file.unlink()  # one link again, owned by root
    with pytest.raises(UnsafePath, match="owned by uid 0"):
        read(settings, staging)
    (staging / "stdout.log").unlink()
    (staging / "stdout.log").write_text("mine\n")
    os.chown(staging / "stdout.log", 4242, 4242)
    logs = read_attempt_logs(settings, staging, [])
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail == "mine\n"


@root_only
def test_a_directory_of_another_owner_is_refused(settings: Settings, staging: Path) -> None:
    (staging / "stdout.log").write_text("x\n")
    os.chown(staging, 4242, 4242)
    with pytest.raises(UnsafePath, match="owned by uid 4242"):
        read(settings, staging)


@pytest.mark.timeout(10)
def test_a_fifo_returns_at_once(settings: Settings, staging: Path) -> None:
    """A blocking open would stop the status updates of every namespace (finding 2)."""
    os.mkfifo(staging / "stdout.log")
    started = time.monotonic()
    with pytest.raises(UnsafePath, match="a FIFO"):
        read(settings, staging)
    assert time.monotonic() - started < 1.0
    first, _ = tail_signatures(settings.storage_root, staging, NAMES, ME)
    assert first is not None
    assert stat.S_ISFIFO(first[0])


@pytest.mark.timeout(10)
def test_a_fifo_swapped_in_after_the_check_is_caught(
    settings: Settings, staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lstat saw a regular file; the open (O_NONBLOCK) finds a FIFO: refused, at once."""
    log = staging / "stdout.log"
    log.write_text("x\n")
    real_open = os.open

    def swap_then_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None):  # type: ignore[no-untyped-def]
        if path == "stdout.log":
            log.unlink()
            os.mkfifo(log)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", swap_then_open)
    with pytest.raises(UnsafePath, match="changed while it was opened"):
        read(settings, staging)


@root_only
@pytest.mark.timeout(10)
def test_a_device_is_not_even_opened(settings: Settings, staging: Path) -> None:
    """/dev/zero would be read forever; some devices act on open. Neither is opened."""
    os.mknod(staging / "stdout.log", 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
    with pytest.raises(UnsafePath, match="a character device"):
        read(settings, staging)


def test_a_socket_is_refused(settings: Settings, staging: Path) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(staging / "stdout.log"))
        with pytest.raises(UnsafePath, match="a socket"):
            read(settings, staging)
    finally:
        server.close()


def test_a_directory_at_the_log_is_refused(settings: Settings, staging: Path) -> None:
    (staging / "stdout.log").mkdir()
    with pytest.raises(UnsafePath, match="a directory"):
        read(settings, staging)


def test_a_huge_log_is_read_within_the_cap(settings: Settings, staging: Path) -> None:
    with (staging / "stdout.log").open("wb") as f:
        f.truncate(1 << 30)  # sparse
        f.seek(1 << 30)
        f.write(b"last line\n")
    logs = read_attempt_logs(settings, staging, [])
    assert logs is not None
    assert logs.stdout is not None
    assert logs.stdout.tail.endswith("last line\n")
    assert logs.stdout.truncated


def test_the_signature_follows_no_link(
    settings: Settings, staging: Path, secret_file: Path
) -> None:
    (staging / "stdout.log").symlink_to(secret_file)
    first, second = tail_signatures(settings.storage_root, staging, NAMES, ME)
    assert second is None
    assert first is not None
    assert stat.S_ISLNK(first[0])  # the link's own metadata
    assert first[1] != secret_file.stat().st_ino


def test_the_signature_never_raises(settings: Settings, tmp_path: Path) -> None:
    assert tail_signatures(tmp_path / "no-root", tmp_path / "no-root" / "x", NAMES, ME) == (
        None,
        None,
    )
    assert tail_signatures(settings.storage_root, tmp_path / "elsewhere", NAMES, ME) == (
        None,
        None,
    )


def test_a_link_swapped_in_while_the_reader_walks_is_not_followed(
    settings: Settings, staging: Path, secret_file: Path
) -> None:
    """A job that flips its directory between a real one and a link as fast as it can: the
    reader, whatever it meets, never returns the marker."""
    (staging / "stdout.log").write_text("ok\n")
    real = staging.with_name("real")
    staging.rename(real)
    link_target = secret_file.parent
    (link_target / "stdout.log").write_text(MARKER + "\n")  # a plain file: only the link is wrong
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            try:
                staging.symlink_to(link_target)
                staging.unlink()
                real.rename(staging)
                staging.rename(real)
            except OSError:
                pass

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(300):
            try:
                text = read(settings, staging)
            except OSError:
                continue
            assert MARKER not in text
    finally:
        stop.set()
        flipper.join()


def test_read_tail_refuses_a_path_outside_the_root(settings: Settings, secret_file: Path) -> None:
    with pytest.raises(UnsafePath, match="not below the storage root"):
        read_tail(secret_file, root=settings.storage_root, owner=ME)
