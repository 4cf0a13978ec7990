"""The strict format of the result files the cache user's jobs write (an import's, a
verification's): one `key=value` a line, each key of a fixed set exactly once, at most a few
KiB of ASCII, every value of a fixed alphabet, numbers as plain digits, a ctime as
`stat -c %.9Z` prints it.

Such a file lies on the shared storage: hostile in principle. Parsing it here takes it apart
and checks its shape; the record modules (`record`, `verifyrecord`) give each key its meaning
and its pydantic model the rest. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

NS = 1_000_000_000
DIGITS = frozenset("0123456789")
OCTAL = frozenset("01234567")
#: A 64-bit number has at most 20 digits; past that a value is refused unread.
MAX_DIGITS = 20

M = TypeVar("M", bound=BaseModel)


class ResultFileError(ValueError):
    """A job's result file is unusable; the message says why."""


def ctime_text(ctime_ns: int) -> str:
    """`seconds.nanoseconds`, as `stat -c %.9Z` prints a ctime."""
    seconds, ns = divmod(ctime_ns, NS)
    return f"{seconds}.{ns:09d}"


def validation_errors(exc: ValidationError) -> str:
    """A pydantic error as one line: each field's path and what is wrong with it."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
    )


def mismatch(result: object, expected: Mapping[str, str]) -> str:
    """The first field of `result` that is not what the operator asked for ('' when none)."""
    for field, want in expected.items():
        got = str(getattr(result, field))
        if got != want:
            return f"the result file says {field} {got}, expected {want}"
    return ""


@dataclass(frozen=True)
class ResultFormat:
    """One kind of result file: its keys (in the order the script writes them), its size
    bound, the characters its values may use and the error it raises.

    The last three fields keep each file's messages and its ctime as they were before the two
    shared this parser: the import's result may give whole seconds, the verification's gives
    nanoseconds always."""

    keys: tuple[str, ...]
    max_bytes: int
    alphabet: frozenset[str]
    error: type[ResultFileError]
    keys_suffix: str = ""
    odd: str = "odd"
    whole_seconds: bool = False

    def values(self, data: bytes) -> dict[str, str]:
        """Each key's value, or the format's error: at most `max_bytes` of ASCII, each key
        exactly once, nothing else."""
        if len(data) > self.max_bytes:
            raise self.error(f"result: more than {self.max_bytes} bytes")
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise self.error("result: not ASCII") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        values: dict[str, str] = {}
        for number, line in enumerate(lines, 1):
            key, equals, value = line.partition("=")
            if not equals or key not in self.keys:
                shown = ", ".join(self.keys) + self.keys_suffix
                raise self.error(f"result line {number}: not one of {shown}")
            if key in values:
                raise self.error(f"result line {number}: {key} given twice")
            if not value or not set(value) <= self.alphabet:
                raise self.error(f"result line {number}: {key} has an empty or {self.odd} value")
            values[key] = value
        missing = [key for key in self.keys if key not in values]
        if missing:
            raise self.error(f"result: missing {', '.join(missing)}")
        return values

    def number(
        self, key: str, value: str, alphabet: frozenset[str] = DIGITS, base: int = 10
    ) -> int:
        # int() takes '+1', ' 1', '1_0' and non-ASCII digits: only plain ASCII digits pass here.
        if not value or len(value) > MAX_DIGITS or not set(value) <= alphabet:
            raise self.error(f"result: {key} {value[:40]!r} is not a number")
        return int(value, base)

    def ctime_ns(self, value: str) -> int:
        """A ctime of `stat -c %.9Z` (`seconds.nanoseconds`) in nanoseconds."""
        seconds, dot, fraction = value.partition(".")
        bare = not dot and self.whole_seconds
        if not bare and (not fraction or len(fraction) > 9 or not set(fraction) <= DIGITS):
            raise self.error(f"result: ctime {value[:40]!r} is not seconds.nanoseconds")
        return self.number("ctime", seconds) * NS + (0 if bare else int(fraction.ljust(9, "0")))

    def model(self, model: type[M], fields: Mapping[str, object]) -> M:
        """The file's model from its parsed fields, or the format's error naming the fields."""
        try:
            return model.model_validate(fields)
        except ValidationError as exc:
            raise self.error(f"result: {validation_errors(exc)}") from None

    def render(self, values: Mapping[str, object]) -> str:
        """The file's text, as its script writes it."""
        return "".join(f"{key}={values[key]}\n" for key in self.keys)
