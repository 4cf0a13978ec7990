"""Sets of array task indices as text: the compact form the status keeps ("0-19", "4,7"), and
the task strings Slurm reports for the pending tasks of an array ("2-5%2", "1,3-9:2").

Both kinds of text are untrusted (a status can be written by others, and slurmrestd's answers
are hostile input): every parse is linear in its text, bounded in what it produces, and a
text it cannot read is refused (`ValueError`) or read as nothing, never guessed at.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

from slurmjob_operator.api.status import MAX_ARRAY_TASKS as MAX_TASKS
from slurmjob_operator.api.status import MAX_INDEX_TEXT as MAX_TEXT

_DIGITS = frozenset("0123456789")
#: Ranges with a step (`1-9:2`) are checked one by one; Slurm writes few, if any.
_MAX_STEPPED = 64


def compact(indices: Iterable[int]) -> str:
    """Sorted, deduplicated indices as ranges: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    ordered = sorted(set(indices))
    parts: list[str] = []
    start = prev = None
    for index in ordered:
        if start is None:
            start = prev = index
        elif prev is not None and index == prev + 1:
            prev = index
        else:
            parts.append(_range(start, prev))
            start = prev = index
    if start is not None:
        parts.append(_range(start, prev))
    return ",".join(parts)


def _range(start: int, end: int | None) -> str:
    return str(start) if end is None or end == start else f"{start}-{end}"


def _number(text: str, digits: int = 7) -> int:
    if not text or len(text) > digits or not set(text) <= _DIGITS:
        raise ValueError(f"{text[:20]!r} is not an index")
    return int(text)


def expand(text: str | None, *, below: int = MAX_TASKS) -> list[int]:
    """The sorted indices of a compact text, each below `below`; ValueError when the text is
    not one `compact` could have written (too long, not ranges of ASCII numbers, a range
    backwards, an index out of bounds)."""
    if text is None or text == "":
        return []
    if len(text) > MAX_TEXT:
        raise ValueError("the index list is too long")
    found: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.partition("-")
        first = _number(low)
        last = _number(high) if sep else first
        if last < first:
            raise ValueError(f"{part[:20]!r} is a range backwards")
        if last >= below:
            raise ValueError(f"index {last} is out of bounds (below {below})")
        found.update(range(first, last + 1))
        if len(found) > MAX_TASKS:
            raise ValueError("too many indices")
    return sorted(found)


def slurm_array(indices: Sequence[int], parallelism: int | None) -> str:
    """The `array` expression of a submit: "0-19%3", "5,13"."""
    if not indices:
        raise ValueError("an array needs at least one index")
    text = compact(indices)
    return f"{text}%{parallelism}" if parallelism is not None else text


def task_string(text: str | None, within: Iterable[int]) -> frozenset[int]:
    """The indices of `within` that Slurm's task string names ("2-5%2", "[1,3-9:2]"): the
    pending tasks the array's own record stands for. Anything unreadable names nothing.

    No range is expanded: each wanted index is looked up among the ranges (bisection), so
    the work is bounded by the text's length and the size of `within`, whatever the ranges
    say."""
    wanted = frozenset(within)
    if not text or not wanted or len(text) > 2 * MAX_TEXT:
        return frozenset()
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    body = body.partition("%")[0]
    plain: list[tuple[int, int]] = []
    stepped: list[tuple[int, int, int]] = []
    try:
        for part in body.split(","):
            span, sep, step_text = part.partition(":")
            # Up to uint32's ten digits: Slurm's own numbers, however large, are no error.
            step = _number(step_text, 10) if sep else 1
            low, dash, high = span.partition("-")
            first = _number(low, 10)
            last = _number(high, 10) if dash else first
            if step < 1 or last < first:
                return frozenset()
            if step == 1:
                plain.append((first, last))
            else:
                stepped.append((first, last, step))
    except ValueError:
        return frozenset()
    if len(stepped) > _MAX_STEPPED:
        return frozenset()
    plain.sort()
    starts = [first for first, _ in plain]
    reach: list[int] = []  # the furthest index any range starting at or before starts[k] covers
    for _, last in plain:
        reach.append(max(last, reach[-1]) if reach else last)
    found: set[int] = set()
    for index in wanted:
        k = bisect_right(starts, index) - 1
        if (k >= 0 and reach[k] >= index) or any(
            first <= index <= last and (index - first) % step == 0 for first, last, step in stepped
        ):
            found.add(index)
    return frozenset(found)
