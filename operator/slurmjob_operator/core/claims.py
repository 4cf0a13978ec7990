"""Where a status value becomes something a decision may use.

Anyone who may write `slurmjobs/status` writes any of it, so the values the operator decides
on are taken from a status only here, each recomputed from what the operator owns (the spec,
the tenants file, its own storage, Slurm's answers read in the step) or clamped to what it
can verify. The fields are marked `api.claim.Claim` in the models; a test scans the package
for a read of a marked field anywhere but here (`tests/unit/test_claims_scan.py`).

- the next attempt's number: clamped, one past the highest of the status's numbers and the
  attempt directories the operator made (`storage.ledger`), which the status cannot roll back;
- the retry, ignore, probe and segment budgets: each counted from the status (a rewrite can
  move attempts between them) under one cap on every attempt together, counted as above;
- a chain's segments and time against `maxSegments` and the site's (or tenant's) maximum:
  clamped, the chain's attempts as counted above, each at its full segment time;
- `Finished`'s time (TTL): clamped, never later than the first time this process saw the
  SlurmJob final, nor than now;
- `attempts[].cluster`: recomputed for routing (`spec.cluster`, the tenant's default, the
  first cluster); a claim that disagrees leaves the resource unfollowed, and a deletion looks
  on both clusters;
- finality on deletion: not used, the deletion looks for the resource's live jobs by name;
- an upstream's job id: verified, read from Slurm and proven the upstream's attempt's job
  before it goes into `afterok`;
- the probe's keys: recomputed from the tenant and the cluster (`core.probe.probe_keys`);
  what else an attempt's probe record says steers only its own job (`probe_of`).

Values a tenant can still move (the split between budgets, the times within the chain's own
`totalTime`) stay within what its own spec could have asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from slurmjob_operator.api.probestatus import AttemptProbe
from slurmjob_operator.api.segmentstatus import AttemptSegment
from slurmjob_operator.api.status import Attempt, Condition, SlurmJobStatus, get_condition
from slurmjob_operator.api.walltime import WalltimeSpec
from slurmjob_operator.core.finality import FINISHED, is_final
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.times import parse_rfc3339

#: Attempts that never ran a job (a submission proven absent or declared lost, a segment
#: evicted while queued) a resource may make beyond its budgets.
NEVER_RAN_ALLOWANCE = 16
#: New attempts Kueue's evictions (preemption, a deactivated Workload) may add to a queued
#: SlurmJob's.
EVICTION_ALLOWANCE = 64
#: Attempts an Ignore retry rule may add on top of the retry limit (`core.retries`), so a
#: rule cannot loop forever.
MAX_IGNORED = 10


class BudgetSpent(Exception):
    """No further attempt: every attempt the budgets allow was made (AttemptsExhausted)."""


class ChainSpent(BudgetSpent):
    """No further segment: the chain is spent, counted from what the operator verified
    (WalltimeExhausted)."""


def highest_number(status: SlurmJobStatus) -> int:
    """The highest attempt number the status names (0: none)."""
    return max((a.number for a in status.attempts), default=0)


def next_attempt(status: SlurmJobStatus, made: int) -> int:
    """The next attempt's number: one past the highest of the status's attempts and of the
    attempt directories the operator made (`made`, `storage.ledger`). A status shortened
    by hand can therefore neither reuse a number (its directory, its job name) nor win a
    budget back."""
    return max(highest_number(status), made) + 1


#: The highest attempt number the operator could ever make: above every cap a spec can reach
#: (`attempt_cap` at most 1,121: retry.limit 20, probe attempts 10, maxSegments 1,000, under
#: Kueue). A number past it, in a status or a directory name, was never the operator's.
ATTEMPT_NUMBER_MAX = 2048


def made_numbers(status: SlurmJobStatus, made: int) -> range:
    """The attempt numbers the operator may have made for a resource (whose jobs a deletion
    looks for), bounded whatever a status or a planted directory name claims."""
    return range(1, min(next_attempt(status, made), ATTEMPT_NUMBER_MAX + 1))


def attempt_cap(
    retry_limit: int, probe_attempts: int, walltime: WalltimeSpec | None, *, queued: bool = False
) -> int:
    """Every attempt a resource may make: the first, its retries, the ignored ones, the
    probe's, a chain's segments, the never-ran allowance, and Kueue's evictions where it is
    `queued` (under Kueue)."""
    segments = walltime.max_segments if walltime is not None else 0
    evictions = EVICTION_ALLOWANCE if queued else 0
    return (
        1 + retry_limit + MAX_IGNORED + probe_attempts + segments + NEVER_RAN_ALLOWANCE + evictions
    )


def over_cap(number: int, cap: int) -> str | None:
    """Why attempt `number` may not be made, or None."""
    if number <= cap:
        return None
    return (
        f"attempt {number} would pass the {cap} attempts the retry limit, the ignored "
        f"retries ({MAX_IGNORED}), the probe's attempts, the walltime segments, "
        f"{NEVER_RAN_ALLOWANCE} attempts that never ran and Kueue's evictions "
        f"({EVICTION_ALLOWANCE}, under Kueue) add up to (counted from the attempt directories "
        "the operator made)"
    )


def never_ran(attempt: Attempt) -> bool:
    """Whether an attempt's job never ran: no job (its submission proven lost or declared
    lost), or last seen pending (evicted or cancelled while queued)."""
    if attempt.job_id is None or attempt.proven_absent_at or attempt.declared_lost:
        return True
    return attempt.started_at is None and attempt.native_state in (None, "PENDING")


def segment_of(attempt: Attempt) -> AttemptSegment | None:
    """An attempt's walltime segment record as written. Its index names the next segment
    (for the program) and its checkpoint digest decides NoProgress, both the chain's own
    business; what bounds the chain is `chain_room`, from verified counts."""
    return attempt.segment


def probe_of(attempt: Attempt) -> AttemptProbe | None:
    """An attempt's collective probe as the status shows it. Its outcome only steers this
    job's own path (whether its record is taken, a probe retry) and its blamed nodes only the
    message: the cache and avoid keys are made again from the resource
    (`core.probe.probe_keys`), the nodes excluded come from the tenant's avoid list, and the
    probe's retries fall under `over_cap`."""
    return attempt.probe


