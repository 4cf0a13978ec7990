"""The SlurmJob spec: the single source of truth for validation and for the CRD schema.

Intrinsic rules (those that need no site catalog) live in the models as pydantic validators,
so the same message reaches `kubectl apply` users (through CEL rules derived from the same
facts, see `gen.crd`) and the operator. `SlurmJobSpec` is here with the rules that span its
fields; its parts are in `api.container` (framework, env, mounts), `api.pools` (pools, arrays),
`api.scheduling` (dependencies, time limit, mode) and `api.retry`, and are re-exported from
here. Rules that need the site's catalogs (GPU series, runtime registry, storage root) live in
`site.resolve`. What may reach the batch script (env names, the path alphabet of mounts and
workingDir, the command's words) is ruled in `api.scriptwords`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from slurmjob_operator.api.container import (
    CUSTOM,
    CUSTOM_RUNTIME_PREFIX,
    ENV_NAME_RE,
    DataSpec,
    EnvVar,
    EnvVarSource,
    Framework,
    Mount,
    SecretKeyRef,
)
from slurmjob_operator.api.launch import PER_NODE, LaunchShape, LaunchSpec
from slurmjob_operator.api.model import Model as _Model
from slurmjob_operator.api.pools import DNS_LABEL_RE, ArraySpec, Pool
from slurmjob_operator.api.retry import RetrySpec
from slurmjob_operator.api.scheduling import (
    MAX_DEPENDENCIES,
    OBJECT_NAME_RE,
    Dependency,
    DependencyCondition,
    Mode,
    TimeLimit,
    parse_time_limit,
)
from slurmjob_operator.api.scriptwords import (
    MAX_COMMAND_WORDS,
    PATH_TEXT,
    WORKING_DIR_RE,
    command_problem,
    path_problem,
)
from slurmjob_operator.api.walltime import WalltimeSpec

# The spec's parts stay importable from here, where the rest of the operator looks for them.
__all__ = [
    "CLUSTER_NAME_RE",
    "CUSTOM",
    "CUSTOM_RUNTIME_PREFIX",
    "DNS_LABEL_RE",
    "ENV_NAME_RE",
    "MAX_DEPENDENCIES",
    "OBJECT_NAME_RE",
    "ArraySpec",
    "DataSpec",
    "Dependency",
    "DependencyCondition",
    "EnvVar",
    "EnvVarSource",
    "Framework",
    "LaunchShape",
    "LaunchSpec",
    "Mode",
    "Mount",
    "Pool",
    "SecretKeyRef",
    "SlurmJobSpec",
    "TimeLimit",
    "WalltimeSpec",
    "parse_time_limit",
]

# A cluster's name in the clusters file (and spec.cluster): a DNS label of at most 40.
CLUSTER_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"  # = config.CLUSTER_NAME_RE


#: The longest spec.ttlSecondsAfterFinished: a year (a longer wait is no clean-up).
MAX_TTL_SECONDS = 366 * 24 * 3600

#: The spec fields (by their names in the CRD) that may change after the SlurmJob is created,
#: each with why. Every other field is immutable, as a batch/v1 Job's pod template: the CRD
#: has a transition rule for each (`gen.crd`), docs/crd.md ("What can change after creation")
#: lists these reasons. Nothing here or in the operator relies on that rule.
MUTABLE_AFTER_CREATION: dict[str, str] = {
    "suspend": (
        "It says when the job may be submitted or leave the queue, never what runs: the gate "
        "people (`kubectl slurmjob suspend` and `resume`), pipelines and GitOps tools open and "
        "close on a live SlurmJob, as on a batch/v1 Job. True holds a queued job in Slurm (with "
        "Kueue: makes its Workload inactive), false submits or releases it."
    ),
    "ttlSecondsAfterFinished": (
        "It says when the finished SlurmJob is deleted, never what ran: as on a batch/v1 Job it "
        "may be set or changed later (keep a failed job for a look, or drop one at once); the "
        "operator reads it again at every event, and never past the site's maximum."
    ),
}


_WALLTIME_TEXT = (
    "A run longer than the partition allows, as a chain of segments: each one job with its "
    "own time limit, the next submitted when one ends by its time limit, with "
    "continueExitCode, by preemption or by a node failure (docs/long-training.md). Not with "
    "timeLimit (each segment's is segmentTime) nor with array."
)


def _walltime_problem(spec: SlurmJobSpec) -> str | None:
    """Judged on the user's own spec: a tenant's default time limit is applied later."""
    if spec.walltime is None:
        return None
    if spec.time_limit is not None:
        return (
            "walltime: timeLimit and walltime cannot be set together: each segment's limit is "
            "walltime.segmentTime"
        )
    if spec.array is not None:
        return "walltime: an array cannot have walltime segments: run one chain per job"
    return None


class SlurmJobSpec(_Model):
    """Desired state of a SlurmJob; only suspend and ttlSecondsAfterFinished change once created."""

    framework: Framework
    command: list[str] = Field(
        min_length=1,
        max_length=MAX_COMMAND_WORDS,
        description=(
            "Command and arguments, run on the head. command[0] cannot start with '-', and no "
            "word can be ':' (srun would read them as its own)."
        ),
    )
    working_dir: str | None = Field(
        default=None,
        max_length=4096,
        pattern=WORKING_DIR_RE,
        description=f"Absolute working directory inside the container ({PATH_TEXT}).",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="Environment variables."
    )
    mounts: list[Mount] = Field(
        default_factory=list, max_length=128, description="Storage-root mounts."
    )
    pools: list[Pool] = Field(
        min_length=1, max_length=16, description="Node pools; several make a heterogeneous job."
    )
    cluster: str | None = Field(
        default=None,
        pattern=CLUSTER_NAME_RE,
        description=(
            "Slurm cluster to run on, by its name in the site's clusters file (default: the "
            "tenant's default cluster, else the first)."
        ),
    )
    partition: str | None = Field(
        default=None, description="Slurm partition (default: SLURMJOB_SLURM_PARTITION)."
    )
    account: str | None = Field(default=None, description="Slurm account.")
    qos: str | None = Field(default=None, description="Slurm QOS.")
    time_limit: TimeLimit | None = None
    launch: LaunchSpec | None = Field(
        default=None,
        validate_default=True,
        description="How the command starts on the job's nodes (its shape).",
    )
    retry: RetrySpec = Field(default_factory=RetrySpec, description="Retry policy.")
    array: ArraySpec | None = Field(
        default=None,
        description=(
            "Run as a job array of one pool; a retry resubmits only the tasks that did not "
            "succeed, under their own indices."
        ),
    )
    walltime: WalltimeSpec | None = Field(default=None, description=_WALLTIME_TEXT)
    data: DataSpec = Field(default_factory=DataSpec, description="Platform data references.")
    mode: Mode = Field(
        default=Mode.BATCH, description="Only Batch: Playground and Deployment are refused."
    )
    depends_on: list[Dependency] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description=(
            "SlurmJobs of the same namespace this one runs after (each with the final phase it "
            "needs, counted after the upstream's retries). Nothing is submitted until every "
            "one can be satisfied; one that cannot ends this SlurmJob Failed "
            "(DependencyFailed)."
        ),
    )
    suspend: bool = Field(
        default=False,
        description=(
            "While true nothing is submitted, and a queued job is held in Slurm; setting it back "
            "to false submits or releases it (the gate Kueue and GitOps tools use)."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TTL_SECONDS,
        description=(
            "Seconds after the SlurmJob finished (condition Finished=True) when the operator "
            "deletes it, as a batch/v1 Job's field: 0 deletes it at once. Unset: the site's "
            "default (none unless the admin sets one); never longer than the site's maximum. "
            "A SlurmJob that a SlurmJob still to finish names in its dependsOn is kept until "
            "that one finished. A GitOps tool that syncs automatically creates a deleted "
            "SlurmJob again."
        ),
    )

    @field_validator("command")
    @classmethod
    def _safe_words(cls, value: list[str]) -> list[str]:
        problem = command_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("working_dir", mode="before")
    @classmethod
    def _abs_workdir(cls, value: Any) -> Any:
        if not isinstance(value, str) or value == "/":
            return value
        if not value.startswith("/"):
            raise ValueError(f"{value!r}: workingDir must be an absolute path")
        problem = path_problem(value, absolute=True)
        if problem:
            raise ValueError(f"{value!r}: workingDir {problem}")
        return value

    @field_validator("time_limit")
    @classmethod
    def _valid_time(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            parse_time_limit(value)
        return value

    @field_validator("mode")
    @classmethod
    def _batch_only(cls, value: Mode) -> Mode:
        if value is not Mode.BATCH:
            raise ValueError(
                f"{value.value} is not supported on Slurm: compute nodes usually have no "
                "inbound network path"
            )
        return value

    # Cross-field rules sit on the narrowest field that holds all their facts, so that a
    # refusal names that field (`spec.pools`, `spec.env`, ...) rather than the whole spec.
    @field_validator("env")
    @classmethod
    def _unique_env(cls, value: list[EnvVar]) -> list[EnvVar]:
        names = [e.name for e in value]
        if len(set(names)) != len(names):
            raise ValueError("env names must be unique")
        return value

    @field_validator("depends_on")
    @classmethod
    def _unique_dependencies(cls, value: list[Dependency]) -> list[Dependency]:
        names = [d.name for d in value]
        if len(set(names)) != len(names):
            raise ValueError("dependsOn names must be unique")
        return value

    @field_validator("mounts")
    @classmethod
    def _unique_targets(cls, value: list[Mount]) -> list[Mount]:
        targets = [m.target for m in value]
        if len(set(targets)) != len(targets):
            raise ValueError("mount targets must be unique")
        return value

    @field_validator("pools")
    @classmethod
    def _pool_layout(cls, value: list[Pool]) -> list[Pool]:
        names = [p.name for p in value]
        if len(set(names)) != len(names):
            raise ValueError("pool names must be unique")
        cpu_pools = [p.name for p in value if p.gpus_per_node == 0]
        if cpu_pools and len(cpu_pools) != len(value):
            raise ValueError(
                f"pool {cpu_pools[0]}: gpusPerNode is 0 in a GPU job; a CPU-only job is "
                "custom/custom with exactly one pool"
            )
        if cpu_pools:
            if len(value) != 1:
                raise ValueError("a CPU-only job has exactly one pool")
            if value[0].nodes != 1:
                raise ValueError("multi-node CPU jobs are not supported: set nodes: 1")
        return value

    @model_validator(mode="after")
    def _cpu_only_custom(self) -> SlurmJobSpec:
        if self.is_cpu_only and not self.framework.is_custom:
            raise ValueError("a CPU-only job (gpusPerNode: 0) must use framework custom/custom")
        problem = _walltime_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    @field_validator("launch")
    @classmethod
    def _launch_fits(cls, value: LaunchSpec | None, info: ValidationInfo) -> LaunchSpec | None:
        # `pools` is declared earlier, so it is validated (or missing, when it failed) here;
        # the field is validated when absent too (validate_default): tasksPerNode needs it.
        pools: list[Pool] | None = info.data.get("pools")
        if pools is None:
            return value
        shape = value.shape if value is not None else None
        cpu_only = all(p.gpus_per_node == 0 for p in pools)
        if cpu_only and shape in (LaunchShape.RAY, *PER_NODE):
            raise ValueError(
                f"a CPU-only job runs one plain step; of the launch shapes it takes only "
                f"tasks, not {shape}"
            )
        if value is not None and value.mpi and shape is not LaunchShape.TASKS:
            raise ValueError("an MPI plugin (mpi) is for launch shape tasks")
        per_node = [p.name for p in pools if p.tasks_per_node is not None]
        if per_node and shape is not LaunchShape.TASKS:
            raise ValueError(f"pool {per_node[0]} sets tasksPerNode, which is for shape tasks")
        for pool in pools if shape is LaunchShape.TASKS else ():
            if pool.gpus_per_node % pool.tasks or pool.cpus % pool.tasks:
                raise ValueError(
                    f"pool {pool.name}: tasksPerNode {pool.tasks} must divide gpusPerNode "
                    f"{pool.gpus_per_node} (the GPUs are shared out evenly) and cpus {pool.cpus}"
                )
        return value

    @property
    def launch_shape(self) -> LaunchShape | None:
        """The shape the command starts in: the spec's, ray for a GPU job, None (one plain
        step) for a CPU-only job."""
        if self.launch is not None and self.launch.shape is not None:
            return self.launch.shape
        return None if self.is_cpu_only else LaunchShape.RAY

    @property
    def master_port(self) -> int | None:  # None: the script picks one at run time
        return self.launch.master_port if self.launch is not None else None

    @field_validator("array")
    @classmethod
    def _array_of_one_pool(cls, value: ArraySpec | None, info: ValidationInfo) -> ArraySpec | None:
        # `pools` is declared earlier, so it is validated (or missing, when it failed) here.
        pools = info.data.get("pools")
        if value is not None and pools is not None and len(pools) > 1:
            raise ValueError("an array has exactly one pool: Slurm has no heterogeneous arrays")
        return value

    @property
    def is_cpu_only(self) -> bool:
        return all(p.gpus_per_node == 0 for p in self.pools)

    @property
    def is_heterogeneous(self) -> bool:
        return len(self.pools) > 1

    @property
    def time_limit_minutes(self) -> int | None:
        return None if self.time_limit is None else parse_time_limit(self.time_limit)

    @property
    def secret_env(self) -> list[EnvVar]:
        return [e for e in self.env if e.is_secret]

    @property
    def plain_env(self) -> dict[str, str]:
        return {e.name: e.value for e in self.env if e.value is not None}
