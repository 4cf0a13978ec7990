"""REST API v0.0.38 (Slurm 22.05, 23.02, 23.11).

Request keys go through sbatch's option parser (one key per sbatch option), so the body
follows the parser more than the served schema where they disagree:

* `script` is top-level and required; for a het job it lands on component 0.
* `environment` must be a non-empty object; it is required on *every* component (the schema
  marks it required on `job_properties`).
* `nodes` is sent as an int. The schema says `[min, max]`, but the list form was observed to
  be accepted and ignored on 22.05 (`[5,5]` ran on one node); the parser takes a number.
* `requeue` with *any* value turns requeue on, so it is never sent; `no_requeue: true` turns
  it off (it is in the parser's key table, marked "not in OAS", so the schema omits it).
* `exclusive: "exclusive"` is what the 22.05 parser understands (the schema's enum lists
  "true"/"false", whose handling was only fixed in 23.02).
* GPUs: `gpus_per_node` is a string in the schema; an untyped count ("2") works.
* Unknown keys are a hard error (HTTP 400), so nothing speculative may be added.
"""

from __future__ import annotations

from typing import Any

from pydantic import StrictInt

from slurmjob_operator.core.jobview import (
    ACTIVE_STATES,
    JobExit,
    JobSource,
    SlurmJobView,
    normalise_state,
    split_wait_status,
)
from slurmjob_operator.core.launch import JobComponent, LaunchRequest
from slurmjob_operator.slurm.dialects.common import (
    CancelResult,
    ControllerPing,
    Dialect,
    PingResult,
    SubmitReceipt,
    environment_entries,
    parse_envelope,
)
from slurmjob_operator.slurm.dialects.fields import (
    JsonObject,
    OptStr,
    Response,
    Timestamp,
    Uid,
    reason_text,
    zero_as_none,
)
from slurmjob_operator.slurm.dialects.records import Records, read_records, reading
from slurmjob_operator.slurm.errors import SlurmUnsupported

VERSION = "v0.0.38"
NO_VAL = 0xFFFFFFFE


class _JobInfo38(Response):
    job_id: StrictInt
    name: str | None = None
    comment: OptStr = None
    user_name: OptStr = None
    user_id: Uid = None
    partition: OptStr = None
    cluster: OptStr = None
    job_state: str | None = None
    state_reason: OptStr = None
    state_description: OptStr = None
    exit_code: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_string: OptStr = None
    nodes: OptStr = None
    node_count: int | None = None
    submit_time: Timestamp = None
    start_time: Timestamp = None
    end_time: Timestamp = None
    standard_output: OptStr = None
    standard_error: OptStr = None
    current_working_directory: OptStr = None
    features: OptStr = None
    time_limit: int | None = None


class _Submit38(Response):
    job_id: StrictInt
    step_id: str | int | None = None
    job_submit_user_msg: OptStr = None


class _Ping38(Response):
    hostname: OptStr = None
    ping: OptStr = None
    status: int | None = None


def job_view_38(raw: _JobInfo38) -> SlurmJobView:
    base, flags = normalise_state(raw.job_state)
    het_id = zero_as_none(raw.het_job_id)
    array_id, task = zero_as_none(raw.array_job_id), raw.array_task_id
    ended = base is not None and base not in ACTIVE_STATES
    return_code, signal = split_wait_status(raw.exit_code) if ended else (None, None)
    return SlurmJobView(
        job_id=raw.job_id,
        source=JobSource.CONTROLLER,
        het_job_id=het_id,
        het_job_offset=raw.het_job_offset if het_id is not None else None,
        array_job_id=array_id,
        # The array's own record says NO_VAL while it stands for pending tasks.
        array_task_id=task if array_id is not None and task is not None and task < NO_VAL else None,
        array_tasks=raw.array_task_string if array_id is not None else None,
        name=raw.name or "",
        comment=raw.comment,
        user=raw.user_name,
        user_id=raw.user_id,
        partition=raw.partition,
        cluster=raw.cluster,
        raw_state=(raw.job_state,) if raw.job_state else (),
        base_state=base,
        flags=flags,
        reason=reason_text(raw.state_reason),
        description=raw.state_description,
        exit=JobExit(return_code=return_code, signal=signal),
        nodes=raw.nodes,
        node_count=raw.node_count,
        submit_time=raw.submit_time,
        start_time=raw.start_time,
        end_time=raw.end_time,
        standard_output=raw.standard_output,
        # Slurm writes stderr into the stdout file when no stderr path was given.
        standard_error=raw.standard_error or raw.standard_output,
        working_directory=raw.current_working_directory,
        constraints=raw.features,
        # 22.05 reports unlimited jobs as null or as 525600 (a year of minutes).
        time_limit_minutes=raw.time_limit if raw.time_limit not in (None, 0, 525600) else None,
    )


