"""The check of the tenants file as the operator's part for one cluster reads it: whose jobs
are taken, which Slurm user they run as, and whether their files can be shared with them."""

from __future__ import annotations

from collections.abc import Sequence

from slurmjob_operator.config import Settings
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.site.catalogs import CatalogError, RuntimeRegistry
from slurmjob_operator.site.tenants import check_against_registry, load_tenants
from slurmjob_operator.storage.acl import AclError, require_supported


def check_tenancy(
    settings: Settings,
    registry: RuntimeRegistry,
    report: Report,
    clusters: Sequence[str] | None = None,
) -> None:
    """The tenants as the part for `settings.cluster_name` sees them (`clusters`: every
    cluster's name, which the file may use; None: that one alone)."""
    path = settings.tenants_file
    if path is None:
        report.add(
            "tenancy",
            Outcome.OK,
            "single-tenant (SLURMJOB_TENANTS_FILE unset): every namespace's SlurmJobs are "
            "taken, with the operator's Slurm user and no tenant limits",
        )
        return
    try:
        tenants = load_tenants(path, clusters=list(clusters or [settings.cluster_name]))
        if tenants is not None:
            check_against_registry(tenants, registry, path)
            tenants = tenants.for_cluster(settings.cluster_name)
    except CatalogError as exc:
        report.add("tenancy", Outcome.FAIL, str(exc))
        return
    if tenants is None:
        return
    names = ", ".join(t.name for t in tenants.tenants)
    report.add(
        "tenancy",
        Outcome.OK,
        f"{len(tenants.tenants)} tenant(s) ({names}) in {path}; SlurmJobs of other "
        "namespaces are refused (TenantUnknown)",
    )
    shared = [t.name for t in tenants.tenants if t.slurm_user is None]
    if shared:
        report.add(
            "tenant users",
            Outcome.WARN,
            f"no slurmUser for tenant(s) {', '.join(shared)}: their jobs run as the operator's "
            "Slurm user, shared by every tenant without a slurmUser, so Unix permissions do not "
            "keep their files apart",
        )
    own = [t.name for t in tenants.tenants if t.slurm_user is not None]
    if own and settings.slurm_jwt_key_file is None:
        report.add(
            "tenant users",
            Outcome.FAIL,
            f"tenant(s) {', '.join(own)} name a slurmUser, which needs the JWT key mode "
            "(SLURMJOB_SLURM_JWT_KEY_FILE): a token file carries one user only; the operator "
            "does not start",
        )
    elif own:
        report.add(
            "tenant users",
            Outcome.OK,
            f"tenant(s) {', '.join(own)}: jobs submitted, cancelled, held and released as "
            "their slurmUser (tokens minted with SLURMJOB_SLURM_JWT_KEY_FILE)",
        )
    no_uid = [t.name for t in tenants.tenants if t.slurm_user is not None and t.uid is None]
    if no_uid:
        report.add(
            "tenant files",
            Outcome.WARN,
            f"tenant(s) {', '.join(no_uid)} have a slurmUser but no uid: their attempt "
            "directories are made as for every other job (SLURMJOB_STAGING_OWNER, else the "
            "operator's uid), so their jobs can write their logs only if that is slurmUser's "
            "uid; give the tenant its uid to share its files through POSIX ACLs",
        )
    with_uid = [t.name for t in tenants.tenants if t.uid is not None]
    if with_uid:
        _check_acls(settings, with_uid, report)


def _check_acls(settings: Settings, tenants: list[str], report: Report) -> None:
    """The storage root must keep POSIX ACLs for tenants with a uid (fail closed)."""
    root = settings.storage_root
    try:
        require_supported(root)
    except AclError as exc:
        report.add(
            "tenant files",
            Outcome.FAIL,
            f"tenant(s) {', '.join(tenants)} have a uid, so their attempt files are shared "
            f"through POSIX ACLs, but {exc.strerror}; the operator does not start",
        )
        return
    report.add(
        "tenant files",
        Outcome.OK,
        f"{root} keeps POSIX ACLs: the attempt files of tenant(s) {', '.join(tenants)} stay "
        "the operator's, with an ACL for the tenant's uid",
    )
