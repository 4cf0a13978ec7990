"""What a walltime segment adds to its attempt's script (`core.segments` plans it): where the
program is in the chain, as variables of the container, and the chain's checkpoint directory,
mounted read-write at the same path as on the cluster."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.core.segments import SegmentPlan
from slurmjob_operator.site.templating import RenderError

#: A segment's variables (after spec.env's in job.env) and its checkpoint directory as the
#: cluster sees it; nothing for a job without walltime.
SegmentParts = tuple[list[tuple[str, str]], PurePosixPath | None]

#: The variables a segment's job.env carries after spec.env's (reserved for spec.env).
SEGMENT_ENV_NAMES = frozenset(
    {"SLURMJOB_SEGMENT", "SLURMJOB_RESUME", "SLURMJOB_PREVIOUS_JOB_ID", "SLURMJOB_CHECKPOINT_DIR"}
)


def segment_env(plan: SegmentPlan, checkpoint: PurePosixPath) -> list[tuple[str, str]]:
    """The segment's variables: its index, whether it resumes, the job it resumes from and the
    checkpoint directory (operator-made values only: digits and a path the operator built)."""
    values = [
        ("SLURMJOB_SEGMENT", str(plan.index)),
        ("SLURMJOB_RESUME", "1" if plan.resume else "0"),
        ("SLURMJOB_CHECKPOINT_DIR", str(checkpoint)),
    ]
    if plan.previous_job_id is not None:
        values.append(("SLURMJOB_PREVIOUS_JOB_ID", str(plan.previous_job_id)))
    return values


def mount_conflict(targets: list[str], checkpoint: PurePosixPath) -> str | None:
    """A user mount onto the checkpoint directory (or inside it), which would hide it."""
    for target in targets:
        path = PurePosixPath(target)
        if path == checkpoint or checkpoint in path.parents:
            return (
                f"spec.mounts: target {target} is the walltime chain's checkpoint directory "
                f"{checkpoint} (or inside it), which the operator mounts itself"
            )
    return None


def segment_parts(
    spec: SlurmJobSpec, plan: SegmentPlan | None, checkpoint: PurePosixPath
) -> SegmentParts:
    """The segment's parts (`SegmentParts`)."""
    if plan is None:
        if spec.walltime is not None:
            raise RenderError("spec.walltime: the segment is not planned")
        return [], None
    return segment_env(plan, checkpoint), checkpoint


def warning_fields(spec: SlurmJobSpec, plan: SegmentPlan | None) -> dict[str, Any]:
    """A segment's warning signal and delay, for the job description (never #SBATCH)."""
    if plan is None or spec.walltime is None:
        return {}
    return {
        "warning_signal": spec.walltime.signal.value,
        "warning_seconds": spec.walltime.warning_seconds,
    }
