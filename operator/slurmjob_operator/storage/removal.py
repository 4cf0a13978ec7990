"""One bounded removal pass over a tree the job wrote, from a directory descriptor, no link
followed (`core.removal` decides the bounds and what follows a pass).

The tree is hostile: any entry may be a link, a FIFO, a directory swapped for a link between
two calls, or deeper than any sensible tree. So:
- every entry is `lstat`ed from its directory's descriptor and a link is unlinked itself;
- a subdirectory is opened with `O_NOFOLLOW | O_DIRECTORY` from its parent's descriptor (a
  link swapped in meanwhile makes the open fail: it is left for the next pass, which sees the
  link and unlinks it);
- a pass holds at most `MAX_DEPTH` descriptors: a directory deeper than that is moved, when
  the caller gives a `spill` directory of its own, to there as an entry of its own (a rename
  from descriptor to descriptor follows no link), else reported;
- a directory is listed in chunks no longer than what is left of the pass's entries, so a
  directory of millions of names costs one chunk of memory.

Nothing is kept between passes: the next pass starts at the top again and finds what is left.
Never raises for what is below the top; the caller opens the top's parent.
"""

from __future__ import annotations

import errno
import itertools
import os
import secrets
import stat
import time
from collections.abc import Callable

from slurmjob_operator.core.removal import PassBounds, PassOutcome, pass_goes_on

#: Directories a pass descends at most (one descriptor each).
MAX_DEPTH = 64
#: Problems a pass reports at most.
MAX_PROBLEMS = 20

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Pass:
    def __init__(self, bounds: PassBounds, clock: Callable[[], float], spill: int | None) -> None:
        self.bounds = bounds
        self.clock = clock
        self.spill = spill
        self.start = clock()
        self.looked_at = 0
        self.removed = 0
        self.stopped = False  # a bound ended the pass, or something changed under it
        self.changed = False
        self.problems: list[str] = []

    def goes_on(self) -> bool:
        if not self.stopped:
            elapsed = self.clock() - self.start
            self.stopped = not pass_goes_on(self.bounds, self.looked_at, self.removed, elapsed)
        return not self.stopped

    def problem(self, path: str, exc: OSError | str) -> None:
        text = (exc.strerror or str(exc)) if isinstance(exc, OSError) else exc
        line = f"{path}: {text}"
        # The same entry is met again when its directory is listed again in the pass.
        if len(self.problems) < MAX_PROBLEMS and line not in self.problems:
            self.problems.append(line)

    def entry(
        self, parent: int, name: str, path: str, depth: int, is_dir: bool | None = None
    ) -> bool:
        """Remove `name` of `parent` as far as this pass goes; True when it is gone.
        `is_dir`: what the listing said (its `d_type`, no call), else it is `lstat`ed."""
        self.looked_at += 1
        if is_dir is None:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return self._went()
            except OSError as exc:
                self.problem(path, exc)
                return False
            is_dir = stat.S_ISDIR(st.st_mode)
        if not is_dir:
            return self._unlink(parent, name, path, directory=False)
        if depth >= MAX_DEPTH:
            return self._spill(parent, name, path)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return self._went()
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self._changed()  # swapped for something else: the next pass sees it
            else:
                self.problem(path, exc)
            return False
        try:
            emptied = self.children(fd, path, depth + 1)
        finally:
            os.close(fd)
        return emptied and self._unlink(parent, name, path, directory=True)

    def children(self, fd: int, path: str, depth: int) -> bool:
        """Remove what directory `fd` holds; True when all of it is gone."""
        gone = True
        while self.goes_on():
            left = self.bounds.entries - self.looked_at
            # A chunk read, then closed: no listing is held open while entries go.
            # The listing's type of an entry may be stale by the time it goes: a file swapped
            # for a directory fails its unlink, a directory swapped for a link its
            # O_NOFOLLOW open, and the next pass sees what is there.
            with os.scandir(fd) as listing:
                names = [
                    (e.name, e.is_dir(follow_symlinks=False))
                    for e in itertools.islice(listing, left)
                ]
            if not names:
                return gone
            kept = 0
            for name, is_dir in names:
                if not self.goes_on():
                    return False
                if not self.entry(fd, name, f"{path}/{name}", depth, is_dir):
                    gone = False
                    kept += 1
            if self.stopped or kept == len(names):
                # Only what stays was listed: listing again would show the same.
                return False
            os.lseek(fd, 0, os.SEEK_SET)  # the next chunk from the start: it moved under us
        return False

    def _unlink(self, parent: int, name: str, path: str, *, directory: bool) -> bool:
        try:
            if directory:
                os.rmdir(name, dir_fd=parent)
            else:
                os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            return self._went()
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                self._changed()  # written to, or swapped, meanwhile: the next pass goes on
            else:
                self.problem(path, exc)
            return False
        return self._went()

    def _changed(self) -> None:
        self.stopped = self.changed = True

    def _went(self) -> bool:
        # Gone, by this pass or by another one on the same tree at the same time (the
        # finalizer's and the sweep's may meet): progress either way.
        self.removed += 1
        return True

    def _spill(self, parent: int, name: str, path: str) -> bool:
        if self.spill is None:
            self.problem(path, f"deeper than {MAX_DEPTH} levels")
            return False
        try:
            os.rename(name, spill_name(), src_dir_fd=parent, dst_dir_fd=self.spill)
        except OSError as exc:
            self.problem(path, exc)
            return False
        return self._went()


def spill_name() -> str:
    """A fresh name for an entry of the spill directory."""
    return f"deep-{secrets.token_hex(8)}"


def remove_pass(
    parent: int,
    name: str,
    bounds: PassBounds,
    *,
    spill: int | None = None,
    shown: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> PassOutcome:
    """One pass removing `name` of directory `parent` (whatever it is: a link is removed
    itself). Problems name paths from `shown` (else `name`). `spill`: a directory of the
    caller's own where a directory deeper than `MAX_DEPTH` goes as an entry of its own."""
    work = _Pass(bounds, clock, spill)
    work.entry(parent, name, name if shown is None else shown, 0)
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
        done = False
    except FileNotFoundError:
        done = True
    return PassOutcome(
        removed=work.removed,
        looked_at=work.looked_at,
        walked_all=not work.stopped,
        done=done,
        problems=tuple(work.problems),
        changed=work.changed,
    )
