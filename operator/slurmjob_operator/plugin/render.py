"""What `kubectl slurmjob get` and `describe` print: pure functions of SlurmJob bodies (as the
apiserver returns them) and of the time now.

Every cell comes from a status someone else wrote, some of it from a job's own output (the
log tails, Slurm's reasons): it is made printable before it reaches a terminal (`printable`:
control characters, escape sequences among them, are shown as `\\xNN`; a table cell's line
breaks become spaces), so no job can move a user's cursor, retitle the terminal or hide a line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slurmjob_operator.api.status import Attempt, Condition, LogTail, SlurmJobStatus
from slurmjob_operator.core.claims import action_of, claimed_cluster, segment_of, transition_time
from slurmjob_operator.core.decisions import Hold, hold_action
from slurmjob_operator.core.reasons import ConditionType, Reason
from slurmjob_operator.times import parse_rfc3339

#: Characters kept as they are by `printable`, besides those from space on (DEL aside).
_KEPT = frozenset("\n\t")
#: The array counts shown first, in this order; any other integer field follows by name.
_ARRAY_FIRST = (
    "total",
    "size",
    "pending",
    "queued",
    "running",
    "succeeded",
    "completed",
    "failed",
    "cancelled",
)
#: A cell of `get` is cut to this many characters (describe shows the whole message).
CELL_MAX = 60
TAIL_LINES = 20


def printable(text: str, *, keep: frozenset[str] = _KEPT) -> str:
    """`text` with every control character but those in `keep` written as `\\xNN`."""
    out: list[str] = []
    for char in text:
        code = ord(char)
        if char in keep or (code >= 0x20 and code != 0x7F and not 0x80 <= code < 0xA0):
            out.append(char)
        else:
            out.append(f"\\x{code:02x}")
    return "".join(out)


def cell(value: object, max_length: int | None = None) -> str:
    """One table cell: printable, on one line, `-` when empty, cut to `max_length`."""
    if value is None or value == "":
        return "-"
    text = printable(str(value), keep=frozenset()).replace("\\x0a", " ").replace("\\x09", " ")
    if max_length is not None and len(text) > max_length:
        text = text[: max_length - 1] + "…"
    return text


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Columns separated by three spaces, as `kubectl get` aligns them."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = []
    for row in [list(headers), *rows]:
        line = "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        lines.append(indent + line)
    return "\n".join(lines) + "\n"


def age(timestamp: str | None, now: datetime) -> str:
    """`kubectl`'s short age: 45s, 12m, 3h5m, 4d."""
    when = _parse(timestamp)
    if when is None:
        return "-"
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if hours < 8 and minutes % 60 else f"{hours}h"
    return f"{hours // 24}d"


def _parse(timestamp: str | None) -> datetime | None:
    try:
        return parse_rfc3339(timestamp)
    except ValueError:
        return None


@dataclass(frozen=True)
class Job:
    """A SlurmJob body, read once: its name, namespace, creation time, status and array."""

    name: str
    namespace: str
    created: str | None
    status: SlurmJobStatus
    array: Mapping[str, Any] | None
    suspend: bool
    #: `spec.framework.image`, when the job runs an OCI image of the cache.
    image: str | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Job:
        meta = body.get("metadata") or {}
        raw_status = body.get("status") or {}
        array = raw_status.get("array") if isinstance(raw_status, Mapping) else None
        spec = body.get("spec") or {}
        framework = spec.get("framework") if isinstance(spec, Mapping) else None
        image = framework.get("image") if isinstance(framework, Mapping) else None
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            created=meta.get("creationTimestamp"),
            status=SlurmJobStatus.parse(raw_status if isinstance(raw_status, Mapping) else {}),
            array=array if isinstance(array, Mapping) else None,
            suspend=bool(spec.get("suspend", False)) if isinstance(spec, Mapping) else False,
            image=image if isinstance(image, str) else None,
        )


