"""`slurmjob-operator doctor`: check that a site can run SlurmJobs, and say what is wrong.

Each check is independent where it can be, so one report shows every problem at once; checks
that need a working slurmrestd connection are skipped (not failed twice) when it is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from slurmjob_operator.config import AUTO, ConfigError, Settings
from slurmjob_operator.core import verified
from slurmjob_operator.core.absence import Mode, Window, mode
from slurmjob_operator.core.launch import JobComponent, LaunchRequest, StagedFile
from slurmjob_operator.core.naming import SCRIPT_FILE, STDERR_FILE, STDOUT_FILE
from slurmjob_operator.site.artifacts import ArtifactError, artifact_path, verify_artifact
from slurmjob_operator.site.catalogs import (
    PROFILE_FORMAT,
    CatalogError,
    GpuSeriesCatalog,
    RuntimeRegistry,
    load_gpu_series,
    load_runtime_registry,
)
from slurmjob_operator.site.clusters import load_clusters
from slurmjob_operator.site.tenants import check_against_registry, load_tenants
from slurmjob_operator.slurm.auth import TokenError, TokenProvider
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import (
    connect,
    make_token_provider,
    open_transport,
    user_token,
)
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.slurm.http import HttpTransport
from slurmjob_operator.slurm.nodes import NodeInfo
from slurmjob_operator.storage.acl import AclError, require_supported
from slurmjob_operator.storage.logs import attempt_dir_owner
from slurmjob_operator.storage.nofollow import below, lstat_at, open_file, read_at_most, walk
from slurmjob_operator.storage.staging import StagingError, stage_attempt
from slurmjob_operator.times import rfc3339

#: The probe's directory may hold whatever the job user made; it is only read, never followed.
_ANY_OWNER = range(0, 1 << 32)


class Outcome(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Outcome
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, outcome: Outcome, detail: str) -> None:
        self.checks.append(Check(name, outcome, detail))

    @property
    def ok(self) -> bool:
        return all(c.outcome is not Outcome.FAIL for c in self.checks)

    def render(self, *, json_output: bool = False) -> str:
        if json_output:
            return (
                json.dumps({"ok": self.ok, "checks": [asdict(c) for c in self.checks]}, indent=2)
                + "\n"
            )
        width = max((len(c.name) for c in self.checks), default=0)
        lines = [f"[{c.outcome.value:>4}] {c.name:<{width}}  {c.detail}" for c in self.checks]
        failed = sum(c.outcome is Outcome.FAIL for c in self.checks)
        lines.append("site OK" if self.ok else f"{failed} check(s) failed")
        return "\n".join(lines) + "\n"


def _check_storage(settings: Settings, report: Report) -> None:
    root = settings.storage_root
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".slurmjob-doctor-"):
            pass
    except OSError as exc:
        report.add("storage root", Outcome.FAIL, f"{root} is not writable: {exc.strerror}")
        return
    detail = f"{root} is writable"
    if settings.slurm_storage_root:
        detail += f"; the cluster sees it as {settings.slurm_storage_root}"
    report.add("storage root", Outcome.OK, detail)


async def _check_runtimes(settings: Settings, registry: RuntimeRegistry, report: Report) -> None:
    if not registry.runtimes:
        report.add("runtimes", Outcome.WARN, "the runtime registry lists no runtime")
        return
    wanted = PROFILE_FORMAT[settings.slurm_runtime_profile]
    for runtime in registry.runtimes:
        name = f"runtime {runtime.id}"
        if runtime.format is not wanted:
            report.add(
                name,
                Outcome.WARN,
                f"format {runtime.format.value} does not match the "
                f"{settings.slurm_runtime_profile.value} profile ({wanted.value}): jobs using it "
                "are refused",
            )
            continue
        try:
            path = artifact_path(settings, runtime)
            await asyncio.to_thread(verify_artifact, path, runtime)
        except ArtifactError as exc:
            report.add(name, Outcome.FAIL, str(exc))
        else:
            report.add(name, Outcome.OK, f"{path}: {runtime.format.value}, sha256 verified")


def _check_series(series: GpuSeriesCatalog, nodes: list[NodeInfo], report: Report) -> None:
    features = {f for n in nodes for f in n.features}
    for entry in series.series:
        name = f"gpu series {entry.name}"
        if not entry.slurm_constraint:
            report.add(
                name,
                Outcome.WARN,
                "no slurmConstraint: usable in single-pool jobs only (heterogeneous jobs are "
                "refused, fail-closed)",
            )
            continue
        wanted = {part for part in _constraint_features(entry.slurm_constraint)}
        missing = sorted(wanted - features)
        if missing:
            report.add(
                name,
                Outcome.FAIL,
                f"constraint {entry.slurm_constraint!r}: no node has feature(s) "
                f"{', '.join(missing)}",
            )
        else:
            holders = sorted(n.name for n in nodes if wanted & n.features)
            report.add(
                name,
                Outcome.OK,
                f"constraint {entry.slurm_constraint!r} on {', '.join(holders)}",
            )


def _check_tenancy(
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


def _constraint_features(expression: str) -> list[str]:
    """Feature names in a Slurm constraint expression (`a&b`, `a|b`, `[a|b]`, `a*2`)."""
    cleaned = expression
    for char in "[]()!":
        cleaned = cleaned.replace(char, " ")
    for sep in "&|,":
        cleaned = cleaned.replace(sep, " ")
    return [word.split("*")[0] for word in cleaned.split() if word.split("*")[0]]


def _expiry_text(token: TokenProvider) -> str:
    expires = token.expires_at
    if expires is None:
        return "token has no exp claim"
    left = int((expires - datetime.now(tz=UTC)).total_seconds())
    return f"token expires {rfc3339(expires)} (in {left} s)"


async def _step(report: Report, name: str, action: Callable[[], Awaitable[str]]) -> bool:
    try:
        detail = await action()
    except (SlurmError, TokenError, ConfigError, OSError) as exc:
        report.add(name, Outcome.FAIL, f"{type(exc).__name__}: {exc}")
        return False
    report.add(name, Outcome.OK, detail)
    return True


async def _check_slurm(settings: Settings, series: GpuSeriesCatalog, report: Report) -> None:
    try:
        token = make_token_provider(settings)
    except ConfigError as exc:
        report.add("auth", Outcome.FAIL, str(exc))
        return
    async with open_transport(settings) as transport:
        client: SlurmClient | None = None

        async def _connect() -> str:
            nonlocal client
            client = await connect(settings, transport, token=token)
            how = "discovered" if settings.slurm_rest_api_version == AUTO else "configured"
            return f"{settings.slurm_rest_url} speaks {client.version} ({how})"

        if not await _step(report, "slurmrestd", _connect) or client is None:
            return
        ready: SlurmClient = client

        async def _ping() -> str:
            result = await ready.ping()
            release = f"Slurm {result.release}, " if result.release else ""
            cluster = f"cluster {result.cluster}; " if result.cluster else ""
            return f"{release}{cluster}{_expiry_text(token)}"

        if not await _step(report, "auth", _ping):
            return

        async def _partition() -> str:
            wanted = settings.slurm_partition
            names = await ready.list_partitions()
            if wanted is None:
                return f"no default partition set; jobs must name one of {', '.join(names)}"
            if wanted not in names:
                raise ConfigError(
                    f"SLURMJOB_SLURM_PARTITION={wanted!r} is not a partition "
                    f"(known: {', '.join(names) or 'none'})"
                )
            return f"{wanted} exists"

        await _step(report, "partition", _partition)
        await _check_accounting(ready, report)
        _check_absence_mode(settings, ready, report)
        if series.series:
            try:
                nodes = await ready.list_nodes()
            except SlurmError as exc:
                report.add("gpu series", Outcome.FAIL, f"cannot list nodes: {exc}")
            else:
                _check_series(series, nodes, report)


async def _check_accounting(client: SlurmClient, report: Report) -> None:
    """Whether the job records slurmctld purges can still be read: without accounting a job
    that ended and was purged while the operator was away ends `Unknown` (reason JobLost), and
    a lost submit whose job was purged is not found again."""
    try:
        served = await client.has_accounting()
    except SlurmError as exc:
        report.add(
            "accounting",
            Outcome.WARN,
            f"/slurmdb/{client.version} is served but does not answer ({type(exc).__name__}: "
            f"{exc}); purged jobs cannot be read until it does",
        )
        return
    if served:
        report.add(
            "accounting",
            Outcome.OK,
            f"slurmdbd answers through /slurmdb/{client.version}: a job purged from slurmctld "
            "is read from accounting (final state, exit code, times; adoption by name)",
        )
    else:
        report.add(
            "accounting",
            Outcome.WARN,
            "no accounting through slurmrestd: a job purged from slurmctld (MinJobAge after "
            "its end) while the operator is away ends Unknown (JobLost), and a lost submit "
            "whose job was purged is not found again",
        )


def _check_absence_mode(settings: Settings, client: SlurmClient, report: Report) -> None:
    """How an unconfirmed submit that is found nowhere ends on this cluster."""
    window = Window(
        settings.slurm_rest_timeout, settings.slurm_message_timeout, settings.absence_margin
    )
    if mode(client.accounting) is Mode.PROOF:
        report.add(
            "exactly-once",
            Outcome.OK,
            f"proof mode: an unconfirmed submit found neither in slurmctld nor in accounting "
            f"{window.seconds:.0f} s after it was sent (rest timeout + MessageTimeout + "
            "margin), with nothing queued for slurmdbd, is proven absent and resubmitted",
        )
    else:
        report.add(
            "exactly-once",
            Outcome.WARN,
            "manual mode (no accounting): an unconfirmed submit found nowhere waits for a "
            "person to check Slurm and set the slurmjob.io/declare-lost annotation",
        )


#: How long the staging probe waits for its job to end before it gives up (a busy cluster).
PROBE_TIMEOUT = 60.0
PROBE_MARK = "slurmjob-doctor-probe"
#: At most this many Slurm users are probed (the operator's own, then tenants' slurmUsers).
PROBE_USERS = 8


@dataclass(frozen=True)
class _Prober:
    label: str
    slurm_user: str | None
    job_uid: int | None


def _probers(settings: Settings, clusters: Sequence[str]) -> list[_Prober]:
    """Who jobs run as on this cluster: the operator's own Slurm user (jobs of tenants with
    no slurmUser, or every job when single-tenant) and each tenant's slurmUser."""
    out = [_Prober("the operator's Slurm user", None, None)]
    try:
        tenants = load_tenants(settings.tenants_file, clusters=list(clusters))
    except CatalogError:
        return out  # reported by the tenancy check
    if tenants is None:
        return out
    seen: set[tuple[str | None, int | None]] = {(None, None)}
    for tenant in tenants.for_cluster(settings.cluster_name).tenants:
        key = (tenant.slurm_user, tenant.uid)
        if tenant.slurm_user is None or key in seen:
            continue
        seen.add(key)
        out.append(_Prober(f"tenant {tenant.name} ({tenant.slurm_user})", *key))
    return out[:PROBE_USERS]


