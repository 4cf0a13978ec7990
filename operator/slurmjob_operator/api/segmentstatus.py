"""What the status keeps of a walltime segment (`core.segments` decides the chain)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from slurmjob_operator.api.model import Model

__all__ = ["AttemptSegment"]


class _Model(Model):
    # As every status model: fields a newer release wrote are left out, not refused.
    model_config = ConfigDict(**{**Model.model_config, "extra": "ignore"})


class AttemptSegment(_Model):
    """One segment of a spec.walltime chain: the attempt that ran it, its limit, how it ended
    and whether its checkpoint directory changed."""

    index: int = Field(ge=0, description="The segment's index (SLURMJOB_SEGMENT): 0, 1, ...")
    limit_minutes: int = Field(ge=1, description="The segment's time limit in minutes.")
    previous_job_id: int | None = Field(
        default=None, ge=1, description="The Slurm job of the segment before (the one resumed)."
    )
    ended: str | None = Field(
        default=None,
        max_length=64,
        description=(
            "How the segment ended when the chain went on: Timeout, ContinueExitCode, "
            "Preempted or NodeFail."
        ),
    )
    checkpoint: str | None = Field(
        default=None,
        pattern=r"^(sha256:[0-9a-f]{64}|unknown)$",
        description=(
            "A digest of what the checkpoint directory held (names, sizes, times) when the "
            "segment ended; unknown when it could not be read in full."
        ),
    )
    progress: bool | None = Field(
        default=None,
        description="Whether the checkpoint directory changed during the segment.",
    )
