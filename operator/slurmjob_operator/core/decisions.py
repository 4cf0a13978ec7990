"""The controller's remaining choices, as pure functions: what a failed submit step becomes,
whether spec.suspend gates or holds, which of the jobs found by name is adopted, whether a
Slurm job is the attempt's own before anything is folded from it or done to it, and whether a
deletion's last tails would be read.

The controller only classifies what happened (an exception, a lookup result) and carries out
the returned transition and plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from typing import Literal

from slurmjob_operator.api.status import Attempt, Phase, SlurmJobStatus, get_condition
from slurmjob_operator.core import naming
from slurmjob_operator.core.following import suspension
from slurmjob_operator.core.jobview import JobSource, SlurmJobView, by_leader, job_of, leader
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import (
    DECLARE_LOST_ANNOTATION,
    FAILED,
    SUSPENDED,
    image_failed,
    image_pulling,
    invalid_spec,
    not_submitted,
    rejected,
    unconfirmed,
    waiting,
)
from slurmjob_operator.core.transition import Transition

# -- a failed submit step -------------------------------------------------------------------


class Failure(StrEnum):
    """Why a submit step stopped, as the controller classifies it."""

    # Before the attempt is recorded: nothing was sent.
    SPEC_INVALID = "SpecInvalid"  # the spec, its rendering or its preflight
    TENANT_UNKNOWN = "TenantUnknown"  # tenancy is on and the namespace is no tenant's
    RUNTIME_INVALID = "RuntimeInvalid"  # the runtime artifact's magic or checksum
    SECRET_MISSING = "SecretMissing"  # noqa: S105 (a failure class, not a secret)
    LIMIT_EXCEEDED = "LimitExceeded"  # the request cannot fit the cluster's limits
    PROBE_EXHAUSTED = "ProbeExhausted"  # it can, but not without the nodes the probe blamed
    PARTITION_UNAVAILABLE = "PartitionUnavailable"  # the partition takes no jobs now
    SLURM_REFUSED_CREDENTIALS = "SlurmRefusedCredentials"  # while connecting
    SLURM_UNREACHABLE = "SlurmUnreachable"  # while connecting
    STAGING_NOT_WRITABLE = "StagingNotWritable"  # the site's staging tree refuses the attempt
    ATTEMPTS_SPENT = "AttemptsSpent"  # every attempt the spec's budgets allow was made
    CHAIN_SPENT = "ChainSpent"  # a walltime chain's verified segments or time are spent
    IMAGE_PULLING = "ImagePulling"  # the image cache imports the spec's image: wait
    IMAGE_PULL_FAILED = "ImagePullFailed"  # its import failed for good
    ARTIFACT_VERIFYING = "ArtifactVerifying"  # a job verifies the registry artifact: wait
    ARTIFACT_VERIFY_FAILED = "ArtifactVerifyFailed"  # its verification failed for good
    # After the attempt is recorded.
    REJECTED = "Rejected"  # Slurm refused the job description
    AMBIGUOUS = "Ambiguous"  # the POST may have created a job
    SEND_REFUSED_CREDENTIALS = "SendRefusedCredentials"  # nothing was created
    SEND_FAILED = "SendFailed"  # staging or the request failed before Slurm had it
    SEND_STAGING_NOT_WRITABLE = "SendStagingNotWritable"  # the tree changed after the check


class Retry(Enum):
    NEVER = "never"  # final until the spec changes
    BACKOFF = "backoff"  # a few poll intervals
    POLL = "poll"  # one poll interval (an adoption lookup)
    GROWING = "growing"  # the backoff, doubled after each failure in a row (capped)


#: The label values of the submissions counter.
SubmissionResult = Literal["accepted", "rejected", "ambiguous", "transient", "auth"]


@dataclass(frozen=True)
class FailurePlan:
    reason: Reason
    retry: Retry
    metric: SubmissionResult | None = None  # the submissions counter's label, if counted
    discard_attempt: bool = False  # remove the attempt's staged files
    cancel_created: bool = False  # Slurm may have made a record despite refusing: cancel it


#: One row per failure: what it becomes. The transition is built by `failed_step`.
FAILURES: Mapping[Failure, FailurePlan] = {
    Failure.SPEC_INVALID: FailurePlan(Reason.INVALID_SPEC, Retry.NEVER),
    Failure.TENANT_UNKNOWN: FailurePlan(Reason.TENANT_UNKNOWN, Retry.NEVER),
    Failure.RUNTIME_INVALID: FailurePlan(
        Reason.RUNTIME_ARTIFACT_INVALID, Retry.NEVER, metric="rejected"
    ),
    Failure.SECRET_MISSING: FailurePlan(Reason.SECRET_NOT_FOUND, Retry.BACKOFF),
    Failure.LIMIT_EXCEEDED: FailurePlan(Reason.LIMIT_EXCEEDED, Retry.NEVER, metric="rejected"),
    Failure.PROBE_EXHAUSTED: FailurePlan(Reason.PROBE_FAILED, Retry.NEVER, metric="rejected"),
    Failure.PARTITION_UNAVAILABLE: FailurePlan(Reason.PARTITION_UNAVAILABLE, Retry.POLL),
    Failure.IMAGE_PULLING: FailurePlan(Reason.IMAGE_PULLING, Retry.POLL),
    Failure.IMAGE_PULL_FAILED: FailurePlan(
        Reason.IMAGE_PULL_FAILED, Retry.NEVER, metric="rejected"
    ),
    Failure.ARTIFACT_VERIFYING: FailurePlan(Reason.ARTIFACT_VERIFYING, Retry.POLL),
    Failure.ARTIFACT_VERIFY_FAILED: FailurePlan(
        Reason.ARTIFACT_VERIFY_FAILED, Retry.NEVER, metric="rejected"
    ),
    Failure.SLURM_REFUSED_CREDENTIALS: FailurePlan(Reason.SLURM_AUTH_FAILED, Retry.BACKOFF),
    Failure.SLURM_UNREACHABLE: FailurePlan(Reason.SLURM_UNAVAILABLE, Retry.BACKOFF),
    Failure.STAGING_NOT_WRITABLE: FailurePlan(Reason.STAGING_NOT_WRITABLE, Retry.GROWING),
    Failure.ATTEMPTS_SPENT: FailurePlan(Reason.ATTEMPTS_EXHAUSTED, Retry.NEVER),
    Failure.CHAIN_SPENT: FailurePlan(Reason.WALLTIME_EXHAUSTED, Retry.NEVER),
    Failure.REJECTED: FailurePlan(
        Reason.SUBMIT_REJECTED,
        Retry.NEVER,
        metric="rejected",
        discard_attempt=True,
        cancel_created=True,
    ),
    Failure.AMBIGUOUS: FailurePlan(Reason.SUBMISSION_UNCONFIRMED, Retry.POLL, metric="ambiguous"),
    Failure.SEND_REFUSED_CREDENTIALS: FailurePlan(
        Reason.SLURM_AUTH_FAILED, Retry.BACKOFF, metric="auth", discard_attempt=True
    ),
    Failure.SEND_FAILED: FailurePlan(
        Reason.SUBMIT_FAILED, Retry.BACKOFF, metric="transient", discard_attempt=True
    ),
    Failure.SEND_STAGING_NOT_WRITABLE: FailurePlan(
        Reason.STAGING_NOT_WRITABLE, Retry.GROWING, metric="transient", discard_attempt=True
    ),
}

#: The longest a growing retry waits: a fix is noticed within this much.
GROWING_RETRY_CAP = 300.0


def growing_delay(earlier: int, base: float) -> float:
    """How long to wait before trying again a failure that only the site can fix, after
    `earlier` such failures in a row: `base`, then twice as long each time, at most
    GROWING_RETRY_CAP (the condition stays as it is meanwhile: one Event, no flapping)."""
    factor: int = 2 ** min(max(earlier, 0), 16)
    return min(GROWING_RETRY_CAP, base * factor)


def failed_step(
    status: SlurmJobStatus,
    failure: Failure,
    messages: Sequence[str],
    generation: int | None,
    now: datetime,
) -> tuple[Transition, FailurePlan]:
    """The transition a failed submit step writes, and what else the controller must do."""
    plan = FAILURES[failure]
    message = "; ".join(messages)
    if failure in (
        Failure.SPEC_INVALID,
        Failure.TENANT_UNKNOWN,
        Failure.RUNTIME_INVALID,
        Failure.LIMIT_EXCEEDED,
        Failure.PROBE_EXHAUSTED,
        Failure.ATTEMPTS_SPENT,
        Failure.CHAIN_SPENT,
    ):
        return invalid_spec(status, messages, generation, now, plan.reason), plan
    if failure in (Failure.IMAGE_PULLING, Failure.ARTIFACT_VERIFYING):
        return image_pulling(status, message, generation, now, plan.reason), plan
    if failure in (Failure.IMAGE_PULL_FAILED, Failure.ARTIFACT_VERIFY_FAILED):
        return image_failed(status, message, generation, now, plan.reason), plan
    if failure is Failure.REJECTED:
        return rejected(status, message, generation, now), plan
    if failure is Failure.AMBIGUOUS:
        return unconfirmed(status, message, generation, now), plan
    if plan.discard_attempt:
        return not_submitted(status, plan.reason, message, generation, now), plan
    return waiting(status, plan.reason, message, generation, now), plan


#: Refusals that stand until the spec changes, though what they were judged on may change
#: (the cluster's limits, an upstream SlurmJob deleted or recreated): not judged again on a
#: restart, a resume or a label edit, only for a new generation (which, the spec being
#: immutable but for suspend and ttlSecondsAfterFinished, only an edit of those makes).
STANDING_REFUSALS = frozenset({Reason.LIMIT_EXCEEDED, Reason.DEPENDENCY_FAILED})


def settled_refusal(status: SlurmJobStatus, generation: int | None) -> bool:
    """Nothing was submitted and a standing refusal ended it for this generation."""
    failed = get_condition(status.conditions, FAILED)
    return (
        status.phase is Phase.FAILED
        and not status.attempts
        and failed is not None
        and failed.status == "True"
        and failed.reason in STANDING_REFUSALS
        and failed.observed_generation == generation
    )


def awaits_upstream(status: SlurmJobStatus) -> bool:
    """A job queued in Slurm behind its upstreams' jobs (`Attempt.dependencies`): to be
    repointed or cancelled as they change."""
    attempt = status.current_attempt
    return (
        attempt is not None
        and bool(attempt.dependencies)
        and attempt.started_at is None
        and status.phase is Phase.QUEUED
    )


# -- spec.suspend ---------------------------------------------------------------------------


def gate(
    status: SlurmJobStatus, wanted: bool, generation: int | None, now: datetime
) -> tuple[bool, Transition | None]:
    """Before a submit: (blocked, what to write). Suspended blocks; lifting it says so."""
    if wanted:
        text = "spec.suspend is true: nothing is submitted"
        return True, suspension(status, True, Reason.SUSPENDED, text, generation, now)
    cond = get_condition(status.conditions, SUSPENDED)
    if cond is not None and cond.status == "True":
        text = "spec.suspend is false"
        return False, suspension(status, False, Reason.RESUMED, text, generation, now)
    return False, None


class Hold(StrEnum):
    NOTHING = "Nothing"
    HOLD = "Hold"
    RELEASE = "Release"
    CANNOT_HOLD = "CannotHold"  # Slurm holds only pending jobs


def hold_action(status: SlurmJobStatus, wanted: bool) -> Hold:
    """For a submitted job: what spec.suspend asks of Slurm now."""
    cond = get_condition(status.conditions, SUSPENDED)
    held = cond is not None and cond.status == "True"
    attempt = status.current_attempt
    if wanted == held or attempt is None or attempt.job_id is None:
        return Hold.NOTHING
    if wanted and status.phase is not Phase.QUEUED:
        return Hold.CANNOT_HOLD
    return Hold.HOLD if wanted else Hold.RELEASE


def hold_transition(
    status: SlurmJobStatus, action: Hold, generation: int | None, now: datetime
) -> Transition:
    """What to write once `action` (not NOTHING) was carried out."""
    attempt = status.current_attempt
    job = attempt.job_id if attempt is not None else None
    if action is Hold.CANNOT_HOLD:
        text = (
            "spec.suspend is true but the Slurm job already left the queue; Slurm holds "
            "only pending jobs, so it keeps running"
        )
        return suspension(status, False, Reason.NOT_HELD, text, generation, now)
    held = action is Hold.HOLD
    verb = "held" if held else "released"
    text = f"Slurm job {job} {verb} (spec.suspend is {str(held).lower()})"
    reason = Reason.HELD if held else Reason.RELEASED
    return suspension(status, held, reason, text, generation, now)


# -- adoption -------------------------------------------------------------------------------


class AdoptAction(StrEnum):
    ADOPT = "Adopt"  # keep `keep`, cancel `duplicates`
    WAIT = "Wait"  # not visible yet: look again later
    RESTART = "Restart"  # never sent (its staging never finished): submit it again


@dataclass(frozen=True)
class Adoption:
    action: AdoptAction
    keep: SlurmJobView | None = None
    duplicates: tuple[SlurmJobView, ...] = ()
    #: Jobs carrying the attempt's name and comment but run by a Slurm user the resource may
    #: not own: never adopted, never cancelled (told as a mismatch).
    impostors: tuple[SlurmJobView, ...] = ()


def declared_lost_now(attempt: Attempt, annotations: Mapping[str, str]) -> bool:
    """Whether a person declared this very attempt lost (the annotation names its number)."""
    return annotations.get(DECLARE_LOST_ANNOTATION) == str(attempt.number)


def carries(job: SlurmJobView, uid: str, attempt: Attempt) -> bool:
    """Whether a job's comment names the resource's uid and the attempt.

    An accounting record's comment may be cut or missing (slurmdbd keeps it only with
    `AccountingStoreFlags=job_comment`): one without a readable identity is taken on its
    unique name alone. The controller keeps the comment the operator submitted, so a live
    job without it is not ours."""
    ident = naming.parse_comment(job.comment)
    if ident is None:
        return job.source is JobSource.ACCOUNTING
    return ident.uid == uid and ident.attempt == attempt.number


def belongs(job: SlurmJobView, uid: str, attempt: Attempt) -> bool:
    """Whether `job` is this attempt's job: it has the attempt's job name, its comment
    carries the attempt (`carries`) and, once the attempt has a job id, it is that job (a
    heterogeneous component by its leader's id, an array task by its array's). A job id
    alone is only a claim: ids are reused, and a status `jobId` can be written by anyone with
    status write access."""
    if job.name != attempt.job_name or not carries(job, uid, attempt):
        return False
    return attempt.job_id is None or job_of(job) == attempt.job_id


def stranger(views: Sequence[SlurmJobView], uid: str, attempt: Attempt) -> SlurmJobView | None:
    """The first of a job's views that is not this attempt's (None: all are)."""
    return next((view for view in views if not belongs(view, uid, attempt)), None)


#: The Warning Event of a job that is not the attempt's; nothing is folded or cancelled.
IDENTITY_MISMATCH = "JobIdentityMismatch"


def mismatch_text(job: SlurmJobView, uid: str, attempt: Attempt, refused: str) -> str:
    """The Event text of a job that is not the attempt's. It names what this attempt expects
    and what differs, but not the other job's name or comment: they may name another tenant's
    namespace and resource (the operator's log has both identities)."""
    differs: list[str] = []
    if job.name != attempt.job_name:
        differs.append("its job name differs")
    ident = naming.parse_comment(job.comment)
    if ident is None:
        if not carries(job, uid, attempt):
            differs.append("it has no slurmjob.io comment")
    elif ident.uid == uid:
        if ident.attempt != attempt.number:
            differs.append(f"its comment names attempt {ident.attempt} of this resource")
    else:
        differs.append("its comment names another resource")
    if attempt.job_id is not None and job_of(job) != attempt.job_id:
        differs.append(f"Slurm answered for job {job_of(job)}")
    return (
        f"Slurm job {attempt.job_id} is not attempt {attempt.number}'s job "
        f"({'; '.join(differs) or 'it does not match'}): expected job name "
        f"{attempt.job_name!r} and a comment carrying uid {uid} attempt {attempt.number}; "
        f"{refused}"
    )


def owned(job: SlurmJobView, owners: frozenset[str]) -> bool:
    """Whether the job's Slurm user is one the resource may own. An accounting record that
    shows no user is taken on its identity alone (nothing can be changed through it)."""
    if job.user is None:
        return job.source is JobSource.ACCOUNTING
    return job.user in owners


def adoption(
    found: Sequence[SlurmJobView],
    uid: str,
    attempt: Attempt,
    *,
    staged: bool,
    owners: frozenset[str] | None = None,
) -> Adoption:
    """Which of the jobs found by the attempt's name to keep. `staged`: the attempt's script
    is on the storage (it is written last, before the POST: without it nothing was sent).
    `owners`: the Slurm users the resource may own (None: any); a job of another user is an
    impostor whatever it carries (job names and comments can be predicted and copied)."""
    carrying = [job for job in found if belongs(job, uid, attempt)]
    mine = [job for job in carrying if owners is None or owned(job, owners)]
    impostors = tuple(job for job in carrying if job not in mine)
    # One entry per job, as its leader component (a het job's components share a name);
    # the oldest is kept.
    leaders = sorted(
        (leader(views) for views in by_leader(mine).values()),
        key=lambda j: (j.sluid or "", j.job_id),
    )
    if leaders:
        return Adoption(AdoptAction.ADOPT, leaders[0], tuple(leaders[1:]), impostors)
    if attempt.staging_dir and not staged:
        return Adoption(AdoptAction.RESTART, impostors=impostors)
    return Adoption(AdoptAction.WAIT, impostors=impostors)


# -- deletion ---------------------------------------------------------------------------------


def tails_outlive_deletion(finalizers: Sequence[str], own: str, *, kept: bool = False) -> bool:
    """Whether the last log tails written into a deleted resource's status would be read: only
    while something besides the operator's finalizer `own` holds it (another controller's
    finalizer, or a foreground deletion's while it waits), or when the store keeps resources
    after their deletion (`kept`: the local runner's files). Otherwise it is gone the moment
    the operator lets go, and the write (a read, the log files' read, a status write, held by
    every deletion of a mass delete: the 10,000 bench's peak, docs/benchmarks.md) would be
    read at most by a watcher's last event."""
    return kept or any(name != own for name in finalizers)