def _probe_files(settings: Settings, where: Path, job_uid: int | None) -> None:
    """The probe's attempt directory, made as the operator makes a job's (same owner, mode
    and ACLs), with nothing in it but a marker file."""
    files = {SCRIPT_FILE: StagedFile(f"#!/bin/bash\necho {PROBE_MARK}\n".encode(), 0o755)}
    if job_uid is not None:
        stage_attempt(settings, where, files, job_uid=job_uid)
    else:
        stage_attempt(settings, where, files)


async def _cancel_probe(
    client: SlurmClient, settings: Settings, request: LaunchRequest, job_id: int
) -> None:
    """Cancel the probe job that did not end, once a read shows it is the probe (its exact
    name and comment, its user the one the probe was sent as)."""
    acting = client.user
    with verified.step():
        made = verified.verify_named(
            await client.get_job(job_id),
            request.job_name,
            request.comment,
            owners=frozenset({acting} if acting else ()),
            cluster=settings.cluster_name,
        )
        if isinstance(made, verified.VerifiedJob):
            await client.cancel(made)


async def _probe_one(
    settings: Settings, transport: HttpTransport, prober: _Prober
) -> tuple[Outcome, str]:
    token = None if prober.slurm_user is None else user_token(settings, prober.slurm_user)
    client = await connect(settings, transport, token=token)
    tag = uuid.uuid4().hex[:12]
    # A tree of its own per probe (removed after), made as a job's: <root>/<ns>/<name>/attempt.
    base = settings.storage_root / f".slurmjob-doctor-{tag}"
    where = base / "probe" / "attempt-1"
    await asyncio.to_thread(_probe_files, settings, where, prober.job_uid)
    try:
        seen = settings.to_cluster_path(where)
        request = LaunchRequest(
            job_name=f"{PROBE_MARK}-{tag}",
            comment=f"slurmjob.io doctor probe {tag}",
            script=f"#!/bin/bash\necho {PROBE_MARK}\n",
            working_directory=str(seen),
            standard_output=str(seen / STDOUT_FILE),
            standard_error=str(seen / STDERR_FILE),
            environment={"PATH": settings.slurm_job_path},
            components=[JobComponent(pool="probe", nodes=1, cpus_per_task=1, memory_mb=64)],
            partition=settings.slurm_partition,
            time_limit_minutes=1,
        )
        receipt = await client.submit(request)
        ended = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PROBE_TIMEOUT
        while loop.time() < deadline:
            views = await client.get_job(receipt.job_id)
            if views and all(v.is_final for v in views):
                ended = views[0]
                break
            await asyncio.sleep(1.0)
        if ended is None:
            with contextlib.suppress(SlurmError):
                await _cancel_probe(client, settings, request, receipt.job_id)
            return Outcome.WARN, (
                f"probe job {receipt.job_id} as {prober.label} did not end within "
                f"{PROBE_TIMEOUT:.0f} s (cancelled); the staging root was not checked"
            )
        text = await asyncio.to_thread(_read_probe_output, settings, where)
        if text is not None and PROBE_MARK in text:
            return Outcome.OK, (
                f"a probe job as {prober.label} (Slurm user {ended.user or '?'}) wrote its "
                f"log in a staging directory like a job's ({seen})"
            )
        owner = await asyncio.to_thread(attempt_dir_owner, settings, where, None)
        made = (
            f"owned by {owner[0]}:{owner[1]} with mode {owner[2] & 0o7777:04o}"
            if owner is not None
            else "not examinable"
        )
        return Outcome.FAIL, (
            f"a probe job as {prober.label} (Slurm user {ended.user or '?'}) could not write "
            f"its log in {seen} (the directory is {made}); Slurm says "
            f"{','.join(ended.raw_state)} {ended.reason or ''}: every job would fail "
            "StagingNotWritable; set SLURMJOB_STAGING_OWNER to the job user's uid:gid, or give "
            "the tenant its uid (POSIX ACLs)"
        )
    finally:
        await asyncio.to_thread(shutil.rmtree, base, True)


