"""The collective probe on the real Slurm 26.05 (issue 26, part 2): each attempt is rendered by
the real pipeline, staged and submitted through slurmrestd; the batch script runs the stand-in
probe (`tests/testbed/standins/collective-probe`) inside the apptainer stand-in, once per node
as one step (over both components of a heterogeneous job), with a five-second rung limit.

What the operator does between attempts is the same code it runs (the record parsed, the
decision after a failed probe, the probe book remembering, the next attempt prepared with it);
only the book's ConfigMap is an in-memory one here."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import cpu_spec, wait_for_job
from tests.integration.test_launch_shapes_e2e import _one_gpu_each
from tests.integration.test_slurm_jobs import Bed, _bed, stage_and_submit
from tests.testbed.slurm import SlurmTestbed
from tests.unit.controller_fakes import MemoryConfigMaps

from slurmjob_operator.api.errors import parse_spec
from slurmjob_operator.api.probestatus import AttemptProbe
from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus
from slurmjob_operator.controller.pipeline import PreparedAttempt, Site, prepare_attempt
from slurmjob_operator.controller.probebook import ProbeBook
from slurmjob_operator.core.jobview import BaseState, SlurmJobView
from slurmjob_operator.core.probe import (
    PROBE_RETRY_ACTION,
    ProbeRecord,
    after_failed_probe,
    parse_record,
    with_probe,
)
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport
from slurmjob_operator.times import utc_now

pytestmark = pytest.mark.integration

TIMEOUT = 5


class Avoiding:
    """A lookup that only avoids the given nodes (to place the first attempt)."""

    def __init__(self, *nodes: str) -> None:
        self.nodes = nodes

    def cached_rung(self, key: str) -> int | None:
        return None

    def avoided(self, key: str) -> tuple[str, ...]:
        return self.nodes


def _probe_bed(testbed: SlurmTestbed, tmp_path: Path, probe: dict[str, Any]) -> Bed:
    bed = _bed(testbed, "apptainer", tmp_path)
    registry = bed.settings.runtime_registry_file
    assert registry is not None
    data = json.loads(registry.read_text())
    for runtime in data["runtimes"]:
        runtime["probe"] = probe
    registry.write_text(json.dumps(data))
    return Bed(testbed, bed.settings, Site.load(bed.settings), bed.namespace)


def _spec(nodes: int, gpus: int, command: str) -> dict[str, Any]:
    pool = {"name": "main", "gpuSeries": "l40s", "nodes": nodes, "gpusPerNode": gpus}
    pool |= {"cpus": 1, "memoryGb": 1}
    return cpu_spec(
        ["bash", "-c", command], pools=[pool], launch={"shape": "nodes"}, timeLimit="5m"
    )


async def _attempt(
    bed: Bed,
    client: SlurmClient,
    spec: dict[str, Any],
    name: str,
    uid: str,
    number: int,
    probes: Any,
) -> tuple[PreparedAttempt, list[SlurmJobView]]:
    prepared = prepare_attempt(
        parse_spec(spec),
        bed.site,
        namespace=bed.namespace,
        name=name,
        uid=uid,
        attempt=number,
        api_version=client.version,
        secret_values={},
        probes=probes,
    )
    receipt = await stage_and_submit(client, prepared, bed.settings)
    jobs = await wait_for_job(client, receipt.job_id, within=150)
    return prepared, jobs


def _record(prepared: PreparedAttempt) -> ProbeRecord:
    data = (prepared.rendered.staging_dir / "probe.record").read_bytes()
    assert prepared.probe_keys is not None
    return parse_record(data, prepared.probe_keys.ladder)


def _planned(prepared: PreparedAttempt) -> AttemptProbe:
    keys, plan = prepared.probe_keys, prepared.probe_plan
    assert keys is not None
    assert plan is not None
    return AttemptProbe(
        key=keys.cache,
        avoid=keys.avoid,
        ladder=keys.ladder,
        cached_rung=plan.cached_rung,
        excluded=list(plan.exclude),
    )


def _steps(tb: SlurmTestbed, job_id: int) -> list[tuple[str, str, str]]:
    """(name, start, end) of each step of the (heterogeneous) job, from accounting."""
    out = tb.run("sacct", "-n", "-P", "-j", str(job_id), "--format=JobName,Start,End").stdout
    rows = [tuple(line.split("|")) for line in out.splitlines() if line.count("|") == 2]
    return [(r[0], r[1], r[2]) for r in rows if r[1] != "Unknown"]


def _out(prepared: PreparedAttempt, name: str = "stdout.log") -> str:
    return (prepared.rendered.staging_dir / name).read_text()


async def test_a_hung_probe_is_cancelled_and_the_next_rung_passes_in_the_same_allocation(
    slurm_2605: SlurmTestbed, tmp_path: Path
) -> None:
    probe = {
        "command": ["collective-probe", "--hang-unless-p2p-disabled", "--bandwidth", "42.5"],
        "timeoutSeconds": TIMEOUT,
        "ladder": [{"NCCL_P2P_DISABLE": "1"}],
    }
    bed = _probe_bed(slurm_2605, tmp_path, probe)
    # Each node's command prints the rung's setting (it runs in the image: no Slurm client
    # there; which steps still ran is read from accounting afterwards).
    command = 'echo "node=$SLURMD_NODENAME p2p=${NCCL_P2P_DISABLE:-unset}"'
    async with open_transport(bed.settings) as session:
        client = await connect(bed.settings, session)
        # A heterogeneous job, one GPU on each node: one probe step over both components.
        spec = cpu_spec(
            ["bash", "-c", command],
            pools=_one_gpu_each(),
            launch={"shape": "nodes"},
            timeLimit="5m",
        )
        prepared, jobs = await _attempt(bed, client, spec, "hang", str(uuid.uuid4()), 1, Avoiding())
    out, err = _out(prepared), _out(prepared, "stderr.log")
    assert all(j.base_state is BaseState.COMPLETED for j in jobs), (jobs, out, err)
    record = _record(prepared)
    assert record == ProbeRecord("Passed", 1, 42.5, ("0:hung", "1:passed"))
    lines = out.splitlines()
    assert sorted(line for line in lines if line.startswith("node=")) == [
        "node=n1 p2p=1",
        "node=n2 p2p=1",
    ]
    # No probe step still ran when the command's steps started (accounting's times).
    steps = _steps(slurm_2605, jobs[0].job_id)
    probes = [end for name, _, end in steps if name.startswith("slurmjob-probe-")]
    others = [
        start
        for name, start, _ in steps
        if name not in ("batch", "extern") and not name.startswith(("slurmjob-probe-", "sj-"))
    ]
    assert probes, steps
    assert others, steps
    assert max(probes) <= min(others), f"a probe step still ran: {steps}"
    # The hung rung held its limit: cancelled after TIMEOUT s, not at Slurm's step limit (two
    # minutes). Slurm's own times, from the job's start: a wait in the queue behind another
    # module's jobs is not the probe's.
    start, end = jobs[0].start_time, jobs[0].end_time
    assert start is not None, jobs
    assert end is not None, jobs
    assert (end - start).total_seconds() < 90, (start, end)
    # The probes wrote to logs of their own; the command's logs hold none of their lines.
    logs = sorted(p.name for p in prepared.rendered.staging_dir.glob("probe-r*.log"))
    assert logs == ["probe-r0-n1.log", "probe-r0-n2.log", "probe-r1-n1.log", "probe-r1-n2.log"]
    assert "collective-probe" not in out + err
    assert "srun" not in err, err  # srun's words about the cancelled step are the probe's too


async def test_a_node_the_probe_blames_is_excluded_next_and_a_pass_is_cached(
    slurm_2605: SlurmTestbed, tmp_path: Path
) -> None:
    """A one-node, two-GPU job of a series without a constraint: the probe fails on n1, so the
    next attempt excludes n1, lands on n2 and passes; the next job of the same key skips the
    probe and runs with the rung that passed."""
    probe = {
        "command": ["collective-probe", "--fail-on", "n1"],
        "timeoutSeconds": TIMEOUT,
        "ladder": [{"NCCL_P2P_DISABLE": "1"}],
    }
    bed = _probe_bed(slurm_2605, tmp_path, probe)
    command = 'echo "node=$SLURMD_NODENAME p2p=${NCCL_P2P_DISABLE:-unset}"'
    spec = _spec(1, 2, command)
    book = ProbeBook(MemoryConfigMaps(), "ops", "cache", cache_seconds=600, avoid_seconds=600)
    await book.refresh()
    uid = str(uuid.uuid4())
    async with open_transport(bed.settings) as session:
        client = await connect(bed.settings, session)
        # Attempt 1 is placed on n1 (by avoiding n2), where the probe fails on both rungs.
        first, jobs = await _attempt(bed, client, spec, "blame", uid, 1, Avoiding("n2"))
        assert all(j.base_state is BaseState.FAILED for j in jobs), (jobs, _out(first))
        record = _record(first)
        assert record == ProbeRecord("Failed", None, None, ("0:failed", "1:failed"), ("n1",))
        assert "node=" not in _out(first), "the command ran after a failed probe"
        status = SlurmJobStatus(
            phase=Phase.FAILED,
            attempts=[
                Attempt(number=1, job_name="a1", job_id=jobs[0].job_id, probe=_planned(first))
            ],
        )
        now = utc_now()
        probed = with_probe(status, record, 1, now).status
        decided = after_failed_probe(probed, 2, 1, now).status
        assert decided.phase is Phase.PENDING
        assert decided.attempts[-1].retry_action == PROBE_RETRY_ACTION
        assert first.probe_keys is not None
        await book.remember(first.probe_keys, record)
        # Attempt 2: the book excludes n1.
        second, jobs = await _attempt(bed, client, spec, "blame", uid, 2, book)
        assert second.probe_plan is not None
        assert second.probe_plan.exclude == ("n1",)
        assert second.body["job"]["excluded_nodes"] == ["n1"]
        assert all(j.base_state is BaseState.COMPLETED for j in jobs), (jobs, _out(second))
        assert _out(second).split() == ["node=n2", "p2p=unset"]
        passed = _record(second)
        assert passed == ProbeRecord("Passed", 0, 42.5, ("0:passed",))
        assert second.probe_keys is not None
        await book.remember(second.probe_keys, passed)
        # Another job of the same namespace and key: the probe is skipped (its record says so,
        # and no probe log was written) and the command runs.
        third, jobs = await _attempt(bed, client, spec, "cached", str(uuid.uuid4()), 1, book)
        assert third.probe_plan is not None
        assert third.probe_plan.cached_rung == 0
        assert all(j.base_state is BaseState.COMPLETED for j in jobs), (jobs, _out(third))
        assert _record(third) == ProbeRecord("Skipped", 0)
        assert not list(third.rendered.staging_dir.glob("probe-r*.log"))
        assert _out(third).split() == ["node=n2", "p2p=unset"]