def condition(status: SlurmJobStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def reason(status: SlurmJobStatus) -> str | None:
    """The one reason a table shows: a suspension that took effect, else Ready's."""
    suspended = condition(status, "Suspended")
    if suspended is not None and suspended.status == "True":
        return suspended.reason
    ready = condition(status, "Ready")
    return ready.reason if ready is not None else None


def array_counts(array: Mapping[str, Any] | None) -> str | None:
    """`status.array`'s integer counts as `total=8 running=3 ...` (known ones first, a nested
    mapping's counts named by their own key); None without an array."""
    if array is None:
        return None
    counts: dict[str, int] = {}
    for key, value in array.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            counts[str(key)] = value
        elif isinstance(value, Mapping):
            for inner, number in value.items():
                if isinstance(number, int) and not isinstance(number, bool):
                    counts.setdefault(str(inner), number)
    first = [k for k in _ARRAY_FIRST if k in counts]
    rest = sorted(k for k in counts if k not in _ARRAY_FIRST)
    return " ".join(f"{k}={counts[k]}" for k in [*first, *rest]) or None


def image_digest(status: SlurmJobStatus) -> str | None:
    """The digest the job runs, as the operator wrote it: `ImageReady=True` (`ImageCached`)
    says `runs <reference>@<digest>`. Shown, never decided on."""
    ready = condition(status, ConditionType.IMAGE_READY)
    if ready is None or ready.status != "True" or ready.reason != Reason.IMAGE_CACHED:
        return None
    ran, at, digest = ready.message.removeprefix("runs ").rpartition("@")
    return digest if ran and at and digest.startswith("sha256:") else None


def image_lines(job: Job) -> list[str]:
    """describe's image: the reference the spec names, the digest it runs, and the import's
    state (the `ImageReady` condition's reason and message); nothing without an image."""
    if job.image is None:
        return []
    ready = condition(job.status, ConditionType.IMAGE_READY)
    state = None
    if ready is not None:
        state = f"{ready.reason} (ImageReady={ready.status}): {ready.message}"
    return [
        f"Image:         {cell(job.image)}",
        f"Image digest:  {cell(image_digest(job.status))}",
        f"Image import:  {cell(state or 'not looked at yet')}",
    ]


def get_table(jobs: Sequence[Job], now: datetime, *, namespaces: bool = False) -> str:
    """`kubectl slurmjob get`: one row per SlurmJob; ARRAY only when one has an array."""
    arrays = any(j.array is not None for j in jobs)
    headers = ["NAME", "PHASE", "ATTEMPT", "JOBID", "SLUID", "CLUSTER"]
    headers += ["ARRAY"] if arrays else []
    headers += ["REASON", "AGE"]
    if namespaces:
        headers.insert(0, "NAMESPACE")
    rows = []
    for job in jobs:
        attempt = job.status.current_attempt
        row = [
            cell(job.name),
            cell(job.status.phase),
            cell(attempt.number if attempt else None),
            cell(attempt.job_id if attempt else None),
            cell(attempt.sluid if attempt else None),
            cell(claimed_cluster(attempt) if attempt else None),
        ]
        if arrays:
            row.append(cell(array_counts(job.array), CELL_MAX))
        row += [cell(reason(job.status), CELL_MAX), age(job.created, now)]
        if namespaces:
            row.insert(0, cell(job.namespace))
        rows.append(row)
    return table(headers, rows)


def _attempt_row(attempt: Attempt) -> list[str]:
    state = attempt.native_state
    if state and attempt.native_flags:
        state = f"{state}+{'+'.join(attempt.native_flags)}"
    if attempt.proven_absent_at:
        state = "proven absent"
    elif attempt.declared_lost:
        state = "declared lost"
    exit_code = attempt.exit_code
    exit_text = None if exit_code is None else str(exit_code)
    if attempt.signal:
        exit_text = f"{exit_text or '-'} (signal {attempt.signal})"
    return [
        cell(attempt.number),
        cell(attempt.job_id),
        cell(attempt.sluid),
        cell(claimed_cluster(attempt)),
        cell(state, CELL_MAX),
        cell(attempt.reason, CELL_MAX),
        cell(exit_text),
        cell(attempt.submitted_at),
        cell(attempt.started_at),
        cell(attempt.finished_at),
        cell(action_of(attempt)),
    ]


def _segment_cell(attempt: Attempt) -> str:
    segment = segment_of(attempt)
    if segment is None:
        return cell(None)
    ended = f" ({segment.ended})" if segment.ended else ""
    return cell(f"{segment.index}{ended}", CELL_MAX)


def _tail_section(label: str, tail: LogTail | None, lines: int) -> list[str]:
    if tail is None:
        return [f"  {label}: (none)"]
    kept = tail.tail.splitlines()
    shown = kept[-lines:]
    more = " (earlier lines left out)" if tail.truncated or len(kept) > lines else ""
    head = f"  {label}: {tail.bytes} bytes, last {len(shown)} lines{more}:"
    return [head, *(f"    {printable(line, keep=frozenset({chr(9)}))}" for line in shown)]


def describe(job: Job, now: datetime, *, tail_lines: int = TAIL_LINES) -> str:
    """`kubectl slurmjob describe`: the resource, its attempts, conditions and tails."""
    status = job.status
    attempt = status.current_attempt
    out = [
        f"Name:          {cell(job.name)}",
        f"Namespace:     {cell(job.namespace)}",
        f"Created:       {cell(job.created)} ({age(job.created, now)} ago)",
        f"Phase:         {cell(status.phase)}",
        f"Reason:        {cell(reason(status))}",
        f"Message:       {cell(status.message)}",
        f"Suspend:       {'true' if job.suspend else 'false'}",
        *image_lines(job),
    ]
    if attempt is not None:
        sluid = f", SLUID {cell(attempt.sluid)}" if attempt.sluid else ""
        where = cell(claimed_cluster(attempt))
        out.append(
            f"Slurm job:     {cell(attempt.job_id)}{sluid}, cluster {where}"
            f" (attempt {attempt.number} of {len(status.attempts)})"
        )
    if status.nodes:
        out.append(f"Nodes:         {cell(status.nodes)}")
    if job.array is not None:
        out.append(f"Array:         {cell(array_counts(job.array))}")
    if status.next_attempt_at:
        out.append(f"Next attempt:  {cell(status.next_attempt_at)}")
    out.append("Attempts:")
    if status.attempts:
        headers = ["#", "JOBID", "SLUID", "CLUSTER", "STATE", "SLURM REASON", "EXIT"]
        headers += ["SUBMITTED", "STARTED", "FINISHED", "RETRY"]
        rows = [_attempt_row(a) for a in status.attempts]
        if any(segment_of(a) is not None for a in status.attempts):
            # A walltime chain: each attempt's segment and how it ended.
            headers.append("SEGMENT")
            rows = [[*r, _segment_cell(a)] for r, a in zip(rows, status.attempts, strict=True)]
        out.append(table(headers, rows, indent="  ").rstrip("\n"))
    else:
        out.append("  (none yet)")
    out.append("Conditions:")
    if status.conditions:
        rows = [
            [
                cell(c.type),
                cell(c.status),
                cell(c.reason),
                age(transition_time(c), now),
                cell(c.message),
            ]
            for c in status.conditions
        ]
        out.append(
            table(["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], rows, indent="  ").rstrip("\n")
        )
    else:
        out.append("  (none yet)")
    logs = status.logs
    out.append("Log tails (as the status keeps them; `kubectl slurmjob logs` shows more):")
    out += _tail_section("stdout", logs.stdout if logs else None, tail_lines)
    out += _tail_section("stderr", logs.stderr if logs else None, tail_lines)
    return "\n".join(out) + "\n"


def suspend_effect(job: Job) -> str:
    """What `spec.suspend: true` does to this job now (`core.decisions.hold_action`, read by
    the operator the same way)."""
    status = job.status
    attempt = status.current_attempt
    if status.phase is not None and status.phase.is_terminal:
        return "the job has ended: spec.suspend changes nothing"
    action = hold_action(status, True)
    if attempt is None or attempt.job_id is None:
        return (
            "nothing is submitted while spec.suspend is true; setting it back to false "
            "submits the job"
        )
    if action is Hold.HOLD:
        return (
            f"the queued Slurm job {attempt.job_id} is held in Slurm; setting spec.suspend "
            "back to false releases it"
        )
    if action is Hold.CANNOT_HOLD:
        return (
            f"Slurm job {attempt.job_id} already left the queue: Slurm holds only pending "
            "jobs, so it runs on to its end (condition Suspended=False, reason NotHeld); no "
            "retry is submitted while spec.suspend is true. To stop it, delete the SlurmJob "
            f"(kubectl slurmjob cancel {job.name})"
        )
    return f"Slurm job {attempt.job_id} is held already"


def delete_effect(job: Job) -> str:
    """What deleting this SlurmJob does (the operator's finalizer)."""
    attempt = job.status.current_attempt
    if job.status.phase is not None and job.status.phase.is_terminal:
        return (
            "its job has ended: the operator removes its staging files and lets it go "
            "(its finalizer)"
        )
    if attempt is None:
        return "nothing was submitted: it goes away once the operator has seen the deletion"
    if attempt.job_id is None:
        return (
            "the operator looks its Slurm job up by name, cancels what it finds and waits for "
            "the end before the SlurmJob goes away (its finalizer)"
        )
    return (
        f"the operator cancels Slurm job {attempt.job_id} first and waits for its end (its "
        "finalizer); the SlurmJob goes away once the job has ended"
    )
