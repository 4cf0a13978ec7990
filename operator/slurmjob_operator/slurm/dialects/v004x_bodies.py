"""The submit body of REST API v0.0.40 - v0.0.45 (`v004x`), checked against the schemas
served by Slurm 26.05 (v0.0.42 - v0.0.45) and, for v0.0.40/41 which no sample server serves,
against the fact sheet:

* `job` for one component, `jobs` for a het job; the script goes into `job.script` /
  `jobs[0].script` (the schema: "only the first component in a HetJob is populated or
  honored"); the top-level `script` was tagged deprecated in v0.0.41/42, so it is not used.
* `environment` is a list of "K=V"; `current_working_directory` on *every* component (Slurm
  26.05 refused a het job whose second component lacked it: error 2063); name, comment and
  stdout/stderr on every component as well, so no component falls back to `slurm-%j.out`.
* `nodes` is a string ("2"); `time_limit` and `memory_per_node` use the
  `{set, infinite, number}` form the schemas declare (every data_parser version accepts it).
* GPUs: `tres_per_node: "gres/gpu:N"` (the controller's internal TRES form since 23.11).
* Exclusive nodes: `shared: ["none"]` (`exclusive` is gone from v0.0.42 and deprecated in
  v0.0.41). Requeue: `requeue: false`. `partition`/`account`/`qos` only when set.
"""

from __future__ import annotations

from typing import Any

from slurmjob_operator.core.launch import JobComponent, LaunchRequest
from slurmjob_operator.slurm.dialects.common import environment_entries


def submit_body(req: LaunchRequest) -> dict[str, Any]:
    components = [_component(req, c, i == 0) for i, c in enumerate(req.components)]
    if req.is_heterogeneous:
        return {"jobs": components}
    return {"job": components[0]}


def _set(number: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": number}


def _component(req: LaunchRequest, comp: JobComponent, first: bool) -> dict[str, Any]:
    env = environment_entries(req.environment)
    job: dict[str, Any] = {}
    if first:
        job["script"] = req.script
        if req.array is not None:
            job["array"] = req.array
    job.update(
        {
            "name": req.job_name,
            "comment": req.comment,
            "environment": [f"{k}={v}" for k, v in env.items()],
            "current_working_directory": req.working_directory,
            "standard_output": req.standard_output,
            "standard_error": req.standard_error,
            "nodes": str(comp.nodes),
            "tasks": comp.nodes * comp.tasks_per_node,
            "tasks_per_node": comp.tasks_per_node,
            "cpus_per_task": comp.cpus_per_task,
            "memory_per_node": _set(comp.memory_mb),
            "requeue": False,
        }
    )
    if req.partition:
        job["partition"] = req.partition
    if req.account:
        job["account"] = req.account
    if req.qos:
        job["qos"] = req.qos
    if req.time_limit_minutes is not None:
        job["time_limit"] = _set(req.time_limit_minutes)
    if first and req.dependency:
        job["dependency"] = req.dependency  # the leader's holds for the whole het job
    if comp.constraints:
        job["constraints"] = comp.constraints
    if req.excluded_nodes:
        job["excluded_nodes"] = list(req.excluded_nodes)
    if req.warning_signal is not None and req.warning_seconds is not None:
        # No flags: to the job's steps, where the command runs, and not the batch shell.
        job["kill_warning_signal"] = req.warning_signal
        job["kill_warning_delay"] = _set(req.warning_seconds)
        job["kill_warning_flags"] = []
    if comp.gpus_per_node:
        job["tres_per_node"] = f"gres/gpu:{comp.gpus_per_node}"
    if comp.exclusive:
        job["shared"] = ["none"]
    return job
