"""Kueue's Workload for each SlurmJob that names a LocalQueue (`core.kueue`): made before the
first submit, asked whether it is admitted before every new attempt, told when the Slurm job
runs (`PodsReady`) and when it has ended (`Finished`, which releases the quota), and deleted
with the SlurmJob (the test bed, like some clusters, runs no garbage collector).

A SlurmJob without the label costs nothing here, and the operator runs without Kueue
installed; one with it waits (`WaitingForAdmission`) while Kueue cannot be asked.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from slurmjob_operator import GROUP, VERSION
from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import Phase, SlurmJobStatus, get_condition
from slurmjob_operator.core.finality import is_final
from slurmjob_operator.core.following import QUOTA_RESERVED
from slurmjob_operator.core.kueue import (
    KUEUE_UNAVAILABLE,
    PRIORITY_LABEL,
    Admission,
    Verdict,
    active_patch,
    assigned_flavors,
    condition,
    flavors_refusal,
    holds_quota,
    is_ours,
    placement,
    queue_of,
    reservation_cleared,
    verdict,
    with_condition,
    workload_body,
    workload_name,
)
from slurmjob_operator.kube import WorkloadError, WorkloadStore
from slurmjob_operator.times import rfc3339, utc_now

log = logging.getLogger(__name__)


def _involved(view: ResourceView, status: SlurmJobStatus) -> bool:
    """The SlurmJob names a queue, or did (Kueue's conditions on it): a label removed later
    leaves its Workload to be finished and deleted all the same."""
    return (
        queue_of(view.labels) is not None
        or get_condition(status.conditions, QUOTA_RESERVED) is not None
    )


class Queues:
    def __init__(self, store: WorkloadStore) -> None:
        self._store = store

    async def admission(
        self,
        view: ResourceView,
        spec: SlurmJobSpec,
        *,
        suspended: bool = False,
        place: bool = True,
    ) -> Verdict:
        """Kueue's verdict on the SlurmJob's Workload, made first when there is none; its
        spec.active follows `!spec.suspend` (`core.kueue.active_patch`). `place`: an
        admission is told where its flavors place the job (their reads are made only where a
        job is about to be submitted or released)."""
        queue = queue_of(view.labels)
        assert queue is not None
        ref = view.ref
        name = workload_name(ref.name, ref.uid)
        expected = workload_body(
            ref.namespace, ref.name, ref.uid, spec, queue, None, f"{GROUP}/{VERSION}"
        )
        try:
            workload = await self._store.get_workload(ref.namespace, name)
            if workload is not None and not is_ours(workload, expected):
                return Verdict(
                    Admission.WAITING,
                    "WorkloadNotOurs",
                    f"Workload {name} was not made by the operator for this SlurmJob (its "
                    "owner, queue or podSets differ): nothing is submitted on its admission; "
                    "delete it and the operator makes its own",
                )
            patch = active_patch(workload, suspended) if workload is not None else None
            if patch is not None:
                workload = await self._store.patch_workload(ref.namespace, name, patch)
            if workload is None:
                if not await self._store.local_queue_exists(ref.namespace, queue):
                    return Verdict(
                        Admission.WAITING,
                        "LocalQueueNotFound",
                        f"LocalQueue {queue} does not exist in namespace {ref.namespace}",
                    )
                priority_class = view.labels.get(PRIORITY_LABEL) or None
                priority = None
                if priority_class is not None:
                    priority = await self._store.workload_priority(priority_class)
                    if priority is None:
                        return Verdict(
                            Admission.WAITING,
                            "PriorityClassNotFound",
                            f"WorkloadPriorityClass {priority_class} does not exist",
                        )
                body = workload_body(
                    ref.namespace,
                    ref.name,
                    ref.uid,
                    spec,
                    queue,
                    priority_class,
                    f"{GROUP}/{VERSION}",
                    priority,
                    suspended,
                )
                workload = await self._store.create_workload(body)
                log.info(
                    "%s/%s: Workload %s made in queue %s", ref.namespace, ref.name, name, queue
                )
            found = verdict(workload)
            if place and found.admission is Admission.ADMITTED:
                return await self._placed(found, workload, spec)
        except WorkloadError as exc:
            return Verdict(Admission.WAITING, KUEUE_UNAVAILABLE, str(exc))
        return found

    async def _placed(
        self, found: Verdict, workload: dict[str, Any], spec: SlurmJobSpec
    ) -> Verdict:
        """The admitted verdict with where its flavors place the job (`core.kueue.placement`);
        waiting while a flavor it names cannot be read."""
        assigned = assigned_flavors(workload)
        refused = flavors_refusal(spec, assigned)
        if refused is not None:
            return replace(found, refusal=f"Kueue: {refused}")
        labels: dict[str, dict[str, str]] = {}
        for flavor in sorted({f for names in assigned.values() for f in names}):
            nodes = await self._store.flavor_labels(flavor)
            if nodes is None:
                return Verdict(
                    Admission.WAITING,
                    "FlavorNotFound",
                    f"ResourceFlavor {flavor} of the admission does not exist",
                    found.cluster_queue,
                    found.reserved,
                )
            labels[flavor] = nodes
        try:
            return replace(found, partition=placement(spec, assigned, labels))
        except ValueError as exc:
            return replace(found, refusal=f"Kueue: {exc}")

    async def observed(self, view: ResourceView, status: SlurmJobStatus) -> None:
        """After a status write: tell Kueue the job runs, or has ended for good."""
        if not _involved(view, status) or status.phase is None:
            return
        if status.phase is Phase.RUNNING:
            await self._mark(view, "PodsReady", "Running", "the Slurm job runs")
        elif is_final(status):
            await self._mark(
                view, "Finished", status.phase.value, status.message or status.phase.value
            )

    async def _mark(self, view: ResourceView, kind: str, reason: str, message: str) -> None:
        ref = view.ref
        name = workload_name(ref.name, ref.uid)
        for _ in range(3):  # Kueue writes the same status: on a conflict, read it again
            try:
                workload = await self._store.get_workload(ref.namespace, name)
                if workload is None:
                    return
                if kind == "PodsReady" and verdict(workload).admission is Admission.EVICTED:
                    return  # its job was stopped for Kueue: it runs again once re-admitted
                new = condition(kind, reason, message, None, rfc3339(utc_now()))
                conditions = with_condition(workload, new)
                if conditions is None or await self._store.set_workload_status(
                    workload, {"conditions": conditions}
                ):
                    return
            except WorkloadError as exc:
                log.warning(
                    "%s/%s: Workload %s not marked %s: %s", ref.namespace, ref.name, name, kind, exc
                )
                return

    async def give_back(self, view: ResourceView, found: Verdict) -> None:
        """The evicted Workload's job has stopped: clear its quota reservation, so that Kueue
        admits what preempted it (and this one again, later)."""
        ref = view.ref
        name = workload_name(ref.name, ref.uid)
        for _ in range(3):
            workload = await self._store.get_workload(ref.namespace, name)
            if workload is None or verdict(workload).admission is not Admission.EVICTED:
                return
            if not holds_quota(workload):
                return
            patch = reservation_cleared(workload, found.reason, found.message, rfc3339(utc_now()))
            if await self._store.set_workload_status(workload, patch):
                log.info(
                    "%s/%s: Workload %s evicted (%s): quota given back",
                    ref.namespace,
                    ref.name,
                    name,
                    found.reason,
                )
                return
        raise WorkloadError(f"Workload {ref.namespace}/{name} kept changing; not given back yet")

    async def delete(self, view: ResourceView) -> None:
        if not _involved(view, view.status):
            return
        ref = view.ref
        try:
            await self._store.delete_workload(ref.namespace, workload_name(ref.name, ref.uid))
        except WorkloadError as exc:
            log.warning("%s/%s: Workload not deleted: %s", ref.namespace, ref.name, exc)
