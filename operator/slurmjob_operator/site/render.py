"""Render one attempt of a SlurmJob: the batch script, its staged files and the LaunchRequest.

Inputs are already validated (`api.spec`, `api.site`); this module only turns them into text.
Every value reaches the script quoted (the quoting rule is `site.templating`).

Nothing of the manifest is code for the batch shell: the command's words are quoted array
items after srun's `--`; `job.env` and `secrets.env` hold NAME=value records ending in NUL, which
the script reads as data (never `source`) and hands to the containerised steps only. The rules
of `api.scriptwords` (reserved env names, the path alphabet, the command's first word and `:`)
are checked here again, so a spec that skipped validation still cannot reach a script.

Templates: `job.sh.j2` includes `runtime/<profile>.sh.j2` (how a step enters the container) and
`shape/<cpu|ray|...>.sh.j2` (which steps run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import jinja2

from slurmjob_operator.api.scriptwords import command_problem, path_problem, reserved_env_name
from slurmjob_operator.api.spec import LaunchShape, SlurmJobSpec
from slurmjob_operator.config import Settings
from slurmjob_operator.config.slurm import RuntimeProfile
from slurmjob_operator.core import containerenv, naming
from slurmjob_operator.core.indices import slurm_array
from slurmjob_operator.core.launch import (
    JobComponent,
    LaunchRequest,
    StagedFile,
    picked_ports,
    ray_object_store_bytes,
)
from slurmjob_operator.core.naming import (
    ARRAY_STDERR_PATTERN,
    ARRAY_STDOUT_PATTERN,
    ENV_FILE,
    SCRIPT_FILE,
    SECRETS_FILE,
    STDERR_FILE,
    STDOUT_FILE,
)
from slurmjob_operator.core.probe import ProbePlan
from slurmjob_operator.core.segments import SegmentPlan
from slurmjob_operator.site.artifacts import Artifact, ArtifactError, artifact_values
from slurmjob_operator.site.catalogs import GpuSeries
from slurmjob_operator.site.probe import probe_values
from slurmjob_operator.site.segments import (
    SegmentParts,
    mount_conflict,
    segment_parts,
    warning_fields,
)
from slurmjob_operator.site.templating import RenderError, environment

BASE_TEMPLATE = "job.sh.j2"
SCRIPT_MODE = 0o555
ENV_MODE = 0o444
SECRETS_MODE = 0o600

# (offset, magic) checked on the compute node before anything starts.
# Exit codes of the batch script itself (documented in the script's header too).
EXIT_STAGING = 94
EXIT_RENDEZVOUS = 95
EXIT_SECRETS = 96
EXIT_ARTIFACT = 97
EXIT_CODES: dict[int, str] = {
    EXIT_STAGING: "the staging directory or its job.env cannot be read on the compute node",
    EXIT_RENDEZVOUS: "rendezvous failed: first node unknown, or the Ray head never became healthy",
    EXIT_SECRETS: "secrets.env is expected but gone (an earlier run of this attempt consumed it)",
    EXIT_ARTIFACT: "the runtime artifact failed verification (missing, wrong magic or sha256)",
}

_MOUNT_SEPARATORS = (",", ":", "\0", "\n")


@dataclass(frozen=True)
class RenderContext:
    """Everything besides the spec that one attempt's rendering needs (all resolved)."""

    namespace: str
    name: str
    uid: str
    attempt: int
    artifact: Artifact
    gpu_series: Mapping[str, GpuSeries | None]
    exclusive: Mapping[str, bool]
    partition: str | None
    settings: Settings
    secret_values: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: For a job array: the task indices this attempt submits (None: all of spec.array).
    array_indices: tuple[int, ...] | None = None
    #: The collective probe's cached rung and the nodes to exclude (None: no cache, none).
    probe: ProbePlan | None = None
    #: The walltime segment this attempt runs (None: the spec has no walltime).
    segment: SegmentPlan | None = None


@dataclass(frozen=True)
class RenderedAttempt:
    """The result: what to stage (operator's paths) and what to submit (cluster's paths)."""

    launch: LaunchRequest
    files: Mapping[str, StagedFile]
    staging_dir: Path
    cluster_staging_dir: PurePosixPath


