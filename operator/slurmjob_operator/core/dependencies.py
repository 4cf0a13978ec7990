"""Dependencies between SlurmJobs (`spec.dependsOn`), decided from what the upstream SlurmJobs'
statuses say.

A dependency is on the upstream *SlurmJob*, whose retries are new Slurm jobs, while Slurm's
own dependencies name one Slurm job: `afterok:J` never runs once J failed, even when the
upstream is retried as J2. So:

- An upstream that is final (a final phase, no retry scheduled) is resolved here, never given
  to Slurm (`afterok` on a job that already ended is satisfied or never, depending on whether
  slurmctld still remembers it).
- `Succeeded` on an upstream whose current job is in Slurm (queued or running, on the same
  cluster) is given to Slurm as `afterok` on that job, so Slurm orders them and the dependent
  accrues queue age. When the upstream is retried, the pending dependent is repointed to the
  new job (`repoint`); when the upstream ends failed for good, the dependent is cancelled and
  fails `DependencyFailed`.
- `Failed` and `Finished` are held here until the upstream is final: `afternotok`/`afterany`
  would start the dependent as soon as the first attempt failed, though a retry may still
  succeed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from slurmjob_operator.api.spec import Dependency, DependencyCondition
from slurmjob_operator.api.status import AttemptDependency, Phase, SlurmJobStatus
from slurmjob_operator.core.finality import is_final

AFTER_OK = "afterok"
#: How far a cycle is looked for (upstreams of upstreams), and how many SlurmJobs at most.
MAX_DEPTH = 16
MAX_VISITED = 64


def waiting_interval(poll_interval: float) -> float:
    """How often a dependent that waits looks at its upstreams again (besides being woken by
    a change), and the interval over which a namespace's reads of SlurmJobs are bounded."""
    return max(5.0, min(60.0, poll_interval * 5))


@dataclass(frozen=True, slots=True)
class Upstream:
    """What the dependency rules need of an upstream SlurmJob."""

    name: str
    uid: str
    phase: Phase | None
    final: bool
    """A final phase and no retry scheduled: it will not change any more."""
    attempt: int | None = None
    job_id: int | None = None
    """The current attempt's Slurm job while it is queued or running (confirmed)."""
    same_cluster: bool = True
    """The current attempt runs where the dependent would (a Slurm dependency is possible)."""
    depends_on: tuple[str, ...] = ()


def upstream_of(
    name: str, uid: str, status: SlurmJobStatus, depends_on: Sequence[str], same_cluster: bool
) -> Upstream:
    attempt = status.current_attempt
    phase = status.phase
    final = is_final(status)
    active = (
        attempt is not None
        and attempt.job_id is not None
        and attempt.confirmed
        and phase in (Phase.QUEUED, Phase.RUNNING)
    )
    return Upstream(
        name=name,
        uid=uid,
        phase=phase,
        final=final,
        attempt=attempt.number if attempt is not None else None,
        job_id=attempt.job_id if active and attempt is not None else None,
        same_cluster=same_cluster,
        depends_on=tuple(depends_on),
    )


def satisfied(condition: DependencyCondition, phase: Phase | None) -> bool:
    """Whether a final upstream phase satisfies the condition."""
    if condition is DependencyCondition.SUCCEEDED:
        return phase is Phase.SUCCEEDED
    if condition is DependencyCondition.FAILED:
        return phase in (Phase.FAILED, Phase.CANCELLED)
    return phase is not None  # any final phase: Unknown too, when Slurm lost the job


class Kind(Enum):
    READY = "ready"  # submit now, with `slurm` as the Slurm dependencies
    WAIT = "wait"  # not yet
    FAIL = "fail"  # can never be satisfied


@dataclass(frozen=True)
class Resolution:
    kind: Kind
    message: str = ""
    slurm: tuple[AttemptDependency, ...] = field(default=())


def _phase(upstream: Upstream) -> str:
    return upstream.phase.value if upstream.phase is not None else "new"


