"""The values every slurmrestd answer is made of, whatever its version: a raw JSON object, the
base of the raw response models, and the coercions of Slurm's own encodings (`{set, infinite,
number}`, 0 for an unset time, "" for no text). Dialect modules and their parsers build on it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

JsonObject = Mapping[str, Any]


class Response(BaseModel):
    """Base of the raw response models: servers add fields, so unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


def no_val(value: Any) -> Any:
    """Unwrap Slurm's `{set, infinite, number}` (and the `+complex` plain form) to a value.

    Unset and infinite both become None: the operator never needs "unlimited" as a number.
    """
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", False):
            return None
        return value.get("number")
    if isinstance(value, str) and value.strip().lower() in ("", "infinity", "infinite"):
        return None
    return value


# 9999-12-31T23:59:59Z: the last second a datetime holds.
_LAST_SECOND = 253402300799


def _timestamp(value: Any) -> Any:
    raw = no_val(value)
    if raw is None or isinstance(raw, datetime):
        return raw
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(f"a time must be a number, not a {type(raw).__name__}")
    try:
        seconds = int(raw)
    except OverflowError:  # infinite: no time anyone can use
        return None
    # 0 is how every version says "not set" for a time; a time no datetime can hold is as
    # good as unknown (a time is shown, never acted on, so it does not cost the record).
    if seconds <= 0 or seconds > _LAST_SECOND:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)


def _text(value: Any) -> Any:
    return value if value not in ("", None) else None


def _uid(value: Any) -> Any:
    """A uid as Slurm reports it; anything that is not one (negative, NO_VAL, not a number,
    a string of digits too long to convert) is unknown: it is only ever named in a message,
    so it never costs the record."""
    raw = no_val(value)
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 10:
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 0xFFFFFFFF:
        return raw
    return None


NoValInt = Annotated[int | None, BeforeValidator(no_val)]
Uid = Annotated[int | None, BeforeValidator(_uid)]
Timestamp = Annotated[datetime | None, BeforeValidator(_timestamp)]
OptStr = Annotated[str | None, BeforeValidator(_text)]


def zero_as_none(value: int | None) -> int | None:
    return value if value else None


def reason_text(value: str | None) -> str | None:
    return None if value in (None, "", "None") else value