def _cluster(settings: Settings, relative: str) -> PurePosixPath:
    return PurePosixPath(settings.to_cluster_path(settings.storage_root / relative))


def _mount_spec(source: PurePosixPath, target: str, read_only: bool) -> str:
    for part in (str(source), target):
        if any(sep in part for sep in _MOUNT_SEPARATORS):
            raise RenderError(f"mount path {part!r} contains ',', ':', NUL or a newline")
    return f"{source}:{target}" + (":ro" if read_only else "")


def _env_records(values: Sequence[tuple[str, str]], profile: RuntimeProfile) -> bytes:
    """NAME=value records, each ending in NUL, for the script's `mapfile -d ''`; each value as
    the runtime must be handed it to show the program the value itself (core.containerenv)."""
    for name, value in values:
        if "\0" in value:
            raise RenderError(f"env {name}: values cannot contain NUL bytes")
    carried = (f"{name}={containerenv.carried(profile, value)}\0" for name, value in values)
    return _utf8("".join(carried), "environment values")


def _check_words(spec: SlurmJobSpec) -> None:
    """The rules of api.scriptwords again (a spec built without validation meets them here)."""
    reserved = sorted(e.name for e in spec.env if reserved_env_name(e.name))
    if reserved:
        raise RenderError(f"env {', '.join(reserved)}: reserved names cannot be set")
    problem = command_problem(spec.command)
    if problem:
        raise RenderError(problem)
    paths = [(m.source, False) for m in spec.mounts] + [(m.target, True) for m in spec.mounts]
    if spec.working_dir is not None and spec.working_dir != "/":
        paths.append((spec.working_dir, True))
    for path, absolute in paths:
        problem = path_problem(path, absolute=absolute)
        if problem:
            raise RenderError(f"path {path!r} {problem}")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RenderError(f"{what} are not valid UTF-8 text") from exc


def _components(spec: SlurmJobSpec, ctx: RenderContext) -> list[JobComponent]:
    components = []
    for pool in spec.pools:
        constraint = None
        if pool.gpus_per_node > 0:
            if pool.name not in ctx.gpu_series or ctx.gpu_series[pool.name] is None:
                raise RenderError(f"pool {pool.name}: GPU series {pool.gpu_series} not resolved")
            series = ctx.gpu_series[pool.name]
            assert series is not None
            constraint = series.slurm_constraint
            if spec.is_heterogeneous and not constraint:
                # Fail closed: a component without a constraint could land on any GPU node.
                raise RenderError(
                    f"pool {pool.name}: GPU series {series.name} declares no Slurm constraint, "
                    "which a heterogeneous job needs to pin each component"
                )
        tasks = pool.tasks if spec.launch_shape is LaunchShape.TASKS else 1
        components.append(
            JobComponent(
                pool=pool.name,
                nodes=pool.nodes,
                tasks_per_node=tasks,
                cpus_per_task=pool.cpus // tasks,
                memory_mb=pool.memory_gb * 1024,
                gpus_per_node=pool.gpus_per_node,
                constraints=constraint,
                exclusive=ctx.exclusive.get(pool.name, False),
            )
        )
    return components


#: The shape templates (`templates/shape/`): None is a CPU-only job's one plain step.
SHAPE_TEMPLATES: dict[LaunchShape | None, str] = {
    None: "shape/cpu.sh.j2",
    LaunchShape.RAY: "shape/ray.sh.j2",
    LaunchShape.NODES: "shape/nodes.sh.j2",
    LaunchShape.TORCHRUN: "shape/nodes.sh.j2",
    LaunchShape.TASKS: "shape/tasks.sh.j2",
}


