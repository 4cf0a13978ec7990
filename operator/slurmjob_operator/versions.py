"""REST API versions this operator speaks, oldest first."""

from __future__ import annotations

SUPPORTED_VERSIONS: tuple[str, ...] = (
    "v0.0.38",
    "v0.0.40",
    "v0.0.41",
    "v0.0.42",
    "v0.0.43",
    "v0.0.44",
    "v0.0.45",
)
NEWEST = SUPPORTED_VERSIONS[-1]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))