def action_of(attempt: Attempt) -> str | None:
    """What an attempt's record says followed it (Retry, Ignore, ProbeRetry, Segment, Fail).
    The budgets counted from it are the spec's own; `over_cap` bounds them all together."""
    return attempt.retry_action


@dataclass(frozen=True)
class ChainLimit:
    """The longest a chain may run by the site's word (`SLURMJOB_MAX_TOTAL_TIME`, or a
    tenant's lower `maxTotalTime`), and whose word it is."""

    minutes: int
    whose: str


def chain_room(
    walltime: WalltimeSpec,
    attempts: Sequence[Attempt],
    number: int,
    full_minutes: int,
    limit: ChainLimit,
) -> int | str:
    """The most minutes segment attempt `number` may be given, or why none (the chain is
    spent).

    Counted from what the operator verified: the attempts made before this one (`number` is
    `next_attempt`'s), less the never-ran attempts the status claims (at most the
    allowance), each at its full segment time. So a status rewritten to fewer or shorter
    segments runs the chain no longer than the site's (or tenant's) maximum and no more
    segments than `maxSegments`; the chain's own `totalTime` is still counted from the
    status's times by `core.segments` (a rewrite there gains no more than the spec could
    have asked for)."""
    made = number - 1
    repeats = sum(1 for a in attempts if a.segment is not None and never_ran(a))
    ran = max(made - min(repeats, NEVER_RAN_ALLOWANCE), 0)
    claimed = max((a.segment.index + 1 for a in attempts if a.segment is not None), default=0)
    if max(ran, claimed) >= walltime.max_segments:
        return (
            f"the chain ran its maxSegments ({walltime.max_segments}) segments "
            f"({made} attempts made)"
        )
    left = limit.minutes - ran * full_minutes
    if left <= 0:
        return (
            f"the chain's {ran} segments of up to {full_minutes} minutes may have run "
            f"{ran * full_minutes} minutes, {limit.whose} of {limit.minutes} minutes"
        )
    return left


