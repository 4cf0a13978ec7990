"""Every condition the operator writes and every reason it writes them with, declared once.

The transitions in `reconcile` take their types and reasons from here, `gen.docs` prints this
table as the reference's conditions section, and `tests/unit/test_reasons.py` drives every
transition to prove the two agree (nothing written that is not declared, nothing declared that
no transition writes).
"""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    SUBMITTED = "Submitted"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    READY = "Ready"
    SUSPENDED = "Suspended"
    SLURM_REACHABLE = "SlurmReachable"
    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    FINISHED = "Finished"
    PROBE_PASSED = "ProbePassed"
    IMAGE_READY = "ImageReady"


CONDITION_MEANINGS: dict[ConditionType, str] = {
    ConditionType.SUBMITTED: (
        "Whether the current attempt is known to Slurm: True once Slurm gave (or showed) its "
        "job id, Unknown while the POST is in flight or its answer was lost, False when "
        "nothing was submitted."
    ),
    ConditionType.RUNNING: "True while the Slurm job runs (or holds its allocation).",
    ConditionType.SUCCEEDED: "Written when the job is final: True when it completed with exit 0.",
    ConditionType.FAILED: (
        "True when the job failed, Slurm refused it, the spec is invalid or its namespace "
        "belongs to no tenant; False when a retry is scheduled."
    ),
    ConditionType.READY: (
        "True while the job is healthy (Queued, Running, Succeeded); False on failures, "
        "cancellation, Unknown, an invalid spec, waits and unconfirmed submissions."
    ),
    ConditionType.SUSPENDED: (
        "spec.suspend took effect (nothing submitted, or the queued job held)."
    ),
    ConditionType.SLURM_REACHABLE: (
        "Whether slurmrestd answers the operator's poll with its credentials (written on "
        "followed jobs when that changes). Refused tokens come back as HTTP 500 or 511, so "
        "this condition and its Event are where they show."
    ),
    ConditionType.QUOTA_RESERVED: (
        "Kueue's QuotaReserved on the SlurmJob's Workload (with the kueue.x-k8s.io/queue-name "
        "label only): True once its ClusterQueue reserved the quota, False while it waits "
        "(Kueue's reason and message) and after an eviction gave the quota back."
    ),
    ConditionType.ADMITTED: (
        "Kueue's Admitted on the SlurmJob's Workload: True once admitted (nothing is submitted "
        "to Slurm before), False while it waits or once evicted."
    ),
    ConditionType.EVICTED: (
        "True when Kueue evicted the Workload, with Kueue's reason (Preempted, "
        "InactiveWorkload, PodsReadyTimeout, ...); False once it is admitted again."
    ),
    ConditionType.FINISHED: (
        "True once the job is over for good, on every outcome, with the phase as its reason "
        "(Succeeded, Failed, Cancelled, or Unknown when Slurm lost the job); False on a refusal "
        "an edit decides again (InvalidSpec, LimitExceeded, DependencyFailed) and on a job that "
        "was final and is not any more (NotFinished). `kubectl wait --for=condition=Finished`."
    ),
    ConditionType.IMAGE_READY: (
        "A spec.framework.image only: True once the image cache has the image's entry (the "
        "reference and its digest in the message), False while it is imported (ImagePulling, "
        "the import job's id in the message) or when the import failed (ImagePullFailed). "
        "A runtimeId the site verifies: ArtifactVerified, ArtifactVerifying, ArtifactVerifyFailed."
    ),
    ConditionType.PROBE_PASSED: (
        "The collective probe before the command (GPU jobs on several nodes or GPUs, with a "
        "probe configured for the runtime): True when it passed (the rung and the bus "
        "bandwidth in the message) or a fresh cache entry let the job skip it; False when it "
        "failed on every rung."
    ),
}


