"""Helpers shared by the integration tests: the operator's console script, SlurmJob specs,
and Slurm jobs asked straight from slurmrestd through the project's own client."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.integration.sitefiles import runtime_id

from slurmjob_operator.config import Settings
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport
from slurmjob_operator.slurm.errors import SlurmNotFound, SlurmTransient

OPERATOR = Path(sys.executable).parent / "slurmjob-operator"

T = TypeVar("T")


def cpu_spec(command: list[str], profile: str = "apptainer", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "framework": {"kind": "custom", "name": "custom", "runtimeId": runtime_id(profile)},
        "command": command,
        "pools": [{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 1, "memoryGb": 1}],
        "timeLimit": "10m",
    }
    spec.update(extra)
    if runs_ray(spec):
        spec["framework"] = {**spec["framework"], "runtimeId": runtime_id(profile, ray=True)}
    return spec


#: Step ids at and above this are Slurm's own steps (batch, extern, interactive).
SLURM_OWN_STEPS = 0xFFFFFFF0


def step_records(record_dir: Path, cluster: str, **match: Any) -> list[dict[str, Any]]:
    """What the recording SPANK plugin saw of the steps' tasks on the host side (before any
    container): its records on ``cluster`` whose fields equal ``match`` (e.g. cwd=, sluid=),
    of the job's own steps (not the batch step). Job ids repeat across test bed restarts; a
    staging directory or a SLUID does not."""
    path = record_dir / "steps.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("cluster") != cluster or record.get("step_id", 0) >= SLURM_OWN_STEPS:
            continue
        if all(record.get(k) == v for k, v in match.items()):
            found.append(record)
    return found


def runs_ray(spec: dict[str, Any]) -> bool:
    """Whether the spec's job runs the Ray shape (GPU pools and no other launch shape): it
    needs the image with Ray."""
    gpus = any(pool.get("gpusPerNode", 0) for pool in spec.get("pools", []))
    return gpus and spec.get("launch", {}).get("shape", "ray") == "ray"


#: A retry rule for exit code 3, once: what the tests make fail on purpose.
RETRY_EXIT_3 = {
    "limit": 1,
    "backoffSeconds": 0,
    "rules": [{"action": "Retry", "onExitCodes": {"operator": "In", "values": [3]}}],
}


def het_pools(second_series: str = "a100") -> list[dict[str, Any]]:
    """Two one-node pools of 2 GPUs: "policy" on h100, "rollout" on ``second_series``."""
    return [
        {
            "name": "policy",
            "gpuSeries": "h100",
            "nodes": 1,
            "gpusPerNode": 2,
            "cpus": 1,
            "memoryGb": 1,
        },
        {
            "name": "rollout",
            "gpuSeries": second_series,
            "nodes": 1,
            "gpusPerNode": 2,
            "cpus": 1,
            "memoryGb": 1,
        },
    ]


def ask_slurm(env: dict[str, str], ask: Callable[[SlurmClient], Awaitable[T]]) -> T:
    """Run ``ask`` with a client connected as the SLURMJOB_* settings in ``env`` say."""

    async def run() -> T:
        settings = Settings.from_env(env)
        async with open_transport(settings) as transport:
            client: SlurmClient = await connect(settings, transport)
            return await ask(client)

    return asyncio.run(run())


def slurm_job(env: dict[str, str], job_id: int) -> list[SlurmJobView]:
    """The components of Slurm job ``job_id``: slurmctld's, or accounting's once slurmctld has
    purged the ended job (MinJobAge is 20 s on 26.05, the purge runs at slurmctld's pace, and
    a test on a loaded host may read later than that)."""

    async def ask(client: SlurmClient) -> list[SlurmJobView]:
        try:
            return await client.get_job(job_id)
        except SlurmNotFound:
            if not await client.has_accounting():
                raise
            views = await client.get_job_accounting(job_id)
            if not views:
                raise
            return views

    return ask_slurm(env, ask)


def slurm_jobs_named(env: dict[str, str], job_name: str) -> list[SlurmJobView]:
    """Every Slurm job named ``job_name``."""
    return ask_slurm(env, lambda client: client.find_by_name(job_name))


async def wait_for_job(
    client: SlurmClient, ref: int | str, *, final: bool = True, within: float = 45.0
) -> list[SlurmJobView]:
    """Read job ``ref`` until all its components are final (or running, with ``final=False``).

    A read that fails in transit (slurmrestd 22.05 resets a connection now and then when the
    host is loaded) is read again at the next tick, as the operator's poller does; the last
    such failure is named if the deadline passes."""
    deadline = time.monotonic() + within
    jobs: list[SlurmJobView] = []
    failure: SlurmTransient | None = None
    while time.monotonic() < deadline:
        try:
            jobs = await client.get_job(ref)
        except SlurmTransient as exc:
            failure = exc
            await asyncio.sleep(0.25)
            continue
        if jobs and final and all(j.is_final for j in jobs):
            return jobs
        if jobs and not final and all(j.base_state is BaseState.RUNNING for j in jobs):
            return jobs
        await asyncio.sleep(0.25)
    raise AssertionError(
        f"job {ref} did not get there in {within} s: {jobs} (last read failure: {failure})"
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for an operator's listener)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
