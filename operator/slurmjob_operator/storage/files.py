"""Writing a file so that a reader sees the old or the new one, never a mix."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_atomically(
    path: Path,
    content: bytes,
    mode: int = 0o600,
    *,
    owner: tuple[int, int] | None = None,
    exclusive: bool = False,
) -> None:
    """Write `content` to a temporary file beside `path` (never through a link), fsync it,
    then rename it over `path` or, with `exclusive`, link it there (FileExistsError when the
    name is taken: nothing is overwritten)."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