def _template_values(
    spec: SlurmJobSpec, ctx: RenderContext, cluster_dir: PurePosixPath, segment: SegmentParts
) -> dict[str, Any]:
    settings = ctx.settings
    profile = settings.slurm_runtime_profile
    artifact = ctx.artifact
    try:
        checked = artifact_values(settings, artifact)
    except ArtifactError as exc:
        raise RenderError(str(exc)) from None
    mounts = [_mount_spec(_cluster(settings, m.source), m.target, m.read_only) for m in spec.mounts]
    if str(cluster_dir) in {m.target for m in spec.mounts}:
        raise RenderError(f"mount target {cluster_dir} is the attempt's staging directory")
    # The attempt directory, at the same path, read-only: the job can read its records.
    mounts.append(_mount_spec(cluster_dir, str(cluster_dir), True))
    segment_vars, checkpoint = segment
    if checkpoint is not None:
        conflict = mount_conflict([m.target for m in spec.mounts], checkpoint)
        if conflict:
            raise RenderError(conflict)
        # The chain's checkpoint directory, read-write at the same path.
        mounts.append(_mount_spec(checkpoint, str(checkpoint), False))
    own_names = [name for name, _ in segment_vars]

    pools = spec.pools
    offsets = [sum(p.nodes for p in pools[:i]) for i in range(len(pools))]
    shape = spec.launch_shape
    tasks = shape is LaunchShape.TASKS
    task_offsets = [sum(p.nodes * p.tasks for p in pools[:i]) for i in range(len(pools))]
    node_pools = [
        {
            "index": i,
            "nodes": p.nodes,
            "gpus": p.gpus_per_node,
            "node_offset": offsets[i],
            "tasks": p.tasks if tasks else 1,
            "cpus_per_task": p.cpus // p.tasks if tasks else p.cpus,
            "gpus_per_task": p.gpus_per_node // p.tasks if tasks else p.gpus_per_node,
            "task_offset": task_offsets[i],
        }
        for i, p in enumerate(pools)
    ]
    ray_pools = [
        {
            "index": i,
            "nodes": p.nodes,
            "gpus": p.gpus_per_node,
            # Global node rank of the step's first node (the head is rank 0).
            "rank_offset": offsets[i] if i > 0 else 1,
            "object_store_bytes": ray_object_store_bytes(p.memory_gb),
        }
        for i, p in enumerate(pools)
    ]
    return {
        "runtime_template": f"runtime/{profile.value}.sh.j2",
        "shape_template": SHAPE_TEMPLATES[shape],
        "staging_dir": cluster_dir,
        **checked,
        "job_path": settings.slurm_job_path,
        "has_secrets": bool(spec.secret_env),
        "env_names": [e.name for e in spec.env] + own_names,
        "step_export": containerenv.step_export(profile, [e.name for e in spec.env] + own_names),
        "plain_env_names": list(spec.plain_env) + own_names,
        "secret_env_names": [e.name for e in spec.secret_env],
        "user_command": list(spec.command),
        "working_dir": spec.working_dir,
        "mounts": mounts,
        "gpus": not spec.is_cpu_only,
        "heterogeneous": spec.is_heterogeneous,
        "array": spec.array is not None,
        "world_size": sum(p.nodes for p in pools),
        "gpus_per_node": pools[0].gpus_per_node,
        "ray_pools": ray_pools,
        "node_pools": node_pools,
        "torchrun": shape is LaunchShape.TORCHRUN,
        "ray": shape is LaunchShape.RAY,
        "task_count": sum(p.nodes * p.tasks for p in pools) if tasks else 0,
        "master_port": spec.master_port,
        "picked_ports": picked_ports(ray=shape is LaunchShape.RAY, master_port=spec.master_port),
        "mpi": spec.launch.mpi if spec.launch is not None else None,
        "exit_codes": EXIT_CODES,
        **probe_values(spec, artifact, ctx.gpu_series, ctx.probe),
    }


def _segment(spec: SlurmJobSpec, ctx: RenderContext) -> SegmentParts:
    local = naming.checkpoint_dir(ctx.settings.storage_root, ctx.namespace, ctx.name, ctx.uid)
    return segment_parts(spec, ctx.segment, PurePosixPath(ctx.settings.to_cluster_path(local)))


def render_script(
    spec: SlurmJobSpec, ctx: RenderContext, segment: SegmentParts | None = None
) -> str:
    """The batch script; `segment`: the walltime segment's parts when the caller has them."""
    _check_words(spec)
    cluster_dir = _cluster_staging_dir(ctx)
    parts = segment if segment is not None else _segment(spec, ctx)
    try:
        template = environment(ctx.settings).get_template(BASE_TEMPLATE)
        return template.render(_template_values(spec, ctx, cluster_dir, parts))
    except jinja2.TemplateError as exc:
        raise RenderError(f"batch-script template: {exc}") from exc


