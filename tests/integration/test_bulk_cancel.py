"""Deleting many SlurmJobs at once: the cancels go out together and the waits share sweeps,
against both real Slurm releases (one `DELETE /jobs` on 26.05, per-job cancels on 22.05)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from tests.integration.helpers import cpu_spec
from tests.integration.sitefiles import site_env
from tests.testbed.handles import own_job
from tests.testbed.slurm import SlurmTestbed
from tests.unit.handles import handle

from slurmjob_operator.api.errors import parse_spec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.cancelling import Canceller
from slurmjob_operator.controller.pipeline import Site, prepare_attempt, stage, verify_runtime
from slurmjob_operator.core import verified
from slurmjob_operator.core.jobview import BaseState
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport
from slurmjob_operator.slurm.errors import SlurmNotFound

pytestmark = pytest.mark.integration


async def submit_sleepers(client: SlurmClient, settings: Settings, count: int) -> list[int]:
    site = Site.load(settings)
    namespace = f"it-{uuid.uuid4().hex[:10]}"
    spec = parse_spec(cpu_spec(["sleep", "300"], settings.slurm_runtime_profile, timeLimit="7m"))
    ids = []
    for i in range(count):
        prepared = prepare_attempt(
            spec,
            site,
            namespace=namespace,
            name=f"bulk-{i}",
            uid=str(uuid.uuid4()),
            attempt=1,
            api_version=client.version,
            secret_values={},
        )
        verify_runtime(prepared, settings)
        stage(prepared, settings)
        ids.append((await client.submit(prepared.rendered.launch)).job_id)
    return ids


async def test_many_cancels_in_one_go_and_one_wait_for_all(
    slurm: SlurmTestbed, tmp_path: Path
) -> None:
    settings = Settings.from_env(site_env(slurm, "apptainer", tmp_path))
    requests: list[tuple[str, str]] = []

    def seen(template: str, method: str, outcome: str, seconds: float) -> None:
        requests.append((method, template))

    async with open_transport(settings) as transport:
        client = await connect(settings, transport, on_request=seen)

        async def acting(user: str | None) -> SlurmClient:
            return client

        async def own() -> SlurmClient:
            return client

        ids = await submit_sleepers(client, settings, 6)
        unknown = 99_999_990
        canceller = Canceller(own, acting, tick=0.25)
        with verified.step():
            # A handle on a job Slurm does not know can only be made up (a unit-test handle):
            # it stands for a job verified, then purged before the cancel.
            jobs = [*[await own_job(client, i) for i in ids], handle(unknown, client.user or "")]
            requests.clear()
            outcomes = await asyncio.gather(
                *(canceller.cancel(job) for job in jobs), return_exceptions=True
            )
        assert outcomes[:-1] == [None] * len(ids)
        assert isinstance(outcomes[-1], SlurmNotFound)
        deletes = [t for m, t in requests if m == "DELETE"]
        if client.dialect.supports_bulk_cancel:
            assert deletes == [f"/slurm/{client.version}/jobs"], "one request for all"
        else:
            assert len(deletes) == len(ids) + 1, "22.05: one by one"
        requests.clear()
        ended = await asyncio.gather(*(canceller.until_final(i, 60) for i in ids))
        assert all(ended)
        for job_id in ids:
            [job] = await client.get_job(job_id)
            assert job.base_state is BaseState.CANCELLED
        sweeps = [t for m, t in requests if m == "GET"]
        # The waits share each tick's sweep: one request per tick on 26.05 (per job on 22.05,
        # which has no /jobs/state), whatever the number of waiting callers.
        per_tick = 1 if client.dialect.supports_jobs_state else len(ids)
        assert 1 <= len(sweeps) <= 8 * per_tick
