"""The version-neutral result of rendering: what one submission asks Slurm for.

The slurmrestd dialects (`slurm.dialects`) turn a LaunchRequest into the exact JSON body of
`POST /slurm/<version>/job/submit`; nothing else decides field names or shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field


class JobComponent(BaseModel):
    """One Slurm job description: the whole job, or one heterogeneous component per pool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pool: str
    nodes: int = Field(ge=1)
    tasks_per_node: int = Field(default=1, ge=1)
    cpus_per_task: int = Field(ge=1)
    memory_mb: int = Field(ge=1)
    gpus_per_node: int = Field(default=0, ge=0)
    constraints: str | None = None
    exclusive: bool = False


class LaunchRequest(BaseModel):
    """Everything one attempt submits. Paths are as the cluster sees them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_name: str
    comment: str
    script: str
    working_directory: str
    standard_output: str
    standard_error: str
    environment: dict[str, str]
    components: list[JobComponent] = Field(min_length=1)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_minutes: int | None = None
    array: str | None = Field(
        default=None, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*(%[0-9]+)?$"
    )
    """A job array's task indices and limit, as Slurm's `--array` takes them ("0-19%3")."""
    dependency: str | None = None
    """Slurm's dependency expression (`afterok:123,afterok:456`), on the whole job."""
    excluded_nodes: tuple[str, ...] = ()
    """Nodes no component may get (the tenant's avoid list after failed probes)."""
    warning_signal: str | None = Field(default=None, pattern=r"^(USR1|USR2|TERM|INT|HUP)$")
    """A walltime segment's warning: this signal to the job's steps (never the batch shell)
    `warning_seconds` before the time limit."""
    warning_seconds: int | None = Field(default=None, ge=1, le=65534)

    @property
    def is_heterogeneous(self) -> bool:
        return len(self.components) > 1


@dataclass(frozen=True)
class StagedFile:
    """One file of an attempt: its bytes (never shown in repr) and its mode."""

    content: bytes = field(repr=False)
    mode: int


#: The batch script's variables for the ports Ray's head opens that Ray would otherwise fix
#: (its GCS 6379, client server 10001, dashboard 8265, dashboard agent 52365): picked per job.
RAY_PICKED_PORTS = ("ray_port", "ray_client_port", "ray_dashboard_port", "ray_agent_port")


#: Ray refuses an object store under 75 MiB.
RAY_OBJECT_STORE_MIN_BYTES = 75 * 2**20


def ray_object_store_bytes(memory_gb: int) -> int:
    """The object store of a Ray node: 30% of the memory Slurm gave the job on that node
    (Ray's own default takes 30% of the whole machine's, however little the job asked for;
    on a shared node that is other jobs' memory), and never under Ray's minimum."""
    return max(RAY_OBJECT_STORE_MIN_BYTES, memory_gb * 2**30 * 3 // 10)


def picked_ports(*, ray: bool, master_port: int | None) -> tuple[str, ...]:
    """The variables of the ports the batch script picks free on the first node at run time.

    MASTER_PORT is picked unless the spec fixes it (an explicit masterPort, or one stored when
    the CRD defaulted 29500, stays exactly what it was); Ray's own ports are picked for every
    Ray job. A value derived from the job (its id, name or uid) is never used: another job
    could compute it and take the port first.
    """
    master = ("master_port",) if master_port is None else ()
    return master + (RAY_PICKED_PORTS if ray else ())