class Reason(StrEnum):
    SUBMITTING = "Submitting"
    ACCEPTED = "Accepted"
    ADOPTED = "Adopted"
    QUEUED = "Queued"
    SUBMISSION_UNCONFIRMED = "SubmissionUnconfirmed"
    SUBMIT_INTERRUPTED = "SubmitInterrupted"
    DECLARED_LOST = "DeclaredLost"
    PROVEN_ABSENT = "ProvenAbsent"
    INVALID_SPEC = "InvalidSpec"
    TENANT_UNKNOWN = "TenantUnknown"
    RUNTIME_ARTIFACT_INVALID = "RuntimeArtifactInvalid"
    SECRET_NOT_FOUND = "SecretNotFound"  # noqa: S105 (a reason, not a secret)
    LIMIT_EXCEEDED = "LimitExceeded"
    PARTITION_UNAVAILABLE = "PartitionUnavailable"
    SLURM_AUTH_FAILED = "SlurmAuthFailed"
    SLURM_UNAVAILABLE = "SlurmUnavailable"
    SUBMIT_FAILED = "SubmitFailed"
    SUBMIT_REJECTED = "SubmitRejected"
    JOB_LOST = "JobLost"
    RETRY_SCHEDULED = "RetryScheduled"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    HELD = "Held"
    RELEASED = "Released"
    NOT_HELD = "NotHeld"
    SLURM_ANSWERING = "SlurmAnswering"
    STAGING_NOT_WRITABLE = "StagingNotWritable"
    WAITING_FOR_DEPENDENCY = "WaitingForDependency"
    DEPENDENCY_FAILED = "DependencyFailed"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    EVICTED = "Evicted"
    NOT_FINISHED = "NotFinished"
    PROBE_PASSED = "ProbePassed"
    PROBE_CACHED = "ProbeCached"
    PROBE_FAILED = "ProbeFailed"
    PROBE_RETRY = "ProbeRetry"
    SEGMENT_CONTINUED = "SegmentContinued"
    WALLTIME_EXHAUSTED = "WalltimeExhausted"
    NO_PROGRESS = "NoProgress"
    ATTEMPTS_EXHAUSTED = "AttemptsExhausted"
    IMAGE_PULLING = "ImagePulling"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    IMAGE_CACHED = "ImageCached"
    ARTIFACT_VERIFYING = "ArtifactVerifying"
    ARTIFACT_VERIFY_FAILED = "ArtifactVerifyFailed"
    ARTIFACT_VERIFIED = "ArtifactVerified"


