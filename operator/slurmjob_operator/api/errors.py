"""Spec errors that name the offending field in the user's own camelCase path.

`parse_spec` is the one place the operator turns a resource's `spec` into a `SlurmJobSpec`;
everything it refuses comes back as a `SpecError` whose messages read like
`spec.pools[0].gpusPerNode: Input should be greater than or equal to 0`.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from slurmjob_operator.api.spec import SlurmJobSpec

_PREFIXES = ("Value error, ", "Assertion failed, ")


class SpecError(ValueError):
    """The spec cannot be run as it stands; each message starts with the field path."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = list(messages) or ["spec: invalid"]
        super().__init__("; ".join(self.messages))

    @property
    def field(self) -> str:
        """The path of the first problem, e.g. `spec.framework.runtimeId`."""
        return self.messages[0].split(": ", 1)[0]


def _candidates(annotation: Any) -> list[Any]:
    """The concrete types an annotation may hold: Optional, unions and Annotated unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _candidates(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        found: list[Any] = []
        for arg in get_args(annotation):
            if arg is not type(None):
                found.extend(_candidates(arg))
        return found
    return [annotation]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _field(candidates: list[Any], key: str) -> tuple[str, Any] | None:
    for tp in candidates:
        if _is_model(tp):
            for name, info in tp.model_fields.items():
                alias = info.alias or name
                if key in (alias, name):
                    return alias, info.annotation
    return None


def _items(candidates: list[Any]) -> list[Any] | None:
    for tp in candidates:
        origin = get_origin(tp)
        if origin in (list, tuple, Sequence):
            args = get_args(tp)
            return _candidates(args[0]) if args else [Any]
        if origin in (dict, Mapping):
            args = get_args(tp)
            return _candidates(args[1]) if len(args) == 2 else [Any]
    return None


def field_path(model: type[BaseModel], loc: Sequence[int | str], root: str = "spec") -> str:
    """`spec.pools[0].gpusPerNode` from a pydantic error location.

    Union member tags that pydantic puts into locations (`int`, `str`, `function-after[...]`)
    are not fields, so they are left out.
    """
    path = root
    candidates: list[Any] = [model]
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
            candidates = _items(candidates) or [Any]
            continue
        found = _field(candidates, part)
        if found is not None:
            alias, annotation = found
            path += f".{alias}"
            candidates = _candidates(annotation)
        elif _items(candidates) is not None:
            path += f"[{part!r}]"
            candidates = _items(candidates) or [Any]
        elif candidates and all(_is_model(tp) for tp in candidates):
            path += f".{part}"  # a key the model does not have (extra_forbidden)
            candidates = [Any]
        # else: a union member tag; the path stays where it is
    return path


def format_validation_error(
    exc: ValidationError, root: str = "spec", model: type[BaseModel] = SlurmJobSpec
) -> list[str]:
    """One `path: message` line per problem, in pydantic's order, without duplicates."""
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        message = str(error["msg"])
        for prefix in _PREFIXES:
            message = message.removeprefix(prefix)
        line = f"{field_path(model, error['loc'], root)}: {message}"
        if line not in lines:
            lines.append(line)
    return lines


def _plain(value: Any) -> Any:
    """Plain dicts and lists from Mapping/Sequence views such as kopf's `spec`."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def parse_spec(obj: Mapping[str, Any] | None) -> SlurmJobSpec:
    """The validated spec, or a `SpecError` naming every offending field."""
    if not isinstance(obj, Mapping):
        raise SpecError(["spec: must be an object"])
    try:
        return SlurmJobSpec.model_validate(_plain(obj))
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc)) from exc
