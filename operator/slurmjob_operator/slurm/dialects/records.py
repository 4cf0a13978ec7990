"""Reading untrusted answers: what counts as unreadable, list answers record by record, and
the one exception a parse function may raise (`SlurmMalformed`).

An answer's records are read one at a time, so one record slurmrestd got wrong (a field of the
wrong type, an id outside Slurm's range) leaves out that record only (`Records.skipped` says
why); the list itself not being a list makes the whole answer unreadable. Whether a left-out
record is acceptable is the caller's decision (`slurm.client`): a sweep goes on without it, a
read of one job does not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar

from pydantic import ValidationError

from slurmjob_operator.slurm.errors import SlurmError, SlurmMalformed

_T = TypeVar("_T")
_P = ParamSpec("_P")

#: What reading a hostile value can raise (pydantic's ValidationError is a ValueError;
#: OverflowError is an ArithmeticError; KeyError and IndexError are LookupErrors).
UNREADABLE: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    ArithmeticError,
    LookupError,
    AttributeError,
)
_DETAIL_MAX = 200


def describe(exc: BaseException) -> str:
    """A short account of why a value could not be read (no echo of a long hostile value)."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        text = f"{where}: {first['msg']}" if where else str(first["msg"])
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _DETAIL_MAX else text[: _DETAIL_MAX - 3] + "..."


class Records(list[_T]):
    """The readable records of a list answer; `skipped` says why each other one was left out."""

    def __init__(self, items: Iterable[_T] = (), skipped: Iterable[str] = ()) -> None:
        super().__init__(items)
        self.skipped: tuple[str, ...] = tuple(skipped)

    def complete(self) -> Records[_T]:
        """These records, when none was left out; else the answer is `SlurmMalformed`."""
        if self.skipped:
            more = f" (and {len(self.skipped) - 1} more)" if len(self.skipped) > 1 else ""
            raise SlurmMalformed(f"unreadable record {self.skipped[0]}{more}")
        return self


def _label(key: str, index: int, item: Any) -> str:
    job_id = item.get("job_id") if isinstance(item, Mapping) else None
    try:
        shown = repr(job_id)
    except ValueError:  # an int too long for Python to print
        shown = ""
    if job_id is None or not shown or len(shown) > 24:
        return f"{key}[{index}]"
    return f"{key}[{index}] (job_id {shown})"


def read_records(
    payload: Mapping[str, Any], key: str, read_one: Callable[[Mapping[str, Any]], _T]
) -> Records[_T]:
    """`read_one` over `payload[key]` (absent or null: no records), one record at a time."""
    raw = payload.get(key)
    if raw is None:
        return Records()
    if not isinstance(raw, list):
        raise SlurmMalformed(f"`{key}` is a {type(raw).__name__}, not a list")
    items: list[_T] = []
    skipped: list[str] = []
    for index, item in enumerate(raw):
        try:
            if not isinstance(item, Mapping):
                raise TypeError(f"a {type(item).__name__}, not an object")
            items.append(read_one(item))
        except UNREADABLE as exc:
            skipped.append(f"{_label(key, index, item)}: {describe(exc)}")
    return Records(items, skipped)


def reading(parse: Callable[_P, _T]) -> Callable[_P, _T]:
    """Let a parse function fail only as a `SlurmError`, whatever the answer held."""

    @functools.wraps(parse)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return parse(*args, **kwargs)
        except SlurmError:
            raise
        except UNREADABLE as exc:
            raise SlurmMalformed(f"unreadable answer: {describe(exc)}") from exc

    return guarded