def _read_probe_output(settings: Settings, where: Path) -> str | None:
    """The probe's standard output, read like a job's log (no link followed, any owner the
    job user might be); None when there is none."""
    try:
        with walk(settings.storage_root, below(settings.storage_root, where), _ANY_OWNER) as fd:
            if lstat_at(fd, STDOUT_FILE) is None:
                return None
            st = os.stat(STDOUT_FILE, dir_fd=fd, follow_symlinks=False)
            file = open_file(fd, STDOUT_FILE, st.st_uid, str(where / STDOUT_FILE))
            try:
                return read_at_most(file, 4096).decode("utf-8", "replace")
            finally:
                os.close(file)
    except OSError:
        return None


async def _check_staging_probe(settings: Settings, report: Report, clusters: Sequence[str]) -> None:
    """A tiny job per job user, writing its log where jobs write theirs: a staging directory
    the job user cannot write fails every job on its node (Slurm says only `RaisedSignal:53`)."""
    async with open_transport(settings) as transport:
        for prober in _probers(settings, clusters):
            try:
                outcome, detail = await _probe_one(settings, transport, prober)
            except (SlurmError, TokenError, ConfigError, OSError, ValueError, StagingError) as exc:
                outcome, detail = (
                    Outcome.FAIL,
                    (f"probe job as {prober.label} not run: {type(exc).__name__}: {exc}"),
                )
            report.add("staging writable", outcome, detail)


