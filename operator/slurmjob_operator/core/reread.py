"""A site file read again while the operator runs: take its new content or keep the last good
copy (`site.catalogwatch` reads the runtime registry and the GPU series catalog this way).

The file is the platform admin's and was valid when the operator started (a bad one stops the
start: there is no copy to keep yet). An edit made later that does not read, parse or validate
must not take the catalog away from the SlurmJobs still to be submitted, nor half-apply: the
copy in use stays whole until the file holds a valid edit, and the refusal is said once per
refused content, not once per look at the file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")


class Outcome(StrEnum):
    UNCHANGED = "unchanged"
    """The file holds the content of the copy in use (again, when a refused edit was undone)."""
    LOADED = "loaded"
    """New content that validates: it is the copy in use from now on."""
    REFUSED = "refused"
    """New content that does not read, parse or validate: the last good copy stays in use."""
    STILL_REFUSED = "still-refused"
    """The content refused last time, looked at again: nothing new to say."""


@dataclass(frozen=True)
class FileCopy:
    """What is known of one file: the copy in use, and the edit refused after it, if any."""

    name: str
    """The file as messages name it (its path)."""
    digest: str
    """sha256 of the bytes of the copy in use."""
    loaded_at: float
    """When those bytes were read (Unix time)."""
    refused: str | None = None
    """Why the file's present content is refused (None: the copy in use is the file's)."""
    refused_key: str | None = None
    """What was refused: the content's sha256, or the read error (never refused twice)."""

    @property
    def stale(self) -> bool:
        """The file holds an edit that was refused: the copy in use is an older one."""
        return self.refused is not None


@dataclass(frozen=True)
class Reread(Generic[T]):
    copy: FileCopy
    """The file's state from now on."""
    outcome: Outcome
    value: T | None = None
    """The new copy to use (LOADED only)."""


def digest_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _key(read: bytes | OSError) -> str:
    # A read error's key cannot be a digest (64 hex digits): the two never compare equal.
    if isinstance(read, OSError):
        return f"error {read.errno}: {read.strerror}"
    return digest_of(read)


def reread(
    copy: FileCopy, read: bytes | OSError, parse: Callable[[bytes], T], now: float
) -> Reread[T]:
    """What the file's content (or the error reading it) makes of `copy`. `parse` is the
    validation the file had at start; it raises ValueError (the loaders' CatalogError) naming
    the file and the entry."""
    key = _key(read)
    if key == copy.digest:
        return Reread(replace(copy, refused=None, refused_key=None), Outcome.UNCHANGED)
    if key == copy.refused_key:
        return Reread(copy, Outcome.STILL_REFUSED)
    try:
        if isinstance(read, OSError):
            raise ValueError(f"{copy.name}: cannot read: {read.strerror or read}")
        value = parse(read)
    except ValueError as exc:
        return Reread(replace(copy, refused=str(exc), refused_key=key), Outcome.REFUSED)
    return Reread(FileCopy(copy.name, key, now), Outcome.LOADED, value)
