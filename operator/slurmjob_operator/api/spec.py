"""The SlurmJob spec: the single source of truth for validation and for the CRD schema.

Intrinsic rules (those that need no site catalog) live here as pydantic validators, so the
same message reaches `kubectl apply` users (through CEL rules derived from the same facts, see
`gen.crd`) and the operator. Rules that need the site's catalogs (GPU series, runtime registry,
storage root) live in `site.resolve`. What may reach the batch script (env names, the path
alphabet of mounts and workingDir, the command's words) is ruled in `api.scriptwords`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from slurmjob_operator.api.model import Model as _Model
from slurmjob_operator.api.retry import RetrySpec
from slurmjob_operator.api.scriptwords import (
    ABSOLUTE_PATH_RE,
    MAX_COMMAND_WORDS,
    PATH_TEXT,
    RELATIVE_PATH_RE,
    WORKING_DIR_RE,
    command_problem,
    path_problem,
    reserved_env_name,
)
from slurmjob_operator.api.status import MAX_ARRAY_TASKS

ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A cluster's name in the clusters file (and spec.cluster): a DNS label of at most 40.
CLUSTER_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"  # = config.CLUSTER_NAME_RE
_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?$")

CUSTOM = "custom"
CUSTOM_RUNTIME_PREFIX = "custom-"


class Framework(_Model):
    """What runs: a framework kind/name and the runtime artifact that carries it."""

    kind: str = Field(min_length=1, max_length=63, description="Framework kind, e.g. custom.")
    name: str = Field(min_length=1, max_length=63, description="Framework name, e.g. custom.")
    runtime_id: str = Field(
        min_length=1,
        max_length=253,
        description="Id of a runtime artifact (SQSH or SIF) in the site's runtime registry.",
    )
    image: str | None = Field(
        default=None,
        description=(
            "Refused: this backend never materialises an OCI image implicitly. "
            "Publish the image as a runtime artifact and set runtimeId."
        ),
    )

    @field_validator("image")
    @classmethod
    def _no_image(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                "framework.image is not supported: the image comes from the runtime registry "
                "by runtimeId (no implicit OCI image materialization)"
            )
        return value

    @model_validator(mode="after")
    def _custom_runtime_prefix(self) -> Framework:
        if self.kind == CUSTOM and not self.runtime_id.startswith(CUSTOM_RUNTIME_PREFIX):
            raise ValueError(
                f"runtimeId {self.runtime_id!r}: custom runtimes must have ids starting with "
                f"{CUSTOM_RUNTIME_PREFIX!r}"
            )
        return self

    @property
    def is_custom(self) -> bool:
        return self.kind == CUSTOM and self.name == CUSTOM


class SecretKeyRef(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the job's namespace.")
    key: str = Field(min_length=1, max_length=253, description="Key within the Secret.")


class EnvVarSource(_Model):
    secret_key_ref: SecretKeyRef


class EnvVar(_Model):
    name: str = Field(pattern=ENV_NAME_RE, max_length=255, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Value read from a Secret; never written into the script."
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if reserved_env_name(value):
            raise ValueError(
                f"{value}: reserved: read outside the container (by the batch shell, the dynamic "
                "loader, Slurm, Pyxis, enroot or apptainer) or set by the batch script"
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: set exactly one of value and valueFrom")
        return self

    @property
    def is_secret(self) -> bool:
        return self.value_from is not None


class Mount(_Model):
    source: str = Field(
        min_length=1,
        max_length=4096,
        pattern=RELATIVE_PATH_RE,
        description=f"Path relative to the storage root (no '..', not absolute; {PATH_TEXT}).",
    )
    target: str = Field(
        min_length=2,
        max_length=4096,
        pattern=ABSOLUTE_PATH_RE,
        description=f"Absolute path inside the container ({PATH_TEXT}).",
    )
    read_only: bool = Field(default=False, description="Mount read-only.")

    # mode="before": these messages say more than the pattern's, which backs them up.
    @field_validator("source", mode="before")
    @classmethod
    def _relative_inside(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if value.startswith("/"):
            raise ValueError(
                f"{value!r}: mount sources are paths relative to the storage root, "
                "not absolute host paths"
            )
        parts = value.split("/")
        if ".." in parts:
            raise ValueError(f"{value!r}: '..' would leave the storage root")
        if all(part in ("", ".") for part in parts):
            raise ValueError(
                f"{value!r}: a mount source names a folder under the storage root, not the root "
                "itself (it holds every job's staging files)"
            )
        problem = path_problem(value, absolute=False)
        if problem:
            raise ValueError(f"{value!r}: mount sources {problem}")
        return value

    @field_validator("target", mode="before")
    @classmethod
    def _absolute_target(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if not value.startswith("/"):
            raise ValueError(f"{value!r}: mount targets must be absolute paths")
        if ".." in value.split("/"):
            raise ValueError(f"{value!r}: mount targets cannot contain '..'")
        problem = path_problem(value, absolute=True)
        if problem:
            raise ValueError(f"{value!r}: mount targets {problem}")
        return value


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
    scratch_gb: int | None = Field(
        default=None, description="Refused: node-local scratch is not supported on Slurm."
    )

    @field_validator("scratch_gb")
    @classmethod
    def _no_scratch(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("scratch requests are not supported by the Slurm backend")
        return value

    @model_validator(mode="after")
    def _series_for_gpus(self) -> Pool:
        if self.gpus_per_node > 0 and not self.gpu_series:
            raise ValueError(f"pool {self.name}: gpusPerNode > 0 needs a gpuSeries")
        return self


class DataSpec(_Model):
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Refused when non-empty: this backend cannot mount platform volumes.",
    )

    @field_validator("volumes")
    @classmethod
    def _no_volumes(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if value:
            raise ValueError(
                "volume mounts are not supported on Slurm: the bind list of a SIF/SQSH image "
                "is not under the platform's control; use spec.mounts under the storage root"
            )
        return value


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


#: A SlurmJob's name: a DNS subdomain (RFC 1123), as Kubernetes allows for custom resources.
OBJECT_NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_DEPENDENCIES = 16


class DependencyCondition(StrEnum):
    """What the upstream SlurmJob must have ended as for this one to run."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"  # Failed or Cancelled
    FINISHED = "Finished"  # any final phase


