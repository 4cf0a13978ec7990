"""Where and how wide a job runs: its node pools (one, or several for a heterogeneous job) and
the shape of a job array.

Part of the SlurmJob spec (`api.spec`), which rules how the pools go together.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from slurmjob_operator.api.model import Model as _Model
from slurmjob_operator.api.status import MAX_ARRAY_TASKS

DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Pool(_Model):
    """One homogeneous group of nodes: one Slurm job, or one component of a heterogeneous job."""

    name: str = Field(pattern=DNS_LABEL_RE, max_length=63, description="Pool name.")
    gpu_series: str | None = Field(
        default=None,
        max_length=63,
        description="GPU series from the site's GPU series catalog; required when gpusPerNode > 0.",
    )
    nodes: int = Field(default=1, ge=1, le=4096, description="Number of nodes.")
    gpus_per_node: int = Field(default=0, ge=0, le=64, description="GPUs per node.")
    cpus: int = Field(ge=1, le=4096, description="CPUs per node.")
    memory_gb: int = Field(ge=1, le=65536, description="Memory per node in GiB.")
    tasks_per_node: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description=(
            "srun tasks per node for launch shape tasks (default: gpusPerNode, which it must "
            "divide, the GPUs shared out evenly; 1 for a CPU pool); cpus must divide by it."
        ),
    )
    scratch_gb: int | None = Field(
        default=None, description="Refused: node-local scratch is not supported on Slurm."
    )

    @field_validator("scratch_gb")
    @classmethod
    def _no_scratch(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("scratch requests are not supported by the Slurm backend")
        return value

    @property
    def tasks(self) -> int:
        """srun tasks per node under launch shape tasks."""
        return self.tasks_per_node or self.gpus_per_node or 1

    @model_validator(mode="after")
    def _series_for_gpus(self) -> Pool:
        if self.gpus_per_node > 0 and not self.gpu_series:
            raise ValueError(f"pool {self.name}: gpusPerNode > 0 needs a gpuSeries")
        return self


class ArraySpec(_Model):
    """Run the command as a Slurm job array: `count` tasks, indices 0 to count-1."""

    count: int = Field(
        ge=1,
        le=MAX_ARRAY_TASKS,
        description=(
            "Number of tasks; each gets its index in SLURM_ARRAY_TASK_ID and "
            "SLURMJOB_ARRAY_INDEX, and its own log files (stdout-<index>.log)."
        ),
    )
    parallelism: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ARRAY_TASKS,
        description="At most this many tasks run at once (default: as many as Slurm allows).",
    )
