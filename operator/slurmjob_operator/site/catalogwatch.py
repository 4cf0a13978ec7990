"""The runtime registry and the GPU series catalog of one cluster, re-read when their files
change; the tenants file is not (it decides whose jobs are taken at all: read once at start).

`CatalogWatch.current` is the copy every decision reads, both catalogs in one object, so that
one submit never sees half of an edit. `check` (blocking: a stat per file, a read when the
stat changed) is called every `RECHECK_SECONDS` by the operator (`controller.catalogreload`);
nothing else re-reads, and `render`, `submit` and `doctor` read the files once.

A file is watched through its path: `os.stat` follows symlinks, so the kubelet's update of a
ConfigMap volume (a new `..data` directory swapped in under the same names) is a new inode,
as for the JWT file (`slurm.auth.JwtFileToken`). New content passes the validation the file
had at start or is refused, and the last good copy stays in use (`core.reread`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel

from slurmjob_operator.config import Settings
from slurmjob_operator.core.reread import FileCopy, Outcome, digest_of, reread
from slurmjob_operator.site.catalogs import (
    GpuSeriesCatalog,
    RuntimeRegistry,
    parse_catalog,
    read_catalog,
)

#: Seconds between two looks at the files: a stat each, cheap. A ConfigMap volume reaches
#: the pod after the kubelet's sync (about a minute), which this adds little to.
RECHECK_SECONDS = 10.0

#: (device, inode, size, mtime in ns) of the file a path reaches; None when it cannot be had.
Stamp = tuple[int, int, int, int] | None


class CatalogKind(StrEnum):
    """A re-read catalog, as metrics, logs and `doctor` name it."""

    RUNTIME_REGISTRY = "runtime-registry"
    GPU_SERIES = "gpu-series"


@dataclass(frozen=True)
class Catalogs:
    """One copy of a cluster's catalogs: what one decision reads."""

    registry: RuntimeRegistry = field(default_factory=RuntimeRegistry)
    gpu_series: GpuSeriesCatalog = field(default_factory=GpuSeriesCatalog)


@dataclass(frozen=True)
class CatalogChange:
    """What one look at a changed file found: a new copy, a refused edit, or (UNCHANGED) a
    refused edit undone."""

    kind: CatalogKind
    outcome: Outcome
    copy: FileCopy


def stamp_of(path: Path) -> Stamp:
    try:
        st = os.stat(path)  # follows the ConfigMap's symlinks to the file itself
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read(path: Path) -> bytes | OSError:
    try:
        return path.read_bytes()
    except OSError as exc:
        return exc


@dataclass
class _File:
    kind: CatalogKind
    path: Path
    stamp: Stamp
    copy: FileCopy


class CatalogWatch:
    """A cluster's catalogs as the files hold them now, the last good copy of each kept."""

    def __init__(
        self,
        current: Catalogs | None = None,
        files: Sequence[_File] = (),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Without files: catalogs that never change (`load` watches the files)."""
        self._current = current if current is not None else Catalogs()
        self._files = list(files)
        self._clock = clock
        self._registry_checks: list[Callable[[RuntimeRegistry], None]] = []

    @classmethod
    def load(cls, settings: Settings, *, clock: Callable[[], float] = time.time) -> CatalogWatch:
        """The files `settings` name, read now (CatalogError: the start fails, there is no
        good copy to keep yet). A file not named is an empty catalog, never looked for."""
        files: list[_File] = []
        loaded: dict[CatalogKind, BaseModel] = {}
        named = (
            (CatalogKind.RUNTIME_REGISTRY, settings.runtime_registry_file, RuntimeRegistry),
            (CatalogKind.GPU_SERIES, settings.gpu_series_file, GpuSeriesCatalog),
        )
        for kind, path, model in named:
            if path is None:
                continue
            stamp = stamp_of(path)  # before the read: a change after it is seen next time
            raw = read_catalog(path)
            loaded[kind] = parse_catalog(path, raw, model)
            files.append(_File(kind, path, stamp, FileCopy(str(path), digest_of(raw), clock())))
        registry = loaded.get(CatalogKind.RUNTIME_REGISTRY, RuntimeRegistry())
        series = loaded.get(CatalogKind.GPU_SERIES, GpuSeriesCatalog())
        assert isinstance(registry, RuntimeRegistry)
        assert isinstance(series, GpuSeriesCatalog)
        return cls(Catalogs(registry, series), files, clock=clock)

    @property
    def current(self) -> Catalogs:
        """The copy in use: read it once per decision (a re-read replaces it whole)."""
        return self._current

    def copies(self) -> dict[CatalogKind, tuple[Path, FileCopy]]:
        """Each watched file and what is known of it (the metrics, `doctor`'s wording)."""
        return {f.kind: (f.path, f.copy) for f in self._files}

    def require(self, check: Callable[[RuntimeRegistry], None]) -> None:
        """Refuse every registry `check` refuses (CatalogError), the one in use now first:
        the tenants' mount sources against the runtimes folders (`site.tenants`)."""
        check(self._current.registry)
        self._registry_checks.append(check)

    def check(self) -> list[CatalogChange]:
        """Look at every file; read again those whose stat changed. Blocking."""
        changes: list[CatalogChange] = []
        for watched in self._files:
            stamp = stamp_of(watched.path)
            if stamp == watched.stamp:
                continue  # the same file (or still none: said when it went)
            watched.stamp = stamp
            was_stale = watched.copy.stale
            result = reread(watched.copy, _read(watched.path), self._parser(watched), self._clock())
            watched.copy = result.copy
            if result.value is not None:
                self._current = _with(self._current, result.value)
            if result.outcome in (Outcome.LOADED, Outcome.REFUSED) or (
                result.outcome is Outcome.UNCHANGED and was_stale
            ):
                changes.append(CatalogChange(watched.kind, result.outcome, result.copy))
        return changes

    def _parser(self, watched: _File) -> Callable[[bytes], BaseModel]:
        if watched.kind is CatalogKind.GPU_SERIES:
            return lambda raw: parse_catalog(watched.path, raw, GpuSeriesCatalog)

        def registry(raw: bytes) -> RuntimeRegistry:
            parsed = parse_catalog(watched.path, raw, RuntimeRegistry)
            for check in self._registry_checks:
                check(parsed)
            return parsed

        return registry


def _with(current: Catalogs, value: BaseModel) -> Catalogs:
    if isinstance(value, RuntimeRegistry):
        return replace(current, registry=value)
    assert isinstance(value, GpuSeriesCatalog)
    return replace(current, gpu_series=value)
