"""Log patterns (`onLogPattern` and the default retry rules), compiled by RE2.

A tenant writes the pattern, its own job writes the text the pattern is searched in, and the
search runs in the operator's event loop. Python's backtracking `re` takes exponential time on
`(a+)+$` and cubic time on a default rule (`(ib|mlx5)\\S*.*[Ll]ink (is )?down` over a line of
`ibib…`), so every log pattern goes through RE2 instead: its time is linear in the text times
the size of the compiled program. The text is bounded by the caller (`core.retries`); the
program here, by `MAX_PROGRAM_SIZE` instructions, because a short pattern can compile to a
large program (`[^\\n]{1000}z` is 8,005 instructions and takes about a second over 128 KiB
when RE2's DFA runs out of memory and it falls back to its NFA).

The binding is `google-re2`, which imports as `re2`. The PyPI packages `re2` and `pyre2`
import under the same name and quietly fall back to Python's `re` for what they cannot
compile; `tests/unit/test_patterns.py` notices that (a lookahead would compile).

RE2 is not Python's `re` (https://github.com/google/re2/wiki/Syntax): no lookaround, no
backreferences, `\\z` for the end of the text (Python's `\\Z` is refused), and `\\w`, `\\d`,
`\\s`, `\\b` are ASCII only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import re2

__all__ = [
    "MAX_PATTERN_LENGTH",
    "MAX_PROGRAM_SIZE",
    "LogPattern",
    "PatternError",
    "compile_pattern",
]

MAX_PATTERN_LENGTH = 1024
#: RE2 instructions a pattern may compile to, and all of one resource's patterns together
#: (`api.retry`): at about 0.5 ms per instruction over 128 KiB of logs in RE2's slowest path,
#: about a second per failed attempt at worst.
MAX_PROGRAM_SIZE = 2000
#: Per compiled pattern (program and DFA cache). The cache below (64) and `re2.compile`'s own
#: (128) keep at most 192 patterns alive: at most 192 MiB, about 70 MiB measured with every
#: DFA thrashed, whatever number of distinct patterns tenants write.
_MAX_MEM = 1 << 20
_CACHED = 64
_SYNTAX = "https://github.com/google/re2/wiki/Syntax"


class PatternError(ValueError):
    """The pattern cannot be used as a log pattern; the message says why."""


@dataclass(frozen=True)
class LogPattern:
    source: str
    program_size: int
    _regexp: Any = field(repr=False, compare=False)

    def search(self, text: bytes) -> bool:
        """Whether the pattern matches anywhere in `text` (UTF-8)."""
        return self._regexp.search(text) is not None


def _options() -> Any:
    options = re2.Options()
    options.max_mem = _MAX_MEM
    # A refused pattern is reported to its owner (the resource's status), not to stderr.
    options.log_errors = False
    # Only whether a pattern matches is asked.
    options.never_capture = True
    return options


def _reason(exc: Exception) -> str:
    # google-re2 raises its error with RE2's message as bytes.
    raw = exc.args[0] if exc.args else exc
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return text or "cannot be compiled"


@functools.lru_cache(maxsize=_CACHED)
def compile_pattern(pattern: str) -> LogPattern:
    """The compiled pattern (compiled once, then cached), or a `PatternError`."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternError(f"longer than {MAX_PATTERN_LENGTH} characters")
    try:
        regexp = re2.compile(pattern, _options())
    except UnicodeEncodeError as exc:
        raise PatternError(f"not valid Unicode: {exc.reason}") from exc
    except re2.error as exc:
        hint = " (RE2 writes the end of the text \\z)" if "\\Z" in pattern else ""
        raise PatternError(
            f"not a valid RE2 regular expression ({_SYNTAX}): {_reason(exc)}{hint}"
        ) from exc
    size = int(regexp.programsize)
    if size > MAX_PROGRAM_SIZE:
        raise PatternError(
            f"compiles to {size} RE2 instructions, more than the {MAX_PROGRAM_SIZE} allowed "
            "(a large counted repetition such as .{1000} is the usual cause)"
        )
    return LogPattern(pattern, size, regexp)
