"""The baseline of the scale bench: the per-object design every peer operator uses.

A kopf operator with one kopf timer per SlurmJob, each doing one `GET /job/{id}` per interval
and patching `status.phase` when it changed. On create it submits the job itself (the
SlurmJob's `spec.command` in a minimal batch script, through the project's `SlurmClient`, so
slurmrestd sees the same kind of request and both operators run the same jobs); on delete it
cancels the job and lets the object go (no waiting). It renders nothing, stages nothing and
keeps no logs: it is what polling costs when nothing is shared between objects.

Settings come from the same SLURMJOB_* environment as the operator (REST URL, user, JWT key,
partition, storage root, poll interval). Job files go to `<storage root>/bench-scale-baseline`,
which the bench creates for the job user. Run it as the bench does::

    python -m kopf run --standalone -n NAMESPACE bench/baseline_operator.py
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import kopf

from slurmjob_operator.config import Settings
from slurmjob_operator.core import verified
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.core.launch import JobComponent, LaunchRequest
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport
from slurmjob_operator.slurm.errors import SlurmError, SlurmNotFound

RESOURCE = ("slurmjob.io", "v1alpha1", "slurmjobs")
INTERVAL = float(os.environ.get("SLURMJOB_POLL_INTERVAL", "10"))
WORKDIR_NAME = "bench-scale-baseline"
# What a peer maps Slurm's base state to; flags and reasons are ignored on purpose.
PHASES = {
    BaseState.PENDING: "Queued",
    BaseState.RUNNING: "Running",
    BaseState.SUSPENDED: "Running",
    BaseState.COMPLETED: "Succeeded",
    BaseState.CANCELLED: "Cancelled",
    BaseState.PREEMPTED: "Cancelled",
}
FINAL = frozenset({"Succeeded", "Failed", "Cancelled"})


class _State:
    client: SlurmClient | None = None
    settings: Settings | None = None


STATE = _State()


def _client() -> SlurmClient:
    if STATE.client is None:
        raise kopf.TemporaryError("not connected to slurmrestd yet", delay=5)
    return STATE.client


def phase_of(view: SlurmJobView) -> str:
    if view.base_state is None:
        return "Unknown"
    return PHASES.get(view.base_state, "Failed")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Its own annotations and finalizer: kopf's defaults would land in a status the CRD's
    # schema prunes, and must not collide with the operator's when both ran on one object.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="baseline.bench.slurmjob.io"
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="baseline.bench.slurmjob.io"
    )
    settings.persistence.finalizer = "baseline.bench.slurmjob.io/finalizer"
    ours = Settings.from_env()
    STATE.settings = ours
    STATE.client = await connect(ours, open_transport(ours))


@kopf.on.create(*RESOURCE)
async def submit(
    spec: kopf.Spec, name: str, namespace: str, uid: str, patch: kopf.Patch, **_: Any
) -> None:
    settings = STATE.settings
    assert settings is not None
    workdir = settings.storage_root / WORKDIR_NAME
    command = list(spec.get("command") or ["true"])
    request = LaunchRequest(
        job_name=f"sj-{namespace}-{name}-base",
        comment=f"slurmjob bench baseline uid={uid}",
        script="#!/bin/bash\n" + shlex.join(command) + "\n",
        working_directory=str(workdir),
        standard_output=str(workdir / f"{name}.out"),
        standard_error=str(workdir / f"{name}.err"),
        environment={"PATH": settings.slurm_job_path or "/usr/bin:/bin"},
        components=[JobComponent(pool="main", nodes=1, cpus_per_task=1, memory_mb=1024)],
        partition=settings.slurm_partition,
        time_limit_minutes=600,
    )
    try:
        receipt = await _client().submit(request)
    except SlurmError as exc:
        raise kopf.TemporaryError(f"submit failed: {exc}", delay=10) from exc
    patch.status["slurmJobId"] = int(receipt.job_id)
    patch.status["phase"] = "Queued"


@kopf.timer(*RESOURCE, interval=INTERVAL)
async def poll(status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    job_id = status.get("slurmJobId")
    if not job_id or status.get("phase") in FINAL:
        return
    try:
        views = await _client().get_job(int(job_id))
        phase = phase_of(views[0])
    except SlurmNotFound:
        phase = "Unknown"
    except SlurmError:
        return  # next interval
    if phase != status.get("phase"):
        patch.status["phase"] = phase


@kopf.on.delete(*RESOURCE)
async def cancel(status: kopf.Status, name: str, namespace: str, uid: str, **_: Any) -> None:
    job_id = status.get("slurmJobId")
    if not job_id or status.get("phase") in FINAL:
        return
    client = _client()
    try:
        # A status's id is a claim: cancelled only once a read shows the job it submitted.
        with verified.step():
            made = verified.verify_named(
                await client.get_job(int(job_id)),
                f"sj-{namespace}-{name}-base",
                f"slurmjob bench baseline uid={uid}",
                owners=frozenset({client.user} if client.user else ()),
                cluster="bench",
            )
            if isinstance(made, verified.VerifiedJob):
                await client.cancel(made)
    except SlurmNotFound:
        pass
    except SlurmError as exc:
        raise kopf.TemporaryError(f"cancel failed: {exc}", delay=5) from exc
