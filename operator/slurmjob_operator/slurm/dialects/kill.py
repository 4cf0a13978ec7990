"""Cancel answers of v0.0.40+: `status[]` of per-job failures, for one job and for many.

From 24.11 both `DELETE /job/{id}` and `DELETE /jobs` go through `slurm_kill_jobs`, which
answers HTTP 200 and lists each job it could not signal as
`{error: {string, code, message}, step_id, job_id, ...}`: 2017 for an id Slurm does not know,
2021 for a job already ending or ended, anything else a refusal. `step_id` repeats the id as
it was sent (a number, "123+1" or a SLUID), which is how a failure is matched to the request;
`job_id` is the number when Slurm knew the job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from slurmjob_operator.core.jobview import valid_job_id
from slurmjob_operator.slurm.dialects.fields import JsonObject, OptStr, Response, no_val
from slurmjob_operator.slurm.dialects.records import read_records
from slurmjob_operator.slurm.errors import ALREADY_DONE, INVALID_JOB_ID, SlurmMessage


class _KillError(Response):
    string: OptStr = None
    code: int | None = None
    message: OptStr = None


class KillStatus(Response):
    error: _KillError | None = None
    step_id: OptStr = None
    job_id: Any = None

    @property
    def code(self) -> int | None:
        return self.error.code if self.error else None

    def message(self, fallback: str) -> SlurmMessage:
        return SlurmMessage(
            error_number=self.code,
            error=self.error.string if self.error else None,
            description=self.error.message if self.error else None,
            source=f"job {self.step_id or valid_job_id(no_val(self.job_id)) or fallback}",
        )


def kill_statuses(payload: JsonObject | None) -> list[KillStatus]:
    """The per-job failures; one unreadable record fails the read (it may be the refusal)."""
    return [
        s
        for s in read_records(payload or {}, "status", KillStatus.model_validate).complete()
        if s.code
    ]


class BulkCancelResult(BaseModel):
    """What `DELETE /jobs` did to each id sent (as sent: a number's text or a SLUID).

    `unmatched` holds failures that name no id that was sent: then nothing in the batch is
    known to be cancelled, and the caller must ask per job."""

    model_config = ConfigDict(frozen=True)

    sent: tuple[str, ...]
    missing: frozenset[str] = frozenset()
    already_done: frozenset[str] = frozenset()
    refused: tuple[tuple[str, SlurmMessage], ...] = ()
    unmatched: tuple[SlurmMessage, ...] = ()

    def refusal(self, ref: str) -> SlurmMessage | None:
        return next((m for r, m in self.refused if r == ref), None)


def kill_jobs_body(refs: Sequence[str]) -> dict[str, Any]:
    """`kill_jobs_msg` for the given ids. `FULL_JOB` explicitly: the one-job endpoint adds it
    only when no flags are given, and the bulk one has no such default; no signal means
    SIGKILL, as `scancel` does."""
    return {"jobs": list(refs), "flags": ["FULL_JOB"]}


def _matched(status: KillStatus, sent: Iterable[str]) -> str | None:
    refs = set(sent)
    if status.step_id in refs:
        return status.step_id
    number = valid_job_id(no_val(status.job_id))
    return str(number) if number is not None and str(number) in refs else None


def parse_kill_jobs(payload: JsonObject | None, sent: Sequence[str]) -> BulkCancelResult:
    missing: set[str] = set()
    done: set[str] = set()
    refused: list[tuple[str, SlurmMessage]] = []
    unmatched: list[SlurmMessage] = []
    for status in kill_statuses(payload):
        ref = _matched(status, sent)
        message = status.message(ref or "?")
        if ref is None:
            unmatched.append(message)
        elif status.code == INVALID_JOB_ID:
            missing.add(ref)
        elif status.code == ALREADY_DONE:
            done.add(ref)
        else:
            refused.append((ref, message))
    return BulkCancelResult(
        sent=tuple(sent),
        missing=frozenset(missing),
        already_done=frozenset(done),
        refused=tuple(refused),
        unmatched=tuple(unmatched),
    )
