"""`slurmjob-operator doctor`: check that a site can run SlurmJobs, and say what is wrong.

Each check is independent where it can be, so one report shows every problem at once; checks
that need a working slurmrestd connection are skipped (not failed twice) when it is missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from slurmjob_operator.config import ConfigError, Settings
from slurmjob_operator.doctor.archive import check_archive
from slurmjob_operator.doctor.catalogs import check_catalogs
from slurmjob_operator.doctor.imagecache import check_image_cache
from slurmjob_operator.doctor.probe import check_staging_probe
from slurmjob_operator.doctor.report import Check, Outcome, Report
from slurmjob_operator.doctor.slurmrestd import check_slurm
from slurmjob_operator.doctor.storage import check_runtimes, check_storage
from slurmjob_operator.doctor.tenancy import check_tenancy
from slurmjob_operator.site.clusters import load_clusters


async def run_doctor(environ: dict[str, str] | None = None, *, probe: bool = True) -> Report:
    report = Report()
    try:
        settings = Settings.from_env(os.environ if environ is None else environ)
    except ConfigError as exc:
        report.add("settings", Outcome.FAIL, str(exc))
        report.invalid = True
        return report
    try:
        sites = load_clusters(settings)
    except ConfigError as exc:
        report.add("clusters", Outcome.FAIL, f"{exc} (SLURMJOB_CLUSTERS_FILE)")
        report.invalid = True
        return report
    names = [site.name for site in sites]
    check_archive(settings, [site.settings.storage_root for site in sites], report)
    if len(sites) == 1:
        await _check_cluster(sites[0].settings, report, names, probe=probe)
        return report
    report.add("clusters", Outcome.OK, ", ".join(names))
    for site in sites:
        # Every cluster's checks, named for it: "slurmrestd[west]" (its tenants' users too).
        own = Report()
        await _check_cluster(site.settings, own, names, probe=probe)
        for check in own.checks:
            report.add(f"{check.name}[{site.name}]", check.outcome, check.detail)
    return report


async def _check_cluster(
    settings: Settings, report: Report, clusters: Sequence[str], *, probe: bool = True
) -> None:
    report.add("settings", Outcome.OK, f"runtime profile {settings.slurm_runtime_profile.value}")
    registry, series, catalogs_ok = check_catalogs(settings, report)
    check_tenancy(settings, registry, report, clusters)
    await check_slurm(settings, series, report)
    check_storage(settings, report)
    check_image_cache(settings, report)
    if catalogs_ok:
        await check_runtimes(settings, registry, report)
    slurm_ok = all(
        c.outcome is Outcome.OK for c in report.checks if c.name in ("slurmrestd", "auth")
    )
    if probe and slurm_ok:
        await check_staging_probe(settings, report, clusters)
    elif probe:
        report.add("staging writable", Outcome.SKIP, "slurmrestd does not answer: not probed")


__all__ = ["Check", "Outcome", "Report", "run_doctor"]
