"""The staging probe: a tiny job per job user, writing its log where jobs write theirs, since a
staging directory the job user cannot write fails every job on its node and Slurm says only
`RaisedSignal:53`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmjob_operator.config import ConfigError, Settings
from slurmjob_operator.core import verified
from slurmjob_operator.core.launch import JobComponent, LaunchRequest, StagedFile
from slurmjob_operator.core.naming import SCRIPT_FILE, STDERR_FILE, STDOUT_FILE
from slurmjob_operator.doctor.report import Outcome, Report
from slurmjob_operator.site.catalogs import CatalogError
from slurmjob_operator.site.tenants import load_tenants
from slurmjob_operator.slurm.auth import TokenError
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport, user_token
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.slurm.http import HttpTransport
from slurmjob_operator.storage.logs import attempt_dir_owner
from slurmjob_operator.storage.nofollow import below, lstat_at, open_file, read_at_most, walk
from slurmjob_operator.storage.staging import stage_attempt
from slurmjob_operator.storage.stagingtree import StagingError

#: The probe's directory may hold whatever the job user made; it is only read, never followed.
_ANY_OWNER = range(0, 1 << 32)


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


async def check_staging_probe(settings: Settings, report: Report, clusters: Sequence[str]) -> None:
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