def finished_at(
    status: SlurmJobStatus, first_seen: datetime | None, now: datetime
) -> datetime | None:
    """When the SlurmJob finished, for its TTL: `Finished=True`'s transition time on a final
    status, never later than `first_seen` (when this process first saw it final; `now` when
    it has not yet) nor than `now`. A time the status does not carry, or that does not
    parse, is `first_seen`: a status cannot stop the clock."""
    if not is_final(status):
        return None
    bound = min(first_seen or now, now)
    finished = get_condition(status.conditions, FINISHED)
    if finished is None or finished.status != "True":
        return bound
    try:
        claimed = parse_rfc3339(finished.last_transition_time)
    except ValueError:
        return bound
    return bound if claimed is None else min(claimed, bound)


@dataclass(frozen=True)
class Placement:
    """Where a resource belongs and what its current attempt claims.

    `home`: its spec's cluster, its tenant's default, else the first cluster (the first its
    tenant may use); `fallback`: `home` came from neither the spec nor the tenant;
    `claimed`: the cluster the current attempt's record names (an unnamed one: the cluster
    a one-cluster release's attempts belong to), None without an attempt or when it names
    none that can be told."""

    home: str
    fallback: bool
    claimed: str | None
    attempted: bool
    unnamed: bool = False

    @property
    def followed_on(self) -> str | None:
        """The cluster whose part follows the resource, None for none: `home`, or, for an
        attempt that names no cluster (a one-cluster release's), the cluster such attempts
        belong to where neither the spec nor the tenant says otherwise (an upgrade to
        several clusters); an attempt that names another cluster is followed by none (one
        part's lookups would call another's job lost)."""
        if not self.attempted or self.claimed == self.home:
            return self.home
        if self.fallback and self.unnamed and self.claimed is not None:
            return self.claimed
        return None

    @property
    def looked_on(self) -> tuple[str, ...]:
        """The clusters a deletion looks for the resource's live jobs on: where it belongs
        and where its attempt claims to be, whichever is right."""
        if self.claimed is None or self.claimed == self.home:
            return (self.home,)
        return (self.home, self.claimed)


def placed(
    clusters: Clusters,
    status: SlurmJobStatus,
    spec_cluster: str | None,
    tenant_default: str | None,
    tenant_clusters: Collection[str] | None = None,
) -> Placement:
    """Where a resource belongs by its spec and its tenant (a tenant kept off the first
    cluster goes to the first it may use, rather than being refused for a spec.cluster its
    user never wrote), and what its attempt claims (`Placement`)."""
    if tenant_default is None and tenant_clusters:
        allowed = [c for c in tenant_clusters if c in clusters.names]
        if allowed and clusters.default not in allowed:
            tenant_default = allowed[0]
    home = clusters.choose(spec_cluster, tenant_default)
    attempt = status.current_attempt
    claimed: str | None = None
    if attempt is not None:
        named = attempt.cluster if attempt.cluster is not None else clusters.unnamed
        claimed = named if named in clusters.names else None
    return Placement(
        home,
        fallback=spec_cluster is None and tenant_default is None,
        claimed=claimed,
        attempted=attempt is not None,
        unnamed=attempt is not None and attempt.cluster is None,
    )


def transition_time(condition: Condition) -> str:
    """When a condition last changed, as the status says (for display; the TTL takes
    `finished_at`)."""
    return condition.last_transition_time


def claimed_cluster(attempt: Attempt) -> str | None:
    """The cluster an attempt's record names, for display and for looking on that cluster
    too (never for routing a decision)."""
    return attempt.cluster
