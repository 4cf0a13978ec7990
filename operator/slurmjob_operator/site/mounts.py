"""Which storage-root mounts a tenant's job may have (`spec.mounts[i].source`).

A mount must lie under one of the tenant's mountSources (whole path components), outside
every namespace's staging tree (`<root>/<namespace>`: job scripts, env and secrets files) and
the runtimes folder. A path belongs to the tenants that list the deepest source it lies under
(`scratch/a/b-only` is B's even when A lists `scratch/a`), and may not contain a source of
another tenant alone. It may be read-write only when it is the tenant's alone, with no other
tenant's source at or below it (a source listed by two tenants is shared: read-only for both).

The rules hold for the path as written and for the path it resolves to on the operator's view
of the storage, so a symlink planted in a tenant's own folder does not lead out of it. It is
checked before submit: a link swapped in afterwards is only stopped by the file permissions
of the tenant's Slurm user.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slurmjob_operator.api.spec import Mount
from slurmjob_operator.site.catalogs import RuntimeRegistry
from slurmjob_operator.site.storagepaths import (
    Parts,
    overlap,
    path_parts,
    runtime_dirs,
    shown,
    under,
)
from slurmjob_operator.site.tenants import TenantScope


def _real(storage_root: Path, parts: Parts) -> Parts | None:
    """The path's components once symlinks are resolved, or None outside the storage root."""
    try:
        root = storage_root.resolve()
        real = storage_root.joinpath(*parts).resolve()
    except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13
        return None
    if not real.is_relative_to(root):
        return None
    return real.relative_to(root).parts


def _problem(
    parts: Parts, read_only: bool, scope: TenantScope, runtimes: list[Parts]
) -> str | None:
    """Why a tenant may not mount `parts` (a phrase after the source), or None."""
    if not parts:
        return "is the storage root itself"
    if parts[0] in scope.staging_namespaces:
        return (
            f"is in the staging tree of namespace {parts[0]} (<storage root>/{parts[0]} holds "
            "the job files of its SlurmJobs)"
        )
    folder = next((f for f in runtimes if overlap(parts, f)), None)
    if folder is not None:
        return f"overlaps the runtimes folder {shown(folder)!r}"
    tenant = scope.tenant
    own = scope.limits.source_parts
    mine = [source for source in own if under(parts, source)]
    if not mine:
        if not own:
            return f"cannot be mounted: tenant {tenant.name} has no mountSources"
        listed = ", ".join(shown(s) for s in own)
        return f"is not under tenant {tenant.name}'s mountSources ({listed})"
    # A path belongs to the tenants of the deepest source it lies under; nothing below it
    # may belong to another tenant alone.
    deepest = max(len(source) for source in (*mine, *scope.other_sources) if under(parts, source))
    below = [other for other in scope.other_sources if under(other, parts)]
    if max(len(s) for s in mine) < deepest or any(other not in own for other in below):
        return "reaches into another tenant's mount source"
    shared = any(len(o) == deepest and under(parts, o) for o in scope.other_sources)
    if not read_only and (shared or below):
        return "is shared with another tenant, so it is read-only: set readOnly: true"
    return None


def mount_problems(
    mounts: Sequence[Mount], storage_root: Path, registry: RuntimeRegistry, scope: TenantScope
) -> list[str]:
    """One `spec.mounts[i].source: ...` message per mount the tenant may not have."""
    runtimes = runtime_dirs(registry)
    out: list[str] = []
    for index, mount in enumerate(mounts):
        lexical = path_parts(mount.source)
        problem = _problem(lexical, mount.read_only, scope, runtimes)
        if problem is None:
            real = _real(storage_root, lexical)
            if real is None:
                problem = "resolves (through a symlink) to a path outside the storage root"
            elif real != lexical:
                found = _problem(real, mount.read_only, scope, runtimes)
                if found is not None:
                    problem = f"resolves through a symlink to {shown(real)!r}, which {found}"
        if problem is not None:
            out.append(f"spec.mounts[{index}].source: {mount.source!r} {problem}")
    return out
