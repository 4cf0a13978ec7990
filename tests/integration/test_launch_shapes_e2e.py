"""Launch shapes on the real Slurm releases (issue 26, part 1): each job is rendered by the real
pipeline, staged and submitted through slurmrestd, and the apptainer stand-in runs the command,
which prints what its shape gave it: ranks, addresses, counts, all checked per node and task."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.integration.helpers import cpu_spec, het_pools
from tests.integration.test_slurm_jobs import Bed, _bed, _prepare, _wait, stage_and_submit
from tests.testbed.slurm import SlurmTestbed

from slurmjob_operator.config import Settings
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.core.jobview import BaseState
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.connect import connect, open_transport

pytestmark = pytest.mark.integration

NODE_LINE = (
    "node=$SLURMD_NODENAME rank=$NODE_RANK/$SLURMJOB_NODE_RANK world=$WORLD_SIZE/"
    "$SLURMJOB_NODE_COUNT gpus=$NUM_GPU_PER_NODE/$SLURMJOB_GPUS_PER_NODE "
    "master=$MASTER_ADDR:$MASTER_PORT"
)
TASK_LINE = (
    "task=$SLURMJOB_TASK_RANK/$SLURMJOB_TASK_COUNT procid=$SLURM_PROCID "
    "node=$SLURMD_NODENAME nodes=$SLURMJOB_NODELIST gpus=${CUDA_VISIBLE_DEVICES-none}"
)


def _one_gpu_each() -> list[dict[str, Any]]:
    """The two constrained pools, one GPU of each node: no whole node is held from the other
    lane's jobs."""
    pools = het_pools()
    for pool in pools:
        pool["gpusPerNode"] = 1
    return pools


def _bed_with(testbed: SlurmTestbed, tmp_path: Path, **settings: Any) -> Bed:
    bed = _bed(testbed, "apptainer", tmp_path)
    if settings:
        config = bed.settings.model_copy(update=settings)
        bed = Bed(testbed, config, Site.load(config), bed.namespace)
    return bed


async def _run(bed: Bed, spec: dict[str, Any]) -> list[str]:
    settings: Settings = bed.settings
    async with open_transport(settings) as session:
        client: SlurmClient = await connect(settings, session)
        prepared = _prepare(bed, client, spec, name=f"shape-{uuid.uuid4().hex[:6]}")
        receipt = await stage_and_submit(client, prepared, settings)
        # Whole nodes: it may queue while another lane's job holds one.
        jobs = await _wait(client, receipt.job_id, within=180)
    out = (prepared.rendered.staging_dir / "stdout.log").read_text()
    err = (prepared.rendered.staging_dir / "stderr.log").read_text()
    assert all(j.base_state is BaseState.COMPLETED for j in jobs), (jobs, out, err)
    return sorted(line for line in out.splitlines() if line.strip())


async def test_nodes_runs_once_per_node_of_every_component_with_its_rank(
    slurm: SlurmTestbed, tmp_path: Path
) -> None:
    bed = _bed_with(slurm, tmp_path)
    spec = cpu_spec(
        ["bash", "-c", f"echo {NODE_LINE}"],
        pools=_one_gpu_each(),
        launch={"shape": "nodes", "masterPort": 29555},
        timeLimit="7m",
    )
    assert await _run(bed, spec) == [
        "node=n1 rank=0/0 world=2/2 gpus=1/1 master=n1:29555",
        "node=n2 rank=1/1 world=2/2 gpus=1/1 master=n1:29555",
    ]


async def test_tasks_give_every_task_its_rank_and_the_node_list(
    slurm: SlurmTestbed, tmp_path: Path
) -> None:
    bed = _bed_with(slurm, tmp_path)
    pools = [{"name": "main", "nodes": 1, "gpusPerNode": 0, "cpus": 2, "memoryGb": 1}]
    pools[0]["tasksPerNode"] = 2
    spec = cpu_spec(
        ["bash", "-c", f"echo {TASK_LINE}"],
        pools=pools,
        launch={"shape": "tasks"},
        timeLimit="7m",
    )
    lines = await _run(bed, spec)
    fields = [dict(word.split("=", 1) for word in line.split()) for line in lines]
    assert [(f["task"], f["procid"], f["gpus"]) for f in fields] == [
        ("0/2", "0", "none"),
        ("1/2", "1", "none"),
    ]
    node = fields[0]["node"]
    assert all((f["node"], f["nodes"]) == (node, node) for f in fields), lines


async def test_torchrun_and_gpu_tasks_with_mpi_on_26_05(
    slurm_2605: SlurmTestbed, tmp_path: Path
) -> None:
    """torchrun on each node of a heterogeneous job, and one task per GPU with --mpi=pmi2
    (the plugin 26.05's test bed has), each task with its own GPU."""
    bed = _bed_with(slurm_2605, tmp_path, mpi_plugins="pmi2")
    spec = cpu_spec(
        ["bash", "-c", "echo node=$SLURMD_NODENAME rank=$RANK world=$WORLD_SIZE"],
        pools=_one_gpu_each(),
        launch={"shape": "torchrun"},
        timeLimit="7m",
    )
    lines = await _run(bed, spec)
    # No masterPort: one port, picked on n1 at run time (never the old 29500), on both nodes.
    ports = {line.rsplit(":", 1)[1] for line in lines if "master=" in line}
    assert len(ports) == 1, lines
    [port] = ports
    assert port.isdigit(), lines
    assert 1024 <= int(port) <= 65535, lines
    assert port != "29500", lines
    assert lines == [
        "node=n1 rank=0 world=2",
        "node=n2 rank=1 world=2",
        f"torchrun nnodes=2 nproc=1 node_rank=0 master=n1:{port}",
        f"torchrun nnodes=2 nproc=1 node_rank=1 master=n1:{port}",
    ]
    pools = het_pools()[:1]
    pools[0]["cpus"] = 2
    spec = cpu_spec(
        ["bash", "-c", f"echo {TASK_LINE}"],
        pools=pools,
        launch={"shape": "tasks", "mpi": "pmi2"},
        timeLimit="7m",
    )
    lines = await _run(bed, spec)
    assert len(lines) == 2, lines
    assert [line.split()[0] for line in lines] == ["task=0/2", "task=1/2"]
    assert all(" node=n1 nodes=n1 " in line for line in lines), lines
    gpus = sorted(line.rsplit("gpus=", 1)[1] for line in lines)
    assert gpus[0] != gpus[1], f"each task has a GPU of its own: {lines}"
