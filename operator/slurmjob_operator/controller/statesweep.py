"""The poller's `/jobs/state` sweep (v0.0.40+) and whose job its entries are.

The tracked ids in filtered batches of `STATE_BATCH`, or one unfiltered request once that is
cheaper (`core.sweep` decides, from how many jobs the last unfiltered sweep found; while
batches are chosen that is looked at again every `RECHECK_CYCLES` sweeps). An array's id
counts as one: filtered by it, Slurm answers every task of the array. A started array task
answers under its own job id: learnt from the array's details (`learn`), its entries then
count for the array.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence

from slurmjob_operator.core.jobview import JobStateEntry, SlurmJobView
from slurmjob_operator.core.statekeys import StateKey, array_key
from slurmjob_operator.core.sweep import RECHECK_CYCLES, STATE_BATCH, sweep_all
from slurmjob_operator.slurm.client import SlurmClient

Groups = dict[int, list[JobStateEntry]]


class StateSweep:
    """One per poller (one per cluster): the cluster's size as last seen, and the array
    tasks' own job ids."""

    def __init__(self) -> None:
        self._cluster_jobs: int | None = None  # entries of the last unfiltered sweep
        self._filtered_sweeps = 0  # since the last unfiltered one
        self._task_of: dict[int, int] = {}  # task's own job id -> its array's id

    def forget(self, tracked: Container[int]) -> None:
        """Forget the tasks of the arrays no longer tracked."""
        for task, array in list(self._task_of.items()):
            if array not in tracked:
                del self._task_of[task]

    async def sweep(
        self, client: SlurmClient, tracked: Mapping[int, object]
    ) -> tuple[Groups, Groups]:
        """One sweep of the tracked jobs (by job id): its entries by tracked job id, and the
        rest by their own id."""
        return self._attributed(await self._entries(client, tracked), tracked)

    def _attributed(
        self, entries: Iterable[JobStateEntry], tracked: Mapping[int, object]
    ) -> tuple[Groups, Groups]:
        """A sweep's entries by tracked job id (an array's started tasks under the array, as
        far as their ids were learnt), and the rest by their own id."""
        groups: Groups = defaultdict(list)
        strays: Groups = defaultdict(list)
        for entry in entries:
            if entry.job_id in tracked:
                groups[entry.job_id].append(entry)
            elif entry.array_task is not None and self._task_of.get(entry.job_id) in tracked:
                groups[self._task_of[entry.job_id]].append(entry)
            else:
                strays[entry.job_id].append(entry)
        return groups, strays

    def learn(
        self,
        array_id: int,
        views: Sequence[SlurmJobView],
        group: Sequence[JobStateEntry] | None,
        strays: Mapping[int, list[JobStateEntry]],
    ) -> StateKey:
        """Remember the own job ids of the array's started tasks; the key of the sweep's
        entries for the array, those of the tasks just learnt included (so a task that just
        started costs one detail read, not two)."""
        entries = list(group or ())
        for view in views:
            if view.job_id != array_id and view.array_job_id == array_id:
                if view.job_id not in self._task_of:
                    entries += strays.get(view.job_id, [])
                self._task_of[view.job_id] = array_id
        return array_key(entries)

    async def _entries(
        self, client: SlurmClient, tracked: Mapping[int, object]
    ) -> list[JobStateEntry]:
        """`/jobs/state` for the tracked jobs: filtered batches, or one unfiltered request
        once that is cheaper (`core.sweep`)."""
        known = self._cluster_jobs if self._filtered_sweeps < RECHECK_CYCLES else None
        if sweep_all(len(tracked), known, batch=STATE_BATCH):
            entries = await client.jobs_state(None)
            self._cluster_jobs = len(entries)
            self._filtered_sweeps = 0
            return entries
        self._filtered_sweeps += 1
        return await client.jobs_state(sorted(tracked), batch=STATE_BATCH)
