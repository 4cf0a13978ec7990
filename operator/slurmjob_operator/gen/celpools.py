"""CEL for the pools of a SlurmJob and how they go together (layout, arrays, launch shapes):
the `x-kubernetes-validations` `gen.crd` puts on the Pool and SlurmJobSpec nodes. Each rule
mirrors a pydantic validator of `api.pools` or `api.spec`; test_crd checks both refuse the same
manifests."""

from __future__ import annotations

from slurmjob_operator.api.spec import CUSTOM
from slurmjob_operator.gen.schema import Rule

_FORBIDDEN = "FieldValueForbidden"
_INVALID = "FieldValueInvalid"
_DUPLICATE = "FieldValueDuplicate"


def _gpus(var: str) -> str:
    return f"(has({var}.gpusPerNode) ? {var}.gpusPerNode : 0)"


CPU_ONLY = f"self.pools.all(p, {_gpus('p')} == 0)"
TASKS = "(has(self.launch) && has(self.launch.shape) && self.launch.shape == 'tasks')"


def _tasks(var: str) -> str:
    """A pool's tasks per node under launch shape tasks (`Pool.tasks`)."""
    return f"(has({var}.tasksPerNode) ? {var}.tasksPerNode : ({_gpus(var)} > 0 ? {_gpus(var)} : 1))"


POOL_RULES: tuple[Rule, ...] = (
    Rule(
        "!has(self.scratchGb)",
        "scratch requests are not supported by the Slurm backend",
        ".scratchGb",
        _FORBIDDEN,
    ),
    Rule(
        f"{_gpus('self')} == 0 || (has(self.gpuSeries) && size(self.gpuSeries) > 0)",
        "gpusPerNode > 0 needs a gpuSeries",
        ".gpuSeries",
        "FieldValueRequired",
    ),
)

LAYOUT_RULES: tuple[Rule, ...] = (
    Rule(
        "self.pools.all(p, self.pools.exists_one(q, q.name == p.name))",
        "pool names must be unique",
        ".pools",
        _DUPLICATE,
    ),
    Rule(
        f"{CPU_ONLY} || self.pools.all(p, {_gpus('p')} > 0)",
        "a GPU job cannot have a pool with gpusPerNode 0; a CPU-only job is custom/custom "
        "with exactly one pool",
        ".pools",
        _INVALID,
    ),
    Rule(
        f"!({CPU_ONLY}) || (self.framework.kind == '{CUSTOM}' "
        f"&& self.framework.name == '{CUSTOM}')",
        "a CPU-only job (gpusPerNode: 0) must use framework custom/custom",
        ".framework",
        _INVALID,
    ),
    Rule(
        f"!({CPU_ONLY}) || size(self.pools) == 1",
        "a CPU-only job has exactly one pool",
        ".pools",
        _INVALID,
    ),
    Rule(
        f"!({CPU_ONLY}) || self.pools.all(p, !has(p.nodes) || p.nodes == 1)",
        "multi-node CPU jobs are not supported: set nodes: 1",
        ".pools",
        _INVALID,
    ),
    *(
        Rule(rule, message, ".launch", _INVALID)
        for rule, message in (
            (
                f"!({CPU_ONLY}) || !has(self.launch) || !has(self.launch.shape) || {TASKS}",
                "a CPU-only job runs one plain step; of the launch shapes it takes only tasks",
            ),
            (
                f"!has(self.launch) || !has(self.launch.mpi) || {TASKS}",
                "an MPI plugin (mpi) is for launch shape tasks",
            ),
            (
                f"{TASKS} || self.pools.all(p, !has(p.tasksPerNode))",
                "tasksPerNode is for launch shape tasks",
            ),
            (
                f"!{TASKS} || self.pools.all(p, {_gpus('p')} % {_tasks('p')} == 0 "
                f"&& p.cpus % {_tasks('p')} == 0)",
                "tasksPerNode must divide gpusPerNode (the GPUs are shared out evenly) and cpus",
            ),
        )
    ),
    Rule(
        "!has(self.array) || size(self.pools) == 1",
        "an array has exactly one pool: Slurm has no heterogeneous arrays",
        ".array",
        _INVALID,
    ),
)
