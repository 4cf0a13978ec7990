"""How the command starts inside the allocation: the launch shape (`spec.launch`).

Part of the SlurmJob spec (`api.spec`), which rules how the shape goes with the pools; the
batch-script side is `templates/shape/` (one template per shape).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from slurmjob_operator.api.model import Model as _Model

#: srun's --mpi plugin names (pmi2, pmix, pmix_v4, cray_shasta, ...): a word, never an option.
MPI_PLUGIN_RE = r"^[a-z][a-z0-9_]{0,31}$"


class LaunchShape(StrEnum):
    RAY = "ray"
    NODES = "nodes"
    TORCHRUN = "torchrun"
    TASKS = "tasks"


#: The shapes that start the command once per node, with a rendezvous.
PER_NODE = frozenset({LaunchShape.NODES, LaunchShape.TORCHRUN})


class LaunchSpec(_Model):
    """How the command starts on the job's nodes."""

    shape: LaunchShape | None = Field(
        default=None,
        description=(
            "ray (the default for a GPU job): a Ray cluster over every node, the command on the "
            "head. nodes: the command once per node of every pool, with MASTER_ADDR (the first "
            "node), MASTER_PORT, NODE_RANK, NUM_GPU_PER_NODE and WORLD_SIZE as the node count "
            "(also SLURMJOB_NODE_COUNT, SLURMJOB_NODE_RANK, SLURMJOB_GPUS_PER_NODE). torchrun: "
            "as nodes, the operator starting torchrun on each node with the node count, "
            "processes per node (its GPUs), node rank and rendezvous address, the command being "
            "torchrun's script and arguments (the image needs torchrun). tasks: "
            "pools[].tasksPerNode srun tasks per node, each with SLURMJOB_TASK_RANK (global), "
            "SLURMJOB_TASK_COUNT and SLURMJOB_NODELIST. A CPU-only job runs one plain step, or "
            "tasks on its one node."
        ),
    )
    # No default: a fixed port is one a co-located job can take first (its ranks would then join
    # that job's rendezvous) and two jobs on one node collide on. Unset, the batch script picks
    # a free port on the first node when the job starts (templates/rendezvous.sh.j2). Objects
    # stored when the CRD defaulted 29500 keep that value and behave as before.
    master_port: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description=(
            "MASTER_PORT, the rendezvous port on the first node. Unset (the default), the "
            "batch script picks a free port there when the job starts; set it only when the "
            "program needs a known port (docs/security.md, shared nodes)."
        ),
    )
    mpi: str | None = Field(
        default=None,
        max_length=32,
        pattern=MPI_PLUGIN_RE,
        description=(
            "srun's --mpi plugin for the tasks shape (pmi2, pmix, ...): one the site allows "
            "(SLURMJOB_MPI_PLUGINS)."
        ),
    )