class Dialect38(Dialect):
    version = VERSION
    supports_jobs_state = False
    supports_sluid_paths = False
    supports_accounting = False

    def _component(self, req: LaunchRequest, comp: JobComponent) -> dict[str, Any]:
        if req.excluded_nodes:
            # v0.0.38's job properties have no field for it: never drop an exclusion silently.
            raise SlurmUnsupported("slurmrestd v0.0.38 cannot exclude nodes from a job")
        job: dict[str, Any] = {
            "name": req.job_name,
            "comment": req.comment,
            "environment": environment_entries(req.environment),
            "current_working_directory": req.working_directory,
            "standard_output": req.standard_output,
            "standard_error": req.standard_error,
            "nodes": comp.nodes,
            "tasks": comp.nodes * comp.tasks_per_node,
            "tasks_per_node": comp.tasks_per_node,
            "cpus_per_task": comp.cpus_per_task,
            "memory_per_node": comp.memory_mb,
            "no_requeue": True,
        }
        if req.partition:
            job["partition"] = req.partition
        if req.account:
            job["account"] = req.account
        if req.qos:
            job["qos"] = req.qos
        if req.time_limit_minutes is not None:
            job["time_limit"] = req.time_limit_minutes
        if comp.constraints:
            job["constraints"] = comp.constraints
        if req.warning_signal is not None and req.warning_seconds is not None:
            # sbatch's --signal in the job properties; no "B:", so to the steps only.
            job["signal"] = f"{req.warning_signal}@{req.warning_seconds}"
        if comp.gpus_per_node:
            job["gpus_per_node"] = str(comp.gpus_per_node)
        if comp.exclusive:
            job["exclusive"] = "exclusive"
        return job

    def submit_body(self, req: LaunchRequest) -> dict[str, Any]:
        components = [self._component(req, c) for c in req.components]
        if req.array is not None:
            # sbatch's --array, in the served schema (`job_properties.array`, a string).
            components[0]["array"] = req.array
        if req.dependency:
            components[0]["dependency"] = req.dependency  # the leader's: the whole het job
        if req.is_heterogeneous:
            return {"script": req.script, "jobs": components}
        return {"script": req.script, "job": components[0]}

    @reading
    def parse_jobs(self, payload: JsonObject) -> Records[SlurmJobView]:
        return read_records(payload, "jobs", lambda j: job_view_38(_JobInfo38.model_validate(j)))

    @reading
    def parse_submit(self, payload: JsonObject) -> SubmitReceipt:
        raw = _Submit38.model_validate(payload)
        return SubmitReceipt(
            job_id=raw.job_id,
            step_id=None if raw.step_id is None else str(raw.step_id),
            user_message=raw.job_submit_user_msg,
            warnings=parse_envelope(payload).warnings,
        )

    @reading
    def parse_cancel(self, payload: JsonObject | None, job_ref: str) -> CancelResult:
        # 22.05 answers an already finished job with a plain success; nothing to tell apart.
        return CancelResult(job_ref=job_ref, warnings=parse_envelope(payload).warnings)

    @reading
    def parse_ping(self, payload: JsonObject) -> PingResult:
        env = parse_envelope(payload)
        pings = read_records(payload, "pings", _Ping38.model_validate).complete()
        return PingResult(
            release=env.release,
            cluster=env.cluster,
            controllers=tuple(
                ControllerPing(
                    hostname=p.hostname,
                    responding=(p.ping or "").upper() == "UP",
                    status=p.ping,
                )
                for p in pings
            ),
        )
