"""Deleting a finished SlurmJob once its TTL passed (`core.expiry`), as Kubernetes' TTL
controller does for a Job: a wake at the due time, a fresh read that must still say so, and a
delete conditioned on that read's uid and resourceVersion (an edit or a new SlurmJob of the
same name in between is never deleted). The delete goes through the finalizer like any other
(cancel nothing, archive the tails, remove the staging files).

A SlurmJob named in the dependsOn of a SlurmJob still to finish is kept: `upstream_of` (the
fleet's index of every cluster's waiting dependents, from the watch, no read) says so, and it
is looked at again after `recheck` seconds. Nothing here costs a request before the due time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from slurmjob_operator.api.resource import ResourceView
from slurmjob_operator.controller.resource import ResourceEdge
from slurmjob_operator.controller.wakes import Wakes
from slurmjob_operator.core.expiry import TtlPolicy, effective_ttl, expires_in
from slurmjob_operator.core.finality import is_final
from slurmjob_operator.kube.ports import ResourceDeleter
from slurmjob_operator.times import utc_now

log = logging.getLogger(__name__)

#: SlurmJobs whose first final sighting is remembered at most.
MAX_FIRST_SEEN = 200_000


class Expiry:
    def __init__(
        self,
        edge: ResourceEdge,
        deleter: ResourceDeleter | None,
        policy: TtlPolicy,
        wakes: Wakes,
        upstream_of: Callable[[str, str], bool],
        *,
        recheck: float,
    ) -> None:
        """`deleter`: None where nothing may be deleted (the local runner's files);
        `upstream_of(namespace, name)`: whether a SlurmJob still to finish depends on it."""
        self.edge = edge
        self.deleter = deleter
        self.policy = policy
        self.wakes = wakes
        self.upstream_of = upstream_of
        self.recheck = recheck
        # uid -> when this process first saw the SlurmJob final: a status's Finished time is
        # a claim, clamped to this (`core.claims.finished_at`), so a time written into the
        # future keeps nothing past its TTL. Oldest forgotten first past the bound (its clock
        # then starts again when next seen).
        self._first_seen: dict[str, datetime] = {}

    def _due_in(self, view: ResourceView) -> float | None:
        spec_ttl = view.spec.ttl_seconds_after_finished if view.spec is not None else None
        ttl = effective_ttl(spec_ttl, self.policy)
        if ttl is None:
            return None
        now = utc_now()
        uid = view.ref.uid
        if not is_final(view.status):
            self._first_seen.pop(uid, None)
            return None
        if uid not in self._first_seen:
            if len(self._first_seen) >= MAX_FIRST_SEEN:
                del self._first_seen[next(iter(self._first_seen))]
            self._first_seen[uid] = now
        return expires_in(view.status, ttl, now, self._first_seen[uid])

    def noticed(self, view: ResourceView) -> None:
        """A watch event of this cluster's SlurmJob: a wake at its due time, if it has one.
        The status write that makes a SlurmJob final is the poller's, and no handler runs for
        a status change: this is how that write starts the clock."""
        if self.deleter is None or view.deleting:
            self._first_seen.pop(view.ref.uid, None)
            return
        due = self._due_in(view)
        if due is not None:
            self.wakes.at(view.ref, due)

    async def look(self, view: ResourceView) -> None:
        """A final SlurmJob seen: delete it when its TTL has passed, else wake it then."""
        if self.deleter is None or view.deleting:
            return
        due = self._due_in(view)
        if due is None:
            return
        if due > 0:
            self.wakes.at(view.ref, due)
            return
        ref = view.ref
        if self.upstream_of(ref.namespace, ref.name):
            log.info(
                "%s/%s: TTL passed, kept while a SlurmJob that depends on it has not finished",
                ref.namespace,
                ref.name,
            )
            self.wakes.at(ref, self.recheck)
            return
        # Decided again on what the apiserver has now, and deleted only as it was then.
        fresh = await self.edge.fresh(ref, conditioned=True)
        if fresh is None or fresh.deleting or fresh.resource_version is None:
            return
        due = self._due_in(fresh)
        if due is None:
            return
        if due > 0:
            self.wakes.at(ref, due)
            return
        if await self.deleter.delete_slurmjob(ref, fresh.resource_version):
            log.info("%s/%s: deleted, its TTL after it finished passed", ref.namespace, ref.name)
        else:
            self.wakes.at(ref, 1.0)  # changed meanwhile (or gone): look again