#: What each reason tells a user.
REASON_MEANINGS: dict[Reason, str] = {
    Reason.IMAGE_PULLING: (
        "The image cache imports the image (an import job on the site's CPU partition, its id "
        "in the message); nothing of the SlurmJob is submitted until the entry exists."
    ),
    Reason.IMAGE_PULL_FAILED: (
        "The import failed for good (unknown manifest, access denied, not an image, or "
        "transient failures past the site's retries); nothing of the SlurmJob was submitted."
    ),
    Reason.IMAGE_CACHED: "The image cache has the image: the reference and digest it runs.",
    Reason.ARTIFACT_VERIFYING: (
        "A job of the cache user verifies the runtime's file (its id in the message); waits."
    ),
    Reason.ARTIFACT_VERIFY_FAILED: (
        "The runtime's file failed its verification (the cause and the job's log in the message)."
    ),
    Reason.ARTIFACT_VERIFIED: "Verified once by a job of the cache user: nodes compare its stat.",
    Reason.PROBE_PASSED: "The collective probe passed on the rung the message names.",
    Reason.PROBE_CACHED: (
        "The probe was skipped: a fresh cache entry for the tenant, cluster, partition, "
        "runtime and GPU series names the rung that passed before."
    ),
    Reason.PROBE_FAILED: (
        "The collective probe failed (hung, failed or was too slow) on every rung of the "
        "site's ladder, and no new attempt excluding the nodes it blamed is left (or the "
        "partition has too few nodes without them)."
    ),
    Reason.PROBE_RETRY: (
        "The collective probe failed on every rung and blamed nodes: a new attempt that "
        "excludes them is due now (its own counter; no retry of spec.retry is spent)."
    ),
    Reason.SEGMENT_CONTINUED: (
        "A walltime segment ended by its time limit, with continueExitCode, by preemption or "
        "by a lost node: the next segment is due now (no retry of spec.retry is spent)."
    ),
    Reason.WALLTIME_EXHAUSTED: (
        "The walltime chain spent its totalTime or ran maxSegments segments without a "
        "segment exiting 0 (or, counted from the attempts the operator made, each at its "
        "full segment time, would pass maxSegments or the site's or tenant's maximum)."
    ),
    Reason.ATTEMPTS_EXHAUSTED: (
        "No further attempt: the operator made every attempt the retry limit, the ignored "
        "retries, the probe's attempts, the walltime segments and the allowances for attempts "
        "that never ran and for Kueue's evictions add up to."
    ),
    Reason.NO_PROGRESS: (
        "Two walltime segments in a row ended with nothing under the checkpoint directory "
        "changed: the chain stops rather than run for ever."
    ),
    Reason.SUBMITTING: "The attempt is recorded and its POST is being sent.",
    Reason.ACCEPTED: "slurmrestd answered the POST with the job id.",
    Reason.ADOPTED: "The POST's answer was lost; the job was found by its unique name.",
    Reason.QUEUED: "Slurm has the job.",
    Reason.SUBMISSION_UNCONFIRMED: (
        "The POST may have created a job whose answer was lost: no resubmit until it is "
        "found (or declared lost)."
    ),
    Reason.SUBMIT_INTERRUPTED: (
        "The operator stopped before the attempt's files were complete, so it was never "
        "sent: it is submitted again."
    ),
    Reason.DECLARED_LOST: "A person declared the unconfirmed attempt lost (annotation).",
    Reason.PROVEN_ABSENT: (
        "The unconfirmed attempt was found neither in the controller nor in accounting once "
        "the fencing window had passed, with slurmctld's queue to slurmdbd empty: it was "
        "never created, and the next attempt is submitted without a person."
    ),
    Reason.INVALID_SPEC: "The spec cannot run on this site; the message names the field.",
    Reason.TENANT_UNKNOWN: (
        "The site has a tenants file and the SlurmJob's namespace belongs to no tenant: "
        "nothing is submitted (checked again when the SlurmJob is edited or the operator restarts)."
    ),
    Reason.RUNTIME_ARTIFACT_INVALID: "The runtime artifact is missing or its checksum is wrong.",
    Reason.SECRET_NOT_FOUND: "A referenced Secret or key does not exist (yet).",
    Reason.LIMIT_EXCEEDED: (
        "The request cannot fit the cluster: a partition that does not exist, a timeLimit over "
        "the partition's MaxTime, more nodes, CPUs, memory or GPUs than its nodes have, an "
        "account or QOS accounting does not know. The message names the field and the limit; "
        "nothing was staged or submitted; one that fits is a new SlurmJob (the spec is immutable)."
    ),
    Reason.PARTITION_UNAVAILABLE: (
        "The partition is down, drained or inactive, or its MaxTime (which a walltime "
        "segment's length derives from when spec.walltime.segmentTime is unset) cannot be "
        "read: nothing is submitted until it is up and read."
    ),
    Reason.SLURM_AUTH_FAILED: "slurmrestd refused the operator's credentials.",
    Reason.SLURM_UNAVAILABLE: "slurmrestd could not be reached or failed.",
    Reason.SUBMIT_FAILED: "The POST certainly created no job (nothing was sent); retried.",
    Reason.SUBMIT_REJECTED: "Slurm refused the job description (its words in the message).",
    Reason.JOB_LOST: "Slurm forgot the job and accounting has no record: never resubmitted.",
    Reason.RETRY_SCHEDULED: "The attempt failed and the retry rules give it another.",
    Reason.SUSPENDED: "spec.suspend is true: nothing is submitted.",
    Reason.RESUMED: "spec.suspend is false again before anything was submitted.",
    Reason.HELD: "spec.suspend is true: the queued Slurm job is held.",
    Reason.RELEASED: "spec.suspend is false: the held Slurm job is released.",
    Reason.NOT_HELD: "spec.suspend is true, but the job already left the queue: it runs on.",
    Reason.SLURM_ANSWERING: "slurmrestd answers the poll.",
    Reason.WAITING_FOR_DEPENDENCY: (
        "spec.dependsOn names a SlurmJob that does not exist yet, has no Slurm job to depend on "
        "yet (it waits itself, or a retry is scheduled), or whose condition (Failed, Finished) "
        "can only be told once it is final: nothing is submitted yet."
    ),
    Reason.WAITING_FOR_ADMISSION: (
        "The SlurmJob names a Kueue LocalQueue (label kueue.x-k8s.io/queue-name) and its "
        "Workload is not admitted yet: nothing is submitted to Slurm until it is. The message "
        "is Kueue's."
    ),
    Reason.EVICTED: (
        "Kueue evicted the SlurmJob's Workload (preempted by a higher-priority workload, a "
        "ClusterQueue change, a PodsReady timeout): its Slurm job was cancelled and its quota "
        "given back; the next attempt, not counted against the retry limit, is submitted "
        "once Kueue admits it again."
    ),
    Reason.NOT_FINISHED: (
        "The job was final and is not any more (an edit made its refusal be decided again, a "
        "retry is due): the phase says what it waits for."
    ),
    Reason.DEPENDENCY_FAILED: (
        "An upstream SlurmJob ended in a way that cannot satisfy spec.dependsOn (after its "
        "retries): nothing is submitted, or the job waiting on it in Slurm is cancelled."
    ),
    Reason.STAGING_NOT_WRITABLE: (
        "Pending: a directory on the way to the attempt's staging directory is not the "
        "operator's (or the staging owner's) or does not let it add the attempt; nothing is "
        "submitted, and the operator tries again after its usual wait (5 poll intervals, 1 to "
        "30 s), doubled after each failure up to 5 minutes, with one Event while the message "
        "stays the same. The message names the "
        "directory, its owner and mode, the uid the operator runs as and the one the job runs "
        "as. Failed: the job failed on its node without its standard output ever being "
        "created: Slurm could not open the log files in the staging directory as the job "
        "user. The message names the path, the job user (with the uid Slurm ran it as) and "
        "the directory's owner and mode."
    ),
}

