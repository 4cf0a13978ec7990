"""spec.walltime: a run longer than one job may last, as a chain of segments the operator owns
(each one attempt with its own Slurm job; `core.segments` decides the chain)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from slurmjob_operator.api.model import Model as _Model
from slurmjob_operator.api.scheduling import TimeLimit, parse_time_limit

#: Exit codes the batch script itself ends with (`site.render.EXIT_CODES`, the probe's 1, srun
#: not found, the signals it turns into exits): never "checkpointed, continue".
RESERVED_EXIT_CODES = frozenset({1, 94, 95, 96, 97, 126, 127, 129, 130, 143})
#: Slurm may send the warning signal up to a minute before the delay asked for.
SIGNAL_SLACK_SECONDS = 60
MAX_SEGMENTS = 1000


class WarningSignal(StrEnum):
    USR1 = "USR1"
    USR2 = "USR2"
    TERM = "TERM"
    INT = "INT"
    HUP = "HUP"


class WalltimeSpec(_Model):
    total_time: TimeLimit = Field(
        description=(
            "The whole run (minutes, or a duration such as 72h, 3d), beyond one job's limit: "
            "the time every segment ran counts toward it."
        )
    )
    segment_time: TimeLimit | None = Field(
        default=None,
        description=(
            "Each segment's time limit, at most the tenant's maxTimeLimit. Unset: the smaller "
            "of the partition's MaxTime and the tenant's maxTimeLimit (required where MaxTime "
            "is unlimited or unset, or spec.partition is a list)."
        ),
    )
    max_segments: int = Field(
        default=100,
        ge=1,
        le=MAX_SEGMENTS,
        description="The most segments the chain runs, whatever time is left.",
    )
    warning_seconds: int = Field(
        default=300,
        ge=1,
        le=65534,
        description=(
            "Seconds before each segment's end at which `signal` is sent to the job's steps "
            "(where the command runs). warningSeconds + 60 must fit in segmentTime: Slurm may "
            "send it up to a minute early."
        ),
    )
    signal: WarningSignal = Field(
        default=WarningSignal.USR1,
        description="The signal sent warningSeconds before a segment's end: USR1 (default), "
        "USR2, TERM, INT or HUP.",
    )
    continue_exit_code: int | None = Field(
        default=None,
        ge=1,
        le=125,
        description=(
            "The exit code with which the program says 'checkpointed, continue': the next "
            "segment follows at once. Not 0 (which ends the chain Succeeded) nor a code the "
            "batch script uses itself (1, 94-97)."
        ),
    )

    @field_validator("total_time", "segment_time")
    @classmethod
    def _valid_time(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            parse_time_limit(value)
        return value

    @field_validator("continue_exit_code")
    @classmethod
    def _not_reserved(cls, value: int | None) -> int | None:
        if value is not None and value in RESERVED_EXIT_CODES:
            raise ValueError(
                f"continueExitCode {value} is an exit code of the batch script itself "
                f"({', '.join(str(c) for c in sorted(RESERVED_EXIT_CODES))})"
            )
        return value

    @model_validator(mode="after")
    def _warning_fits(self) -> WalltimeSpec:
        if self.segment_minutes is not None:
            problem = warning_problem(self.warning_seconds, self.segment_minutes)
            if problem:
                raise ValueError(problem)
        return self

    @property
    def total_minutes(self) -> int:
        return parse_time_limit(self.total_time)

    @property
    def segment_minutes(self) -> int | None:
        return None if self.segment_time is None else parse_time_limit(self.segment_time)


def warning_problem(warning_seconds: int, segment_minutes: int) -> str | None:
    """Why the warning cannot come before a segment of `segment_minutes` ends, if it cannot."""
    if warning_seconds + SIGNAL_SLACK_SECONDS > segment_minutes * 60:
        return (
            f"warningSeconds {warning_seconds} + {SIGNAL_SLACK_SECONDS} (Slurm may signal up to a "
            f"minute early) does not fit in a segment of {segment_minutes} minute(s)"
        )
    return None
