"""Which `/jobs/state` query a poll sweep makes: the tracked ids in batches, or every job.

A filtered sweep costs one request per `STATE_BATCH` tracked ids and answers only those. An
unfiltered one is a single request that answers every job the controller holds, other users'
and ended ones too: on Slurm 26.05, 0.11-0.17 s and 0.8 MB for 10,000 jobs. It is taken once it
saves requests (more than two batches) and the controller holds at most `UNFILTERED_RATIO`
times the tracked jobs, so an operator following a few thousand jobs on a cluster of a
hundred thousand keeps to its batches. The cluster's size is known from the last unfiltered
sweep; while batches are chosen it is looked at again every `RECHECK_CYCLES` sweeps.
"""

from __future__ import annotations

STATE_BATCH = 500
UNFILTERED_RATIO = 4.0
RECHECK_CYCLES = 30


def sweep_all(tracked: int, cluster_jobs: int | None, *, batch: int = STATE_BATCH) -> bool:
    """Whether the next sweep is unfiltered. `cluster_jobs`: how many jobs the last
    unfiltered sweep returned (None: not known, or due to be looked at again)."""
    if tracked <= 2 * batch:
        return False
    return cluster_jobs is None or cluster_jobs <= UNFILTERED_RATIO * tracked
