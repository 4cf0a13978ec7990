"""Rendered SlurmJobs through the project's own client against the two real Slurm releases.

Every job here is rendered by the real pipeline (site resolution, templates, the version's
dialect, preflight), staged on the shared storage and submitted through slurmrestd; the
container runtimes are the testbed's stand-ins (see tests/testbed/).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.integration import leaks
from tests.integration.helpers import cpu_spec, het_pools, step_records, wait_for_job
from tests.integration.sitefiles import site_env
from tests.testbed.handles import cancel_own
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.api.errors import parse_spec
from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import (
    PreparedAttempt,
    Site,
    prepare_attempt,
    stage,
    verify_runtime,
)
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.slurm.auth import MintedToken
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport
from slurmjob_operator.slurm.dialects import SubmitReceipt
from slurmjob_operator.slurm.errors import SlurmAuthError, SlurmRejected

pytestmark = pytest.mark.integration


async def stage_and_submit(
    client: SlurmClient, prepared: PreparedAttempt, settings: Settings
) -> SubmitReceipt:
    """The controller's order: verify the artifact, write the attempt's files, POST once."""
    verify_runtime(prepared, settings)
    stage(prepared, settings)
    return await client.submit(prepared.rendered.launch)


@dataclass(frozen=True)
class Bed:
    testbed: SlurmTestbed
    settings: Settings
    site: Site
    namespace: str


@pytest.fixture(params=["apptainer", "enroot-pyxis"])
def profile(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _bed(testbed: SlurmTestbed, profile: str, tmp_path: Path) -> Bed:
    settings = Settings.from_env(site_env(testbed, profile, tmp_path))
    return Bed(testbed, settings, Site.load(settings), f"it-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def bed(slurm: SlurmTestbed, profile: str, tmp_path: Path) -> Bed:
    return _bed(slurm, profile, tmp_path)


@pytest.fixture
async def client(bed: Bed) -> AsyncIterator[SlurmClient]:
    async with open_transport(bed.settings) as session:
        yield await connect(bed.settings, session)


def _spec(bed: Bed, command: list[str], **overrides: Any) -> dict[str, Any]:
    profile = bed.settings.slurm_runtime_profile
    return cpu_spec(command, profile, **{"timeLimit": "7m", **overrides})


def _prepare(
    bed: Bed,
    client: SlurmClient,
    spec: dict[str, Any],
    *,
    name: str = "job",
    secrets: dict[str, str] | None = None,
) -> PreparedAttempt:
    return prepare_attempt(
        parse_spec(spec),
        bed.site,
        namespace=bed.namespace,
        name=name,
        uid=str(uuid.uuid4()),
        attempt=1,
        api_version=client.version,
        secret_values=secrets or {},
    )


async def _wait(
    client: SlurmClient, ref: int | str, *, final: bool = True, within: float = 45.0
) -> list[SlurmJobView]:
    return await wait_for_job(client, ref, final=final, within=within)


def _steps(bed: Bed, prepared: PreparedAttempt) -> list[dict[str, Any]]:
    """The recording plugin's records of one attempt's steps (their working directory is the
    attempt's staging directory)."""
    staging = str(prepared.rendered.staging_dir)
    return step_records(bed.testbed.record_dir, bed.testbed.cluster_name, cwd=staging)


async def test_discovery_picks_the_newest_served_version(bed: Bed, client: SlurmClient) -> None:
    assert client.version == bed.testbed.api_version
    ping = await client.ping()
    assert ping.responding


async def test_cpu_job_completes_with_its_output_staged(bed: Bed, client: SlurmClient) -> None:
    tricky = 'it\'s "quoted" $(not run) `nor this`; *'
    spec = _spec(
        bed,
        [
            "bash",
            "-c",
            'echo "arg=$1 env=$GREETING secret=$TOKEN"; echo to-stderr >&2; '
            "cat /etc/slurmjob-testbed-image",
            "x",
            tricky,
        ],
        env=[
            {"name": "GREETING", "value": tricky},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
    )
    prepared = _prepare(bed, client, spec, secrets={"TOKEN": leaks.secret("s3cr3t-value")})
    receipt = await stage_and_submit(client, prepared, bed.settings)
    [job] = await _wait(client, receipt.job_id)

    assert job.base_state is BaseState.COMPLETED
    assert job.exit.return_code == 0
    assert job.name == prepared.rendered.launch.job_name
    assert job.comment == prepared.rendered.launch.comment
    staging = prepared.rendered.staging_dir
    out = (staging / "stdout.log").read_text()
    assert f"arg={tricky} env={tricky} secret=s3cr3t-value" in out
    assert "to-stderr" in (staging / "stderr.log").read_text()
    assert not (staging / "secrets.env").exists(), "the secrets file is shredded on exit"
    assert "s3cr3t-value" not in (staging / "job.sh").read_text()
    # Options come from the JSON description (slurmrestd ignores #SBATCH lines).
    script_lines = prepared.rendered.launch.script.splitlines()
    assert not [line for line in script_lines if line.startswith("#SBATCH")]
    assert job.time_limit_minutes == 7
    # It ran in the test bed's image, through the runtime: the image's marker, and on the
    # host side the command's words intact at the end of the task's argv (after apptainer's
    # options and the image, or alone under Pyxis).
    assert "slurmjob-testbed-image name=base " in out
    [step] = _steps(bed, prepared)
    assert step["argv"][-len(spec["command"]) :] == spec["command"]
    if bed.settings.slurm_runtime_profile == "apptainer":
        image = str(bed.testbed.storage_root / "runtimes" / "testbed-base.sif")
        assert step["argv"][:3] == ["apptainer", "--quiet", "exec"]
        assert image in step["argv"]


async def test_failing_job_reports_its_exit_code(bed: Bed, client: SlurmClient) -> None:
    prepared = _prepare(bed, client, _spec(bed, ["bash", "-c", "exit 3"]))
    receipt = await stage_and_submit(client, prepared, bed.settings)
    [job] = await _wait(client, receipt.job_id)
    assert job.base_state is BaseState.FAILED
    assert job.exit.return_code == 3


async def test_cancel_running_job_and_cancel_again(bed: Bed, client: SlurmClient) -> None:
    prepared = _prepare(bed, client, _spec(bed, ["sleep", "300"]))
    receipt = await stage_and_submit(client, prepared, bed.settings)
    await _wait(client, receipt.job_id, final=False)
    await cancel_own(client, receipt.job_id)
    [job] = await _wait(client, receipt.job_id)
    assert job.base_state is BaseState.CANCELLED
    again = await cancel_own(client, receipt.job_id)  # cancelling a finished job is success
    assert again is not None


async def test_find_by_exact_name(bed: Bed, client: SlurmClient) -> None:
    prepared = _prepare(bed, client, _spec(bed, ["sleep", "300"]), name="findme")
    receipt = await stage_and_submit(client, prepared, bed.settings)
    try:
        found = await client.find_by_name(prepared.rendered.launch.job_name)
        assert [j.job_id for j in found] == [receipt.job_id]
        assert await client.find_by_name(prepared.rendered.launch.job_name + "x") == []
    finally:
        await cancel_own(client, receipt.job_id)


async def test_heterogeneous_gpu_job_runs_on_both_constrained_nodes(
    bed: Bed, client: SlurmClient
) -> None:
    spec = _spec(bed, ["/opt/ray/bin/python3", "-c", RAY_PROGRAM], pools=het_pools())
    prepared = _prepare(bed, client, spec)
    assert len(prepared.rendered.launch.components) == 2
    receipt = await stage_and_submit(client, prepared, bed.settings)
    # Both nodes at once: it queues while another lane's job holds one.
    jobs = await _wait(client, receipt.job_id, within=240)
    assert len(jobs) == 2, jobs
    by_offset = {j.het_job_offset: j for j in jobs}
    assert by_offset[0].nodes == "n1"
    assert by_offset[0].constraints == "h100"
    assert by_offset[1].nodes == "n2"
    assert by_offset[1].constraints == "a100"
    staging = prepared.rendered.staging_dir
    out = (staging / "stdout.log").read_text()
    assert all(j.base_state is BaseState.COMPLETED for j in jobs), (
        jobs,
        out,
        (staging / "stderr.log").read_text()[-3000:],
        (staging / "ray.log").read_text()[-3000:],
    )
    # Real Ray: the command joined the job's cluster and ran a task on each node's raylet.
    assert "head=n1 master=n1 world=2" in out
    assert "ray-tasks-ran-on=n1,n2" in out, out
    # On the host side: the head's GCS port was picked on n1 at run time (never 6379) and the
    # worker on n2 joined that address.
    ray_steps = [(r["nodename"], _ray_words(r["argv"])) for r in _steps(bed, prepared)]
    starts = [(node, words) for node, words in ray_steps if words[:2] == ["ray", "start"]]
    [(head_node, head)] = [(n, w) for n, w in starts if "--head" in w]
    assert head_node == "n1"
    [port] = [w.removeprefix("--port=") for w in head if w.startswith("--port=")]
    assert port != "6379", head
    workers = [(n, w) for n, w in starts if "--head" not in w]
    assert [n for n, _ in workers] == ["n2"], starts
    assert all(f"--address=n1:{port}" in w for _, w in workers), workers


#: The command of the Ray test: waits for both raylets, runs one task on each (pinned to the
#: node), prints where each ran (the raylet's SLURMD_NODENAME, from the step on that node).
RAY_PROGRAM = """
import os, socket, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
ray.init()
deadline = time.time() + 90
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
    time.sleep(0.5)
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
@ray.remote(num_cpus=0)
def where():
    return os.environ.get("SLURMD_NODENAME", "?")
ran = ray.get([where.options(scheduling_strategy=On(n, soft=False)).remote() for n in nodes])
print("head=%s master=%s world=%s" % (os.environ["SLURMD_NODENAME"],
      os.environ["MASTER_ADDR"], os.environ["WORLD_SIZE"]))
print("ray-tasks-ran-on=" + ",".join(sorted(ran)), flush=True)
"""


def _ray_words(argv: list[str]) -> list[str]:
    """The Ray command of a step's argv: from its `ray` word (after apptainer's options and
    image, or the worker's rank wrapper); [] when there is none."""
    return argv[argv.index("ray") :] if "ray" in argv else []


async def test_refused_description_carries_slurms_error_text(bed: Bed, client: SlurmClient) -> None:
    prepared = _prepare(bed, client, _spec(bed, ["true"], partition="no-such-partition"))
    with pytest.raises(SlurmRejected) as info:
        await stage_and_submit(client, prepared, bed.settings)
    assert "partition" in str(info.value).lower()


async def test_bad_token_is_an_auth_error(bed: Bed, tmp_path: Path) -> None:
    wrong_key = tmp_path / "wrong.key"
    wrong_key.write_bytes(os.urandom(32))
    token = MintedToken(wrong_key, bed.testbed.user, 600)
    async with open_transport(bed.settings) as session:
        bad = SlurmClient(
            session,
            bed.settings.slurm_rest_url,
            bed.testbed.api_version,
            token=token,
            user=bed.testbed.user,
        )
        with pytest.raises(SlurmAuthError):
            await bad.ping()
        async with open_transport(bed.settings) as good_session:
            good = await connect(bed.settings, good_session)
            prepared = _prepare(bed, good, _spec(bed, ["true"]))
        with pytest.raises(SlurmAuthError):
            await stage_and_submit(bad, prepared, bed.settings)


@pytest.fixture
def bed_2605(slurm_2605: SlurmTestbed, tmp_path: Path) -> Iterator[Bed]:
    return _bed(slurm_2605, "apptainer", tmp_path)


@pytest.mark.slurm2605
async def test_sluid_addresses_get_and_cancel(bed_2605: Bed) -> None:
    bed = bed_2605
    async with open_transport(bed.settings) as session:
        client = await connect(bed.settings, session)
        prepared = _prepare(bed, client, _spec(bed, ["sleep", "300"]))
        receipt = await stage_and_submit(client, prepared, bed.settings)
        [job] = await _wait(client, receipt.job_id, final=False)
        assert job.sluid
        assert job.sluid.startswith("s")
        assert len(job.sluid) == 14
        [by_sluid] = await client.get_job(job.sluid)
        assert by_sluid.job_id == receipt.job_id
        await cancel_own(client, job.sluid)
        [done] = await _wait(client, job.sluid)
        assert done.base_state is BaseState.CANCELLED
