"""Removing a tree the job wrote (a walltime chain's checkpoint directory) in bounded passes:
what one pass may do, and what comes after it (issue 42).

A job decides how many files its checkpoint directory holds: millions cost minutes of
unlinks. Removed in one go, that holds a thread for minutes; removed in passes, each pass is
at most `entries` entries looked at and, once it removed something, at most `seconds` long,
so the removals pool turns over and the finalizer's wait has a bound (`FINALIZER_PASSES`
passes). What is left then is removed by the background sweep, one pass at a time."""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: Entries one pass looks at, at most: about 50 ms of unlinks on a local disk, memory for one
#: listing chunk of that many names.
PASS_ENTRIES = 5_000
#: Seconds one pass runs, at most, once it removed something (slow storage makes each entry
#: dearer: the time bound keeps a pass short there too).
PASS_SECONDS = 0.5
#: Passes the finalizer runs before it lets the deletion go on and leaves the rest to the
#: sweep: 100,000 entries, or 10 s, on the bounds above.
FINALIZER_PASSES = 20


@dataclass(frozen=True)
class PassBounds:
    entries: int = PASS_ENTRIES
    seconds: float = PASS_SECONDS


#: The bounds above.
DEFAULT_BOUNDS = PassBounds()


@dataclass(frozen=True)
class PassOutcome:
    """What one pass did. `walked_all`: it reached the end of the tree (no bound stopped it);
    `done`: nothing is left; `problems`: what it could not remove, a line each; `changed`:
    something changed under it (written to, swapped for a link), so another pass sees
    another tree."""

    removed: int
    looked_at: int
    walked_all: bool
    done: bool
    problems: tuple[str, ...] = ()
    changed: bool = False


class After(enum.Enum):
    DONE = "done"  # nothing left
    AGAIN = "again"  # another pass
    HAND_OVER = "hand over"  # the finalizer's passes are spent: the sweep goes on
    STUCK = "stuck"  # another pass would remove nothing: what is left stays, said once


def pass_goes_on(bounds: PassBounds, looked_at: int, removed: int, elapsed: float) -> bool:
    """Whether a pass looks at one more entry. The time bound stops a pass only once it
    removed something: a pass that ran out of time on listings alone would leave the next
    one where it started, and the entries bound stops it anyway."""
    if looked_at >= bounds.entries:
        return False
    return removed == 0 or elapsed < bounds.seconds


def after_pass(outcome: PassOutcome, passes: int, cap: int | None) -> After:
    """What follows the `passes`-th pass; `cap`: the passes allowed (None: no cap, the
    sweep's). A pass that walked the whole tree and left something, or removed nothing while
    nothing changed under it, found only what cannot be removed: another one would do the
    same."""
    if outcome.done:
        return After.DONE
    if outcome.walked_all or (outcome.removed == 0 and not outcome.changed):
        return After.STUCK
    if cap is not None and passes >= cap:
        return After.HAND_OVER
    return After.AGAIN
