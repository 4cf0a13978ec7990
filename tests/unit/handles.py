"""Handles on Slurm jobs for tests that call a mutating client operation directly: made the
only way there is (`core.verified.verify_named`), from a view shaped like the job, inside the
step the `step` fixture of conftest.py (or the test) opened."""

from __future__ import annotations

from slurmjob_operator.core import verified
from slurmjob_operator.core.jobview import SlurmJobView

OWNER = "slurmci"


def handle(
    ref: int | str, owner: str = OWNER, *, cluster: str = "default", het: tuple[int, ...] = ()
) -> verified.VerifiedJob:
    """A handle on job `ref` (its id, or a SLUID "s…" standing for job 1) owned by `owner`;
    `het`: the ids of its other heterogeneous components."""
    job_id, sluid = (1, ref) if isinstance(ref, str) else (ref, None)
    views = [SlurmJobView(job_id=job_id, sluid=sluid, name="t", comment="t", user=owner)]
    views += [
        SlurmJobView(
            job_id=other, het_job_id=job_id, het_job_offset=n + 1, name="t", comment="t", user=owner
        )
        for n, other in enumerate(het)
    ]
    if het:
        views[0] = views[0].model_copy(update={"het_job_id": job_id, "het_job_offset": 0})
    made = verified.verify_named(views, "t", "t", owners=frozenset({owner}), cluster=cluster)
    assert isinstance(made, verified.VerifiedJob), made
    return made
