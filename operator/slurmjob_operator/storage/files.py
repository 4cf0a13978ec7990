"""Writing a file so that a reader sees the old or the new one, never a mix."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_at(
    dir_fd: int,
    name: str,
    content: bytes,
    mode: int = 0o600,
    *,
    owner: tuple[int, int] | None = None,
    exclusive: bool = False,
    prepare: Callable[[int], None] | None = None,
) -> None:
    """Write `content` to a new temporary file in the directory `dir_fd` (created O_EXCL and
    O_NOFOLLOW: never through a link, never an existing file), fsync it, then rename it over
    `name` (a link already there is replaced, not followed) or, with `exclusive`, link it
    there (FileExistsError when the name is taken: nothing is overwritten). The file is 0600
    until it has its owner and final mode. `prepare` is called with the temporary file's
    descriptor after its last fchmod and before it is put in place (an ACL grant)."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _CREATE, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])
            os.fchmod(fd, mode)
            if prepare is not None:
                prepare(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        else:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)


def write_atomically(
    path: Path,
    content: bytes,
    mode: int = 0o600,
    *,
    owner: tuple[int, int] | None = None,
    exclusive: bool = False,
) -> None:
    """`write_at` in `path`'s directory (a trusted one: it is opened by its name)."""
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        write_at(dir_fd, path.name, content, mode, owner=owner, exclusive=exclusive)
    finally:
        os.close(dir_fd)