async def run_doctor(environ: dict[str, str] | None = None, *, probe: bool = True) -> Report:
    report = Report()
    try:
        settings = Settings.from_env(os.environ if environ is None else environ)
    except ConfigError as exc:
        report.add("settings", Outcome.FAIL, str(exc))
        return report
    try:
        sites = load_clusters(settings)
    except ConfigError as exc:
        report.add("clusters", Outcome.FAIL, str(exc))
        return report
    names = [site.name for site in sites]
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
    catalogs_ok = True
    registry, series = RuntimeRegistry(), GpuSeriesCatalog()
    try:
        registry = load_runtime_registry(settings.runtime_registry_file)
        series = load_gpu_series(settings.gpu_series_file)
    except CatalogError as exc:
        report.add("catalogs", Outcome.FAIL, str(exc))
        catalogs_ok = False
    else:
        report.add(
            "catalogs",
            Outcome.OK,
            f"{len(registry.runtimes)} runtime(s), {len(series.series)} GPU series",
        )
    _check_tenancy(settings, registry, report, clusters)
    await _check_slurm(settings, series, report)
    _check_storage(settings, report)
    if catalogs_ok:
        await _check_runtimes(settings, registry, report)
    slurm_ok = all(
        c.outcome is Outcome.OK for c in report.checks if c.name in ("slurmrestd", "auth")
    )
    if probe and slurm_ok:
        await _check_staging_probe(settings, report, clusters)
    elif probe:
        report.add("staging writable", Outcome.SKIP, "slurmrestd does not answer: not probed")


__all__ = ["Check", "Outcome", "Report", "run_doctor"]
