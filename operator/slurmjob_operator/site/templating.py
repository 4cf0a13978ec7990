"""The Jinja environment batch scripts are rendered in, and its quoting rule.

Quoting rule: every value that reaches the script goes through the `shquote` filter, which
returns a `Quoted` string. The environment's `finalize` hook refuses any `{{ ... }}` whose
result is not `Quoted`, so a template (including a site copy in SLURMJOB_TEMPLATES_DIR) cannot
interpolate an unquoted value by mistake. Values are never interpolated into comments.

A site directory, when set, is searched before the packaged templates, so a site can override
a single part.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Sequence
from pathlib import Path, PurePath

import jinja2

from slurmjob_operator.config import Settings


class RenderError(ValueError):
    """The inputs cannot be rendered into a safe script; the message says why."""


class Quoted(str):
    """A string already quoted for the shell: the only thing templates may emit."""

    __slots__ = ()


#: A word bash's array syntax reads as a literal that looks like an assignment.
_ASSIGNMENT_LIKE = re.compile(r"=|[A-Za-z_][A-Za-z0-9_]*=")


#: bash's reserved words (`help reserved`), which shellcheck reads as syntax even in an array.
_RESERVED_WORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until"}
    | {"do", "done", "in", "function", "time", "coproc", "{", "}", "!", "[[", "]]"}
)


def shquote(value: object) -> Quoted:
    """Quote one value as one shell word (POSIX single quotes where needed)."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises, naming the missing variable
    if isinstance(value, bool) or not isinstance(value, str | int | PurePath):
        raise RenderError(f"cannot quote a {type(value).__name__} for the shell")
    text = str(value)
    if "\0" in text:
        raise RenderError("values cannot contain NUL bytes")
    if (_ASSIGNMENT_LIKE.match(text) or text in _RESERVED_WORDS) and "'" not in text:
        # shlex leaves `=` and bash's reserved words bare; inside a bash array a bare
        # `name=value` or `=` word, or `then`, is read as a literal but flagged (SC2191,
        # SC1010) as a mistake: quote them anyway, so that every script is shellcheck-clean.
        return Quoted(f"'{text}'")
    return Quoted(shlex.quote(text))


def shjoin(values: Sequence[object]) -> Quoted:
    """Quote each value and join them with spaces (several shell words)."""
    return Quoted(" ".join(shquote(v) for v in values))


def _finalize(value: object) -> object:
    if isinstance(value, Quoted):
        return value
    raise RenderError(
        f"unquoted interpolation of {type(value).__name__} in a template: use | shquote"
    )


def packaged_templates_dir() -> Path:
    """The templates shipped in the wheel, or the repository's `templates/` (editable)."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "templates"
    if packaged.is_dir():
        return packaged
    return package.parent.parent / "templates"


@functools.lru_cache(maxsize=8)
def _environment(site_dir: Path | None) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = []
    if site_dir is not None:
        loaders.append(jinja2.FileSystemLoader(str(site_dir)))
    loaders.append(jinja2.FileSystemLoader(str(packaged_templates_dir())))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 -- shell, not HTML: `shquote` and `finalize` guard it
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_finalize,
        # bash uses `{#` (`${#array[@]}`), so Jinja comments get other delimiters.
        comment_start_string="<%#",
        comment_end_string="#%>",
    )
    env.filters["shquote"] = shquote
    env.filters["shjoin"] = shjoin
    return env


def environment(settings: Settings) -> jinja2.Environment:
    return _environment(settings.templates_dir)