#: A condition whose reason is the one of the phase Slurm's state maps to (`core.states`).
FROM_SLURM = "(from Slurm)"
#: A condition whose reason is Kueue's, from the Workload's own condition.
FROM_KUEUE = "(from Kueue)"
#: `Finished`=True's reason: the final phase itself (Succeeded, Failed, Cancelled, Unknown).
FROM_PHASE = "(the phase)"

#: (condition type, status, reason); the reason is a `Reason` or `FROM_SLURM`.
Written = tuple[str, str, str]

_T, _F, _U = "True", "False", "Unknown"
C = ConditionType
R = Reason

_IMAGE_FAILED = ((C.READY, _F), (C.SUBMITTED, _F), (C.FAILED, _T), (C.IMAGE_READY, _F))

#: Every (condition, status, reason) any transition writes.
WRITTEN: frozenset[Written] = frozenset(
    [
        (C.SUBMITTED, _U, R.SUBMITTING),
        (C.SUBMITTED, _T, R.ACCEPTED),
        (C.SUBMITTED, _T, R.ADOPTED),
        (C.READY, _T, R.QUEUED),
        (C.SUBMITTED, _U, R.SUBMISSION_UNCONFIRMED),
        (C.READY, _F, R.SUBMISSION_UNCONFIRMED),
        (C.SUBMITTED, _F, R.DECLARED_LOST),
        (C.SUBMITTED, _F, R.PROVEN_ABSENT),
        *(
            (cond, _F, reason)
            for cond in (C.SUBMITTED, C.READY)
            for reason in (
                R.SECRET_NOT_FOUND,
                R.PARTITION_UNAVAILABLE,
                R.WAITING_FOR_DEPENDENCY,
                R.WAITING_FOR_ADMISSION,
                R.SLURM_AUTH_FAILED,
                R.SLURM_UNAVAILABLE,
                R.SUBMIT_FAILED,
                R.SUBMIT_INTERRUPTED,
                R.STAGING_NOT_WRITABLE,
            )
        ),
        *(
            (cond, status, reason)
            for reason in (
                R.INVALID_SPEC,
                R.TENANT_UNKNOWN,
                R.RUNTIME_ARTIFACT_INVALID,
                R.LIMIT_EXCEEDED,
                R.DEPENDENCY_FAILED,
                R.ATTEMPTS_EXHAUSTED,
                R.WALLTIME_EXHAUSTED,
            )
            for cond, status in ((C.READY, _F), (C.SUBMITTED, _F), (C.FAILED, _T))
        ),
        *(
            (cond, status, R.SUBMIT_REJECTED)
            for cond, status in (
                (C.SUBMITTED, _F),
                (C.FAILED, _T),
                (C.SUCCEEDED, _F),
                (C.READY, _F),
            )
        ),
        *(
            (cond, _F, reason)
            for reason in (R.IMAGE_PULLING, R.ARTIFACT_VERIFYING)
            for cond in (C.SUBMITTED, C.READY, C.IMAGE_READY)
        ),
        *(
            (cond, status, reason)
            for reason in (R.IMAGE_PULL_FAILED, R.ARTIFACT_VERIFY_FAILED)
            for cond, status in _IMAGE_FAILED
        ),
        (C.IMAGE_READY, _T, R.IMAGE_CACHED),
        (C.IMAGE_READY, _T, R.ARTIFACT_VERIFIED),
        (C.READY, _F, R.JOB_LOST),
        (C.RUNNING, _F, R.JOB_LOST),
        (C.READY, _F, R.RETRY_SCHEDULED),
        (C.READY, _F, R.EVICTED),
        (C.RUNNING, _F, R.EVICTED),
        (C.RUNNING, _F, R.RETRY_SCHEDULED),
        (C.FAILED, _F, R.RETRY_SCHEDULED),
        (C.SUSPENDED, _T, R.SUSPENDED),
        (C.SUSPENDED, _F, R.RESUMED),
        (C.SUSPENDED, _T, R.HELD),
        (C.SUSPENDED, _F, R.RELEASED),
        (C.SUSPENDED, _F, R.NOT_HELD),
        (C.SLURM_REACHABLE, _T, R.SLURM_ANSWERING),
        (C.SLURM_REACHABLE, _F, R.SLURM_AUTH_FAILED),
        (C.SLURM_REACHABLE, _F, R.SLURM_UNAVAILABLE),
        *(
            (cond, status, reason)
            for reason in (R.STAGING_NOT_WRITABLE, R.DEPENDENCY_FAILED)
            for cond, status in ((C.RUNNING, _F), (C.READY, _F), (C.SUCCEEDED, _F), (C.FAILED, _T))
        ),
        *(
            (cond, status, FROM_SLURM)
            for cond in (C.RUNNING, C.READY, C.SUCCEEDED, C.FAILED)
            for status in (_T, _F)
        ),
        (C.PROBE_PASSED, _T, R.PROBE_PASSED),
        (C.PROBE_PASSED, _T, R.PROBE_CACHED),
        (C.PROBE_PASSED, _F, R.PROBE_FAILED),
        (C.SUBMITTED, _F, R.PROBE_FAILED),  # the next attempt cannot be placed without them
        *((cond, _F, R.PROBE_RETRY) for cond in (C.READY, C.RUNNING, C.FAILED)),
        *(
            (cond, status, R.PROBE_FAILED)
            for cond, status in ((C.RUNNING, _F), (C.READY, _F), (C.SUCCEEDED, _F), (C.FAILED, _T))
        ),
        *((cond, _F, R.SEGMENT_CONTINUED) for cond in (C.READY, C.RUNNING, C.FAILED)),
        *(
            (cond, status, reason)
            for reason in (R.WALLTIME_EXHAUSTED, R.NO_PROGRESS)
            for cond, status in ((C.RUNNING, _F), (C.READY, _F), (C.SUCCEEDED, _F), (C.FAILED, _T))
        ),
        (C.FINISHED, _T, FROM_PHASE),
        *(
            (C.FINISHED, _F, reason)
            for reason in (R.INVALID_SPEC, R.LIMIT_EXCEEDED, R.DEPENDENCY_FAILED, R.NOT_FINISHED)
        ),
        *(
            (cond, status, FROM_KUEUE)
            for cond in (C.QUOTA_RESERVED, C.ADMITTED, C.EVICTED)
            for status in (_T, _F)
        ),
    ]
)
