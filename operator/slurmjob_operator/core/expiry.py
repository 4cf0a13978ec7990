"""When a finished SlurmJob is deleted: spec.ttlSecondsAfterFinished, as a batch/v1 Job's.

The clock starts when `Finished` turned True (its lastTransitionTime, never later than when
the operator first saw the SlurmJob final: `core.claims.finished_at`), so nothing that is not
final starts it: a refusal an edit decides again (`Finished=False`), an attempt followed by
another (Pending with its next due time). The site gives a default for SlurmJobs without the
field (none unless the admin sets one) and a maximum that caps every TTL. Whether an upstream
may go is the caller's question (`controller.expiry`): a SlurmJob named in the dependsOn of a
SlurmJob still to finish is kept until that one finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.core.claims import finished_at


@dataclass(frozen=True)
class TtlPolicy:
    """The site's word (`SLURMJOB_TTL_AFTER_FINISHED_DEFAULT` / `_MAX`)."""

    default: int | None = None
    maximum: int | None = None


def effective_ttl(spec_ttl: int | None, policy: TtlPolicy) -> int | None:
    """The TTL that applies: the spec's, else the site default, at most the site maximum;
    None: the SlurmJob is kept."""
    ttl = spec_ttl if spec_ttl is not None else policy.default
    if ttl is None:
        return None
    if policy.maximum is not None:
        ttl = min(ttl, policy.maximum)
    return max(0, ttl)


def expires_in(
    status: SlurmJobStatus, ttl: int | None, now: datetime, first_seen: datetime | None = None
) -> float | None:
    """Seconds until the SlurmJob is due for deletion (0: due now); None: never (no TTL, or
    not finished). `first_seen`: when this process first saw it final (`claims.finished_at`
    clamps the status's time to it)."""
    if ttl is None:
        return None
    at = finished_at(status, first_seen, now)
    if at is None:
        return None
    return max(0.0, (at - now).total_seconds() + ttl)