def _staging_dir(ctx: RenderContext) -> Path:
    return naming.staging_dir(
        ctx.settings.storage_root, ctx.namespace, ctx.name, ctx.uid, ctx.attempt
    )


def _cluster_staging_dir(ctx: RenderContext) -> PurePosixPath:
    return PurePosixPath(ctx.settings.to_cluster_path(_staging_dir(ctx)))


def _array(spec: SlurmJobSpec, ctx: RenderContext) -> str | None:
    """The attempt's `--array` expression: its indices (every task of spec.array unless the
    attempt is a retry of some) and the parallelism."""
    if spec.array is None:
        if ctx.array_indices is not None:
            raise RenderError("array indices given for a job that is not an array")
        return None
    if spec.is_heterogeneous:
        raise RenderError("an array has exactly one pool: Slurm has no heterogeneous arrays")
    count = spec.array.count
    indices = ctx.array_indices if ctx.array_indices is not None else tuple(range(count))
    if not indices or any(i < 0 or i >= count for i in indices):
        raise RenderError(f"array indices must be some of 0 to {count - 1}")
    return slurm_array(indices, spec.array.parallelism)


def render_attempt(spec: SlurmJobSpec, ctx: RenderContext) -> RenderedAttempt:
    """The script, the attempt's files and the LaunchRequest of one attempt."""
    missing = [e.name for e in spec.secret_env if e.name not in ctx.secret_values]
    if missing:
        raise RenderError(f"env {', '.join(missing)}: secret value not resolved")

    staging = _staging_dir(ctx)
    cluster_dir = _cluster_staging_dir(ctx)
    array = _array(spec, ctx)
    segment = _segment(spec, ctx)
    script = render_script(spec, ctx, segment)
    plain = list(spec.plain_env.items()) + segment[0]
    profile = ctx.settings.slurm_runtime_profile
    files = {
        SCRIPT_FILE: StagedFile(_utf8(script, "the script's values"), SCRIPT_MODE),
        ENV_FILE: StagedFile(_env_records(plain, profile), ENV_MODE),
    }
    if spec.secret_env:
        secret_pairs = [(e.name, ctx.secret_values[e.name]) for e in spec.secret_env]
        files[SECRETS_FILE] = StagedFile(_env_records(secret_pairs, profile), SECRETS_MODE)

    launch = LaunchRequest(
        job_name=naming.job_name(ctx.namespace, ctx.name, ctx.uid, ctx.attempt),
        comment=naming.comment(ctx.namespace, ctx.name, ctx.uid, ctx.attempt),
        script=script,
        working_directory=str(cluster_dir),
        standard_output=str(cluster_dir / (ARRAY_STDOUT_PATTERN if array else STDOUT_FILE)),
        standard_error=str(cluster_dir / (ARRAY_STDERR_PATTERN if array else STDERR_FILE)),
        environment={
            "PATH": ctx.settings.slurm_job_path,
            "SLURMJOB_NAMESPACE": ctx.namespace,
            "SLURMJOB_NAME": ctx.name,
            "SLURMJOB_UID": ctx.uid,
            "SLURMJOB_ATTEMPT": str(ctx.attempt),
            "SLURMJOB_STAGING_DIR": str(cluster_dir),
        },
        components=_components(spec, ctx),
        partition=ctx.partition,
        account=spec.account,
        qos=spec.qos,
        # A walltime segment's own limit; the spec's (or the tenant's default) otherwise.
        time_limit_minutes=(
            ctx.segment.minutes if ctx.segment is not None else spec.time_limit_minutes
        ),
        array=array,
        excluded_nodes=ctx.probe.exclude if ctx.probe is not None else (),
        **warning_fields(spec, ctx.segment),
    )
    return RenderedAttempt(
        launch=launch, files=files, staging_dir=staging, cluster_staging_dir=cluster_dir
    )


# RenderError stays importable from here, where the controller looks for it.
__all__ = ["EXIT_ARTIFACT", "EXIT_CODES", "EXIT_RENDEZVOUS", "EXIT_SECRETS", "EXIT_STAGING"]
__all__ += ["RenderContext", "RenderError", "RenderedAttempt", "render_attempt", "render_script"]
