"""RFC 7386 JSON merge patches, both halves: the patch between two documents (what the
operator sends to `/status`) and a patch applied to a document (what the API server does, and
what `LocalStore` does in its place)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The patch that turns `old` into `new`: fields `new` no longer has become nulls, so they
    are removed rather than left behind."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = diff(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = value
    return patch


def apply(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` (neither is modified). An object patch merges key by key
    (null removes the key, objects recurse, anything else replaces); a patch that is not an
    object replaces the target as a whole."""
    if not isinstance(patch, Mapping):
        return patch
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply(result.get(key), value)
    return result
