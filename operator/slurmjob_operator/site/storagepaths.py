"""Paths below the storage root as their components, compared on whole components: a
tenant's mount sources, a spec's mounts and the runtimes folder (`a/bc` is not under `a/b`).
"""

from __future__ import annotations

from slurmjob_operator.site.catalogs import RuntimeRegistry

#: A path under the storage root as its components (`datasets/team-a` -> ("datasets", "team-a")).
Parts = tuple[str, ...]


def path_parts(path: str) -> Parts:
    """The components of a relative path, without empty and `.` components."""
    return tuple(part for part in path.split("/") if part not in ("", "."))


def under(path: Parts, prefix: Parts) -> bool:
    """Whether `path` is `prefix` or below it, on whole components (`a/bc` is not under `a/b`)."""
    return path[: len(prefix)] == prefix


def overlap(a: Parts, b: Parts) -> bool:
    """Whether one of the two paths is the other or below it."""
    return under(a, b) or under(b, a)


def shown(parts: Parts) -> str:
    return "/".join(parts)


def runtime_dirs(registry: RuntimeRegistry) -> list[Parts]:
    """The folders that hold runtime artifacts (an artifact at the top of the storage root
    stands for itself: its folder is the root)."""
    out: list[Parts] = []
    for runtime in registry.runtimes:
        parts = path_parts(runtime.path)
        folder = parts[:-1] or parts
        if folder not in out:
            out.append(folder)
    return out
