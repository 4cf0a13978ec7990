"""The check of the site catalogs as their files hold them now, and what a bad one means for
an operator that is already running: it keeps the last good copy it read
(`site.catalogwatch`), while one that starts now refuses to start."""

from __future__ import annotations

from slurmjob_operator.config import Settings
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.site.catalogs import (
    CatalogError,
    GpuSeriesCatalog,
    RuntimeRegistry,
    load_gpu_series,
    load_runtime_registry,
)
from slurmjob_operator.site.catalogwatch import RECHECK_SECONDS


def check_catalogs(
    settings: Settings, report: Report
) -> tuple[RuntimeRegistry, GpuSeriesCatalog, bool]:
    """Both catalogs (an empty one for a file that fails) and whether both loaded."""
    problems: list[str] = []
    registry, series = RuntimeRegistry(), GpuSeriesCatalog()
    try:
        registry = load_runtime_registry(settings.runtime_registry_file)
    except CatalogError as exc:
        problems.append(f"{exc} (SLURMJOB_RUNTIME_REGISTRY_FILE)")
    try:
        series = load_gpu_series(settings.gpu_series_file)
    except CatalogError as exc:
        problems.append(f"{exc} (SLURMJOB_GPU_SERIES_FILE)")
    if problems:
        report.add(
            "catalogs",
            Outcome.FAIL,
            f"{'; '.join(problems)}. Fix the file, or the setting that names it: a running "
            "operator keeps using the last good copy it read (it looks at the files every "
            f"{RECHECK_SECONDS:g} s; slurmjob_operator_catalog_stale is 1 meanwhile and its "
            "log names the refused edit), and an operator starting now does not start",
        )
        return registry, series, False
    report.add(
        "catalogs",
        Outcome.OK,
        f"{len(registry.runtimes)} runtime(s), {len(series.series)} GPU series (re-read by "
        f"the running operator within {RECHECK_SECONDS:g} s of a change)",
    )
    return registry, series, True