class Dependency(_Model):
    name: str = Field(
        pattern=OBJECT_NAME_RE,
        max_length=253,
        description="Name of a SlurmJob in the same namespace.",
    )
    condition: DependencyCondition = Field(
        default=DependencyCondition.SUCCEEDED,
        description=(
            "Succeeded (the default), Failed (Failed or Cancelled) or Finished (any final "
            "phase): what the upstream must have ended as, after its retries."
        ),
    )


class Mode(StrEnum):
    BATCH = "Batch"
    PLAYGROUND = "Playground"
    DEPLOYMENT = "Deployment"


TimeLimit = Annotated[int | str, Field(description="Minutes, or a duration such as 90m, 4h, 1d")]


def parse_time_limit(value: int | str) -> int:
    """Minutes from an int or a duration string (`90`, `90m`, `4h`, `1d2h30m`)."""
    if isinstance(value, bool):
        raise ValueError("timeLimit must be minutes or a duration such as 90m, 4h")
    if isinstance(value, int):
        minutes = value
    else:
        text = value.strip()
        if text.isdigit():
            minutes = int(text)
        else:
            match = _DURATION_RE.fullmatch(text)
            if not text or match is None:
                raise ValueError(f"timeLimit {value!r}: use minutes or a duration such as 90m, 4h")
            days, hours, mins = (int(g) if g else 0 for g in match.groups())
            minutes = days * 1440 + hours * 60 + mins
    if minutes < 1:
        raise ValueError("timeLimit must be at least one minute")
    if minutes > 365 * 1440:
        raise ValueError("timeLimit cannot exceed 365 days")
    return minutes


class SlurmJobSpec(_Model):
    """Desired state of a SlurmJob."""

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
            "tenant's default cluster, else the first). Cannot change once set."
        ),
    )
    partition: str | None = Field(
        default=None, description="Slurm partition (default: SLURMJOB_SLURM_PARTITION)."
    )
    account: str | None = Field(default=None, description="Slurm account.")
    qos: str | None = Field(default=None, description="Slurm QOS.")
    time_limit: TimeLimit | None = None
    retry: RetrySpec = Field(default_factory=RetrySpec, description="Retry policy.")
    array: ArraySpec | None = Field(
        default=None,
        description=(
            "Run as a job array of one pool; a retry resubmits only the tasks that did not "
            "succeed, under their own indices."
        ),
    )
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
            "(DependencyFailed). Read before the first attempt only: a change after it has "
            "no effect."
        ),
    )
    suspend: bool = Field(
        default=False,
        description=(
            "While true nothing is submitted, and a queued job is held in Slurm; setting it back "
            "to false submits or releases it (the gate Kueue and GitOps tools use)."
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
        return self

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