def resolve(
    deps: Sequence[Dependency],
    upstreams: Mapping[str, Upstream | None],
    *,
    slurm_allowed: bool = True,
    unread: Collection[str] = (),
) -> Resolution:
    """What to do with a dependent that has submitted nothing yet. `slurm_allowed`: False
    where Slurm cancels a job whose dependency failed (DependencyParameters=
    kill_invalid_depend): an upstream that may still be retried is then waited for here.
    `unread`: upstreams that could not be read now (neither delivered by the watch nor read,
    the namespace's reads being spent): waited for, never taken as missing."""
    waits: list[str] = []
    slurm: list[AttemptDependency] = []
    for dep in deps:
        up = upstreams.get(dep.name)
        if dep.name in unread:
            waits.append(f"SlurmJob {dep.name} is not read yet (too many reads in the namespace)")
            continue
        if up is None:
            waits.append(f"SlurmJob {dep.name} does not exist")
            continue
        if up.final:
            if not satisfied(dep.condition, up.phase):
                return Resolution(
                    Kind.FAIL,
                    f"SlurmJob {dep.name} ended {_phase(up)} (after its retries); this job "
                    f"needed it {dep.condition.value}",
                )
            continue
        if (
            slurm_allowed
            and dep.condition is DependencyCondition.SUCCEEDED
            and up.job_id is not None
            and up.attempt is not None
            and up.same_cluster
        ):
            slurm.append(
                AttemptDependency(
                    name=dep.name, uid=up.uid, attempt=up.attempt, job_id=up.job_id, type=AFTER_OK
                )
            )
            continue
        waits.append(f"SlurmJob {dep.name} is {_phase(up)}")
    if waits:
        return Resolution(Kind.WAIT, "waiting for dependencies: " + "; ".join(waits))
    return Resolution(Kind.READY, "", tuple(slurm))


def slurm_dependency(records: Sequence[AttemptDependency]) -> str | None:
    """Slurm's `dependency` value: every record must hold (`,` is AND); None for none."""
    if not records:
        return None
    return ",".join(f"{r.type}:{r.job_id}" for r in records)


class Action(Enum):
    NOTHING = "nothing"
    UPDATE = "update"  # give Slurm the new dependency (the upstream was retried)
    FAIL = "fail"  # cancel the dependent's job: an upstream ended failed for good


@dataclass(frozen=True)
class Repoint:
    action: Action
    records: tuple[AttemptDependency, ...] = ()
    message: str = ""


def repoint(
    recorded: Sequence[AttemptDependency], upstreams: Mapping[str, Upstream | None]
) -> Repoint:
    """What a dependent whose job waits in Slurm on `recorded` needs now.

    An upstream that is gone or was replaced (another uid) changes nothing: its job stays
    named, and Slurm keeps the dependent pending (a person deleted the upstream)."""
    new: list[AttemptDependency] = []
    moved: list[str] = []
    for record in recorded:
        up = upstreams.get(record.name)
        if up is None or up.uid != record.uid:
            new.append(record)
            continue
        if up.final and not satisfied(DependencyCondition.SUCCEEDED, up.phase):
            return Repoint(
                Action.FAIL,
                message=(
                    f"SlurmJob {record.name} ended {_phase(up)} (after its retries); this job "
                    f"needed it {DependencyCondition.SUCCEEDED.value}"
                ),
            )
        if up.final and up.attempt is not None and up.attempt != record.attempt:
            # It succeeded in a later attempt before the dependent was repointed: the job
            # Slurm waits on failed, so the dependency is the operator's to drop.
            moved.append(f"{record.name} succeeded (attempt {up.attempt})")
            continue
        if (
            up.job_id is not None
            and up.attempt is not None
            and up.attempt > record.attempt
            and up.same_cluster
        ):
            new.append(record.model_copy(update={"attempt": up.attempt, "job_id": up.job_id}))
            moved.append(f"{record.name} attempt {up.attempt} (Slurm job {up.job_id})")
            continue
        new.append(record)
    if not moved:
        return Repoint(Action.NOTHING, tuple(recorded))
    return Repoint(Action.UPDATE, tuple(new), "now depends on " + ", ".join(moved))


def find_cycle(start: str, graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A path start -> ... -> start through `graph` (name -> the names it depends on), or None.
    Depth-first, iterative, bounded by the graph given (the caller bounds what it reads)."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt not in seen and len(path) <= MAX_DEPTH:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None
