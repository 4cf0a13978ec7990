"""Kueue before a submit: the queue a tenant requires (`requireQueue`), and the admission of the
SlurmJob's Workload (its conditions written on the SlurmJob: QuotaReserved, Admitted). While
suspended before anything ran, the Workload is kept inactive so that it holds no quota."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.controller.evictions import Evictions
from slurmjob_operator.controller.gates import Fail, Go, Outcome, Pending, Wait
from slurmjob_operator.controller.pipeline import Site
from slurmjob_operator.controller.queues import Queues
from slurmjob_operator.controller.resource import ResourceEdge, RetryLater
from slurmjob_operator.core.following import admission_conditions
from slurmjob_operator.core.kueue import QUEUE_LABEL, Admission, queue_of
from slurmjob_operator.core.reasons import Reason
from slurmjob_operator.core.reconcile import invalid_spec, waiting
from slurmjob_operator.core.transition import Transition
from slurmjob_operator.kube import WorkloadError
from slurmjob_operator.site.tenantentry import Tenant
from slurmjob_operator.times import utc_now


def required_queue_refusal(
    tenant: Tenant | None, namespace: str, labels: Mapping[str, str]
) -> str | None:
    """Why a SlurmJob with these labels is refused for want of the queue its tenant requires
    (`requireQueue`), or None (the chart's admission policy says the same words)."""
    if tenant is None or not tenant.require_queue or queue_of(labels) is not None:
        return None
    return (
        f"metadata.labels: the tenant of namespace {namespace} requires a "
        f"Kueue LocalQueue (label {QUEUE_LABEL}); nothing was submitted"
    )


class RequiredQueueGate:
    """A tenant that requires a queue gets nothing submitted without one."""

    def __init__(self, site: Site) -> None:
        self.site = site

    async def check(self, pending: Pending) -> Outcome:
        view = pending.view
        tenant = self.site.tenant_of(view.ref.namespace)
        text = required_queue_refusal(tenant, view.ref.namespace, view.labels)
        if text is None:
            return Go()
        return Fail(
            invalid_spec(view.status, [text], view.generation, utc_now(), Reason.INVALID_SPEC)
        )


class AdmissionGate:
    """Kueue's admission of the Workload (nothing to wait for without a queue label)."""

    def __init__(
        self,
        queues: Queues | None,
        edge: ResourceEdge,
        evictions: Evictions | None,
        again: Callable[[ObjectRef, float], None],
        wait: float,
    ) -> None:
        """`again(ref, delay)`: a wake for an error a Workload event's reconcile would drop;
        `wait`: how soon the admission is looked for again, besides the Workload watch."""
        self.queues = queues
        self.edge = edge
        self.evictions = evictions
        self.again = again
        self.wait = wait

    async def check(self, pending: Pending) -> Outcome:
        view = pending.view
        spec = view.spec
        if self.queues is None or spec is None or queue_of(view.labels) is None:
            return Go()
        found = await self.queues.admission(view, spec)
        now = utc_now()
        told = admission_conditions(view.status, found, view.generation, now)
        if found.admission is Admission.ADMITTED:
            pending.view = await self.edge.apply(view, told)
            pending.admitted = found
            return Go()
        if found.admission is Admission.EVICTED:
            # Its job has ended (no new attempt is made while one runs): give the quota back
            # if that was not done yet (a crash between the two writes).
            try:
                await self.queues.give_back(view, found)
            except WorkloadError as exc:
                self.again(view.ref, self.wait)  # a Workload event's reconcile drops it
                raise RetryLater(str(exc), self.wait) from exc
        text = f"Kueue: {found.message or found.reason or found.admission.value}"
        wait = waiting(told.status, Reason.WAITING_FOR_ADMISSION, text, view.generation, now)
        return Wait(Transition(wait.status, told.events + wait.events), text, self.wait)

    async def inactive(self, view: ResourceView) -> None:
        """spec.suspend before anything ran: the Workload is made (or kept) inactive, so it
        holds no quota; a reservation it had is given back once Kueue evicts it."""
        spec = view.spec
        if self.queues is None or spec is None or queue_of(view.labels) is None:
            return
        found = await self.queues.admission(view, spec, suspended=True, place=False)
        now = utc_now()
        view = await self.edge.apply(
            view, admission_conditions(view.status, found, view.generation, now)
        )
        if found.admission is Admission.EVICTED and self.evictions is not None:
            try:
                await self.evictions.give_back(view, found, now)
            except RetryLater as exc:
                self.again(view.ref, exc.delay)  # a Workload event's reconcile drops it
                raise
