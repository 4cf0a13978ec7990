"""When a job may run and for how long: the SlurmJobs it runs after, its time limit and its
mode (Batch only).

Part of the SlurmJob spec (`api.spec`); the retry policy is `api.retry`.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from slurmjob_operator.api.model import Model as _Model

#: A SlurmJob's name: a DNS subdomain (RFC 1123), as Kubernetes allows for custom resources.
OBJECT_NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_DEPENDENCIES = 16


class DependencyCondition(StrEnum):
    """What the upstream SlurmJob must have ended as for this one to run."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"  # Failed or Cancelled
    FINISHED = "Finished"  # any final phase


class Dependency(_Model):
    name: str = Field(
        pattern=OBJECT_NAME_RE,
        max_length=253,
        description="Name of a SlurmJob in the same namespace.",
    )
    condition: DependencyCondition = Field(
        default=DependencyCondition.SUCCEEDED,
        description=(
            "Succeeded (the default), Failed (Failed or Cancelled) or Finished (any final "
            "phase): what the upstream must have ended as, after its retries."
        ),
    )


class Mode(StrEnum):
    BATCH = "Batch"
    PLAYGROUND = "Playground"
    DEPLOYMENT = "Deployment"


_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?$")
TimeLimit = Annotated[int | str, Field(description="Minutes, or a duration such as 90m, 4h, 1d")]


def parse_time_limit(value: int | str) -> int:
    """Minutes from an int or a duration string (`90`, `90m`, `4h`, `1d2h30m`)."""
    if isinstance(value, bool):
        raise ValueError("timeLimit must be minutes or a duration such as 90m, 4h")
    if isinstance(value, int):
        minutes = value
    else:
        text = value.strip()
        if text.isdigit():
            minutes = int(text)
        else:
            match = _DURATION_RE.fullmatch(text)
            if not text or match is None:
                raise ValueError(f"timeLimit {value!r}: use minutes or a duration such as 90m, 4h")
            days, hours, mins = (int(g) if g else 0 for g in match.groups())
            minutes = days * 1440 + hours * 60 + mins
    if minutes < 1:
        raise ValueError("timeLimit must be at least one minute")
    if minutes > 365 * 1440:
        raise ValueError("timeLimit cannot exceed 365 days")
    return minutes
