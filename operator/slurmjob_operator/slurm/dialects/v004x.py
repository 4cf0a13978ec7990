"""REST API v0.0.40 - v0.0.45 (data_parser versions; Slurm 23.11 - 26.05).

The submit body, checked against the schemas each version serves, is `v004x_bodies`.

Responses differ by version only in what is present: `stdout_expanded` from v0.0.43 (before
that `standard_output` is already expanded), `step_id.sluid` in job info from v0.0.44,
`sluid` on accounting records from v0.0.45. Parsing takes whatever is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import StrictInt

from slurmjob_operator.core.jobview import (
    ACTIVE_STATES,
    BaseState,
    JobExit,
    JobSource,
    JobStateEntry,
    SlurmJobView,
    normalise_state,
)
from slurmjob_operator.core.launch import LaunchRequest
from slurmjob_operator.slurm.dialects.common import (
    CancelResult,
    ControllerPing,
    Dialect,
    PingResult,
    SubmitReceipt,
    parse_envelope,
    parse_state_entry,
)
from slurmjob_operator.slurm.dialects.fields import (
    JsonObject,
    NoValInt,
    OptStr,
    Response,
    Timestamp,
    Uid,
    reason_text,
    zero_as_none,
)
from slurmjob_operator.slurm.dialects.kill import (
    BulkCancelResult,
    kill_jobs_body,
    kill_statuses,
    parse_kill_jobs,
)
from slurmjob_operator.slurm.dialects.records import Records, read_records, reading
from slurmjob_operator.slurm.dialects.v004x_bodies import submit_body
from slurmjob_operator.slurm.errors import (
    ALREADY_DONE,
    INVALID_JOB_ID,
    SlurmNotFound,
    SlurmRejected,
)
from slurmjob_operator.versions import version_key

VERSIONS: tuple[str, ...] = ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")


class _Signal(Response):
    id: NoValInt = None
    name: OptStr = None


class _Exit(Response):
    status: tuple[str, ...] = ()
    return_code: NoValInt = None
    signal: _Signal | None = None


class _StepRef(Response):
    sluid: OptStr = None


class _JobInfo(Response):
    job_id: StrictInt
    name: str | None = None
    comment: OptStr = None
    user_name: OptStr = None
    user_id: Uid = None
    partition: OptStr = None
    cluster: OptStr = None
    job_state: list[str] | str | None = None
    state_reason: OptStr = None
    state_description: OptStr = None
    exit_code: _Exit | None = None
    het_job_id: NoValInt = None
    het_job_offset: NoValInt = None
    array_job_id: NoValInt = None
    array_task_id: NoValInt = None
    array_task_string: OptStr = None
    nodes: OptStr = None
    node_count: NoValInt = None
    submit_time: Timestamp = None
    start_time: Timestamp = None
    end_time: Timestamp = None
    standard_output: OptStr = None
    standard_error: OptStr = None
    stdout_expanded: OptStr = None
    stderr_expanded: OptStr = None
    current_working_directory: OptStr = None
    features: OptStr = None
    time_limit: NoValInt = None
    step_id: _StepRef | None = None


class _AcctComment(Response):
    job: OptStr = None


class _AcctState(Response):
    current: list[str] | str | None = None
    reason: OptStr = None


class _AcctHet(Response):
    job_id: NoValInt = None
    job_offset: NoValInt = None


class _AcctArray(Response):
    job_id: NoValInt = None
    task_id: NoValInt = None
    task: OptStr = None


class _AcctTime(Response):
    submission: Timestamp = None
    start: Timestamp = None
    end: Timestamp = None


class _AcctJob(Response):
    job_id: StrictInt
    name: str | None = None
    user: OptStr = None
    partition: OptStr = None
    cluster: OptStr = None
    nodes: OptStr = None
    constraints: OptStr = None
    working_directory: OptStr = None
    comment: _AcctComment | None = None
    state: _AcctState | None = None
    exit_code: _Exit | None = None
    het: _AcctHet | None = None
    array: _AcctArray | None = None
    time: _AcctTime | None = None
    stdout: OptStr = None
    stderr: OptStr = None
    stdout_expanded: OptStr = None
    stderr_expanded: OptStr = None
    sluid: OptStr = None


class _Submit(Response):
    job_id: StrictInt
    step_id: str | int | None = None
    job_submit_user_msg: OptStr = None


class _Ping(Response):
    hostname: OptStr = None
    responding: bool | None = None
    pinged: OptStr = None
    status: OptStr = None


def exit_of(raw: _Exit | None, base: BaseState | None) -> JobExit:
    """Exit details only for an ended job: a running job reports "SUCCESS, 0" meaning nothing."""
    if raw is None or base is None or base in ACTIVE_STATES or "PENDING" in raw.status:
        return JobExit()
    signal = raw.signal.id if raw.signal is not None else None
    return JobExit(return_code=raw.return_code, signal=signal or None)


def _het(het_id: int | None, offset: int | None) -> tuple[int | None, int | None]:
    het_id = zero_as_none(het_id)
    return het_id, (offset if het_id is not None else None)


def _states(raw: list[str] | str | None) -> tuple[str, ...]:
    if raw is None:
        return ()
    return (raw,) if isinstance(raw, str) else tuple(raw)


def job_view(raw: _JobInfo) -> SlurmJobView:
    states = _states(raw.job_state)
    base, flags = normalise_state(states)
    het_id, het_offset = _het(raw.het_job_id, raw.het_job_offset)
    array_id = zero_as_none(raw.array_job_id)
    stdout = raw.stdout_expanded or raw.standard_output
    return SlurmJobView(
        job_id=raw.job_id,
        source=JobSource.CONTROLLER,
        sluid=raw.step_id.sluid if raw.step_id is not None else None,
        het_job_id=het_id,
        het_job_offset=het_offset,
        array_job_id=array_id,
        array_task_id=raw.array_task_id if array_id is not None else None,
        array_tasks=raw.array_task_string if array_id is not None else None,
        name=raw.name or "",
        comment=raw.comment,
        user=raw.user_name,
        user_id=raw.user_id,
        partition=raw.partition,
        cluster=raw.cluster,
        raw_state=states,
        base_state=base,
        flags=flags,
        reason=reason_text(raw.state_reason),
        description=raw.state_description,
        exit=exit_of(raw.exit_code, base),
        nodes=raw.nodes,
        node_count=raw.node_count,
        submit_time=raw.submit_time,
        start_time=raw.start_time,
        end_time=raw.end_time,
        standard_output=stdout,
        # 25.11+ leave stderr blank unless set: Slurm then writes it into the stdout file.
        standard_error=raw.stderr_expanded or raw.standard_error or stdout,
        working_directory=raw.current_working_directory,
        constraints=raw.features,
        time_limit_minutes=raw.time_limit,
    )


def accounting_view(raw: _AcctJob) -> SlurmJobView:
    states = _states(raw.state.current if raw.state is not None else None)
    base, flags = normalise_state(states)
    het_id, het_offset = _het(
        raw.het.job_id if raw.het else None, raw.het.job_offset if raw.het else None
    )
    array_id = zero_as_none(raw.array.job_id) if raw.array else None
    stdout = raw.stdout_expanded or raw.stdout
    nodes = raw.nodes if raw.nodes != "None assigned" else None
    return SlurmJobView(
        job_id=raw.job_id,
        source=JobSource.ACCOUNTING,
        sluid=raw.sluid,
        het_job_id=het_id,
        het_job_offset=het_offset,
        array_job_id=array_id,
        array_task_id=raw.array.task_id if raw.array and array_id is not None else None,
        array_tasks=raw.array.task if raw.array and array_id is not None else None,
        name=raw.name or "",
        comment=raw.comment.job if raw.comment else None,
        user=raw.user,
        partition=raw.partition,
        cluster=raw.cluster,
        raw_state=states,
        base_state=base,
        flags=flags,
        reason=reason_text(raw.state.reason if raw.state else None),
        exit=exit_of(raw.exit_code, base),
        nodes=nodes,
        submit_time=raw.time.submission if raw.time else None,
        start_time=raw.time.start if raw.time else None,
        end_time=raw.time.end if raw.time else None,
        standard_output=stdout,
        standard_error=raw.stderr_expanded or raw.stderr or stdout,
        working_directory=raw.working_directory,
        constraints=raw.constraints,
    )


class Dialect4x(Dialect):
    supports_jobs_state = True
    supports_accounting = True
    supports_exclusion = True
    supports_bulk_cancel = True

    def __init__(self, version: str) -> None:
        if version not in VERSIONS:
            raise ValueError(f"{version} is not a data_parser version this dialect speaks")
        self.version = version
        self.supports_sluid_paths = version_key(version) >= (0, 0, 45)

    def submit_body(self, req: LaunchRequest) -> dict[str, Any]:
        return submit_body(req)

    @reading
    def parse_jobs(self, payload: JsonObject) -> Records[SlurmJobView]:
        return read_records(payload, "jobs", lambda j: job_view(_JobInfo.model_validate(j)))

    @reading
    def parse_accounting_jobs(self, payload: JsonObject) -> Records[SlurmJobView]:
        return read_records(payload, "jobs", lambda j: accounting_view(_AcctJob.model_validate(j)))

    @reading
    def parse_jobs_state(self, payload: JsonObject) -> Records[JobStateEntry]:
        return read_records(
            payload, "jobs", lambda j: parse_state_entry(j.get("job_id"), j.get("state"))
        )

    @reading
    def parse_submit(self, payload: JsonObject) -> SubmitReceipt:
        raw = _Submit.model_validate(payload)
        return SubmitReceipt(
            job_id=raw.job_id,
            step_id=None if raw.step_id is None else str(raw.step_id),
            user_message=raw.job_submit_user_msg,
            warnings=parse_envelope(payload).warnings,
        )

    @reading
    def parse_cancel(self, payload: JsonObject | None, job_ref: str) -> CancelResult:
        env = parse_envelope(payload)
        already_done = any("already" in (w.description or "").lower() for w in env.warnings)
        for status in kill_statuses(payload):
            message = status.message(job_ref)
            if status.code == ALREADY_DONE:
                already_done = True
            elif status.code == INVALID_JOB_ID:
                raise SlurmNotFound("job not found", status=200, errors=(message,))
            else:
                raise SlurmRejected("signal refused", status=200, errors=(message,))
        return CancelResult(job_ref=job_ref, already_done=already_done, warnings=env.warnings)

    def kill_jobs_body(self, refs: Sequence[str]) -> dict[str, Any]:
        return kill_jobs_body(refs)

    def parse_kill_jobs(self, payload: JsonObject | None, sent: Sequence[str]) -> BulkCancelResult:
        return parse_kill_jobs(payload, sent)

    @reading
    def parse_ping(self, payload: JsonObject) -> PingResult:
        env = parse_envelope(payload)
        pings = read_records(payload, "pings", _Ping.model_validate).complete()
        return PingResult(
            release=env.release,
            cluster=env.cluster,
            controllers=tuple(
                ControllerPing(
                    hostname=p.hostname,
                    responding=bool(p.responding)
                    if p.responding is not None
                    else (p.pinged or "").upper() == "UP",
                    status=p.status or p.pinged,
                )
                for p in pings
            ),
        )
