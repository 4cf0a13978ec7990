"""spec.dependsOn: reading the upstream SlurmJobs for `core.dependencies`, and noticing when
one changes so that its dependents are looked at again.

Every watch event passes through `noticed` (the fleet's `observe_body`), so whoever wrote an
upstream's status (this process, a previous leader, a restart's first list) its dependents
are reconciled when a fact the rules read changed: its uid, phase, attempt, Slurm job,
confirmation or scheduled retry. Nothing else costs a request: a SlurmJob without dependents
is one dictionary lookup per event.

Upstreams are read from what the watch delivered: each event keeps the few facts the rules
read (`core.dependencies.Upstream`), so resolving a dependent, and the cycle search through
upstreams of upstreams (at most `MAX_VISITED` SlurmJobs), costs no request. Only a SlurmJob
the watch has not delivered (not made yet, made a moment ago, a restart's list still coming)
is read from the apiserver, and those reads are bounded per namespace (`core.budget`: 64 at
once, 64 more per waiting interval): a tenant's dependents naming SlurmJobs that do not exist
spend their own namespace's reads, not the operator's share of the apiserver. A name found
missing is not read again for an interval unless the watch delivers it. Always in the
dependent's namespace: a name never reaches another namespace.

Wakes are bounded per namespace too (`core.wakes`: 64 at once, 64 more per waiting interval):
whoever writes an upstream's status chooses how often it changes, and each wake costs the
dependent's own read. A wake refused waits, once per dependent however many changes ask for it,
and is made when the namespace has one again: never dropped. So is the Slurm work a change
asks for (a repoint, a cancel: `core.dependencies.repoint`), 32 at once and 32 more per
interval; a dependent whose change must wait sees its upstreams as not read for now (nothing
is changed) and is woken again an interval later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from slurmjob_operator.api.resource import ObjectRef, ResourceView
from slurmjob_operator.api.spec import SlurmJobSpec
from slurmjob_operator.api.status import SlurmJobStatus
from slurmjob_operator.controller.dependentwakes import DependentWakes
from slurmjob_operator.controller.placing import placement
from slurmjob_operator.controller.wakes import Wakes
from slurmjob_operator.core.budget import Budgets
from slurmjob_operator.core.decisions import awaits_upstream
from slurmjob_operator.core.dependencies import (
    MAX_VISITED,
    Action,
    Kind,
    Resolution,
    Upstream,
    find_cycle,
    repoint,
    resolve,
    upstream_of,
)
from slurmjob_operator.core.finality import is_final
from slurmjob_operator.core.placement import Clusters
from slurmjob_operator.core.ttlcache import TtlCache
from slurmjob_operator.kube import ResourceStore
from slurmjob_operator.site.tenants import Tenants

log = logging.getLogger(__name__)


#: Reads from the apiserver per namespace: a resolution's worth at once, as many again per
#: waiting interval (the watch delivers everything else).
READS_PER_INTERVAL = MAX_VISITED

#: Slurm dependencies changed (a repoint, a cancel) per namespace, likewise.
CHANGES_PER_INTERVAL = 32

#: Names found missing, kept for an interval (the bound only caps memory).
MAX_ABSENT = 16384

#: The facts of an upstream its dependents' rules read; a change of any one wakes them.
Fingerprint = tuple[Any, ...]

Key = tuple[str, str]  # (namespace, name)


class Unread(Enum):
    """Neither delivered by the watch nor read: the namespace's reads are spent for now."""

    UNREAD = "unread"


def _fingerprint(view: ResourceView) -> Fingerprint:
    status = view.status
    attempt = status.current_attempt
    return (
        view.ref.uid,
        status.phase,
        status.next_attempt_at,
        attempt.number if attempt else None,
        attempt.job_id if attempt else None,
        attempt.confirmed if attempt else None,
    )


class Dependencies:
    def __init__(
        self,
        store: ResourceStore,
        clusters: Clusters,
        cluster: str,
        wakes: Wakes,
        *,
        interval: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
        tenants: Tenants | None = None,
    ) -> None:
        """`interval`: how often a waiting dependent looks again
        (`core.dependencies.waiting_interval`), over which the reads are bounded."""
        self._store = store
        self._clusters = clusters
        self._cluster = cluster
        self._tenants = tenants
        self.interval = interval
        self.clock = clock
        # Every SlurmJob the watch delivered, as the rules read it.
        self._known: dict[Key, Upstream] = {}
        self._absent: TtlCache[Key, bool] = TtlCache(interval, MAX_ABSENT)
        self._reads = Budgets(READS_PER_INTERVAL, interval)
        # The clock is read through this object: tests move it on.
        self._wakes = DependentWakes(wakes, interval, self._wanted, lambda: self.clock())
        self._changes = Budgets(CHANGES_PER_INTERVAL, interval)
        # (namespace, upstream name) -> the dependents' refs, by uid
        self._dependents: dict[tuple[str, str], dict[str, ObjectRef]] = {}
        self._upstreams_of: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._seen: dict[tuple[str, str], Fingerprint] = {}
        self._own: dict[str, tuple[int, int | None] | None] = {}  # queued dependents' attempts

    # -- who depends on whom --------------------------------------------------------------

    def noticed(
        self, view: ResourceView, *, deleted: bool = False, gone: bool | None = None
    ) -> None:
        """A watch event: keep the dependents' index and wake the dependents of `view`.
        `deleted`: not this cluster's to reconcile (the fleet's word), or deleted; `gone`:
        deleted (None: as `deleted`). Another cluster's SlurmJob is still an upstream here."""
        gone = deleted if gone is None else gone
        ref = view.ref
        self._keep(view, gone)
        final = is_final(view.status)
        names = () if deleted or final or view.deleting else view.depends_on
        self._index(ref, names)
        self._self_check(view, deleted)
        key = (ref.namespace, ref.name)
        dependents = self._dependents.get(key)
        if not dependents:
            self._seen.pop(key, None)
            return
        mark = ("deleted",) if gone else _fingerprint(view)
        if self._seen.get(key) == mark:
            return
        self._seen[key] = mark
        for dependent in list(dependents.values()):
            self._wake(dependent)

    def _self_check(self, view: ResourceView, deleted: bool) -> None:
        """A job queued behind its upstreams' jobs is looked at once whenever its own
        attempt changes (a restart's first list, a submit confirmed): an upstream may have
        been retried or have failed while nobody was watching it."""
        uid = view.ref.uid
        if deleted or view.deleting or not awaits_upstream(view.status):
            self._own.pop(uid, None)
            return
        attempt = view.status.current_attempt
        mark = (attempt.number, attempt.job_id) if attempt is not None else None
        if self._own.get(uid) != mark:
            self._own[uid] = mark
            self._wake(view.ref)

    def _index(self, ref: ObjectRef, names: tuple[str, ...]) -> None:
        before = self._upstreams_of.get(ref.uid)
        if before is not None and before[1] == names:
            return
        if before is not None:
            for name in before[1]:
                group = self._dependents.get((before[0], name))
                if group is not None:
                    group.pop(ref.uid, None)
                    if not group:
                        del self._dependents[(before[0], name)]
            del self._upstreams_of[ref.uid]
        if names:
            self._upstreams_of[ref.uid] = (ref.namespace, names)
            for name in names:
                self._dependents.setdefault((ref.namespace, name), {})[ref.uid] = ref

    def dependents_of(self, namespace: str, name: str) -> list[ObjectRef]:
        return list(self._dependents.get((namespace, name), {}).values())

    def _wake(self, ref: ObjectRef, *, not_before: float | None = None) -> None:
        self._wakes.wake(ref, not_before=not_before)

    def _wanted(self, uid: str) -> bool:
        return uid in self._upstreams_of or uid in self._own

    def release(self) -> None:
        """Wake the dependents that waited and may be woken now (tests call it after moving
        the clock on)."""
        self._wakes.release()

    async def drain(self) -> None:
        """Wait for the dependents woken so far (tests, and a clean stop)."""
        await self._wakes.drain()

    # -- reading the upstreams ------------------------------------------------------------

    def _keep(self, view: ResourceView, gone: bool) -> None:
        key = (view.ref.namespace, view.ref.name)
        if not gone:
            self._known[key] = self._upstream(view)
            self._absent.drop(key)
            return
        kept = self._known.get(key)
        # The uid: a late event of a deleted SlurmJob must not drop one made since under
        # its name (each object's events come in order, two objects' need not).
        if kept is not None and kept.uid == view.ref.uid:
            del self._known[key]
            self._absent.put(key, True, self.clock())

    def _spend(self, namespace: str, now: float) -> bool:
        allowed = self._reads.take(namespace, now)
        if not allowed:
            log.debug("reads of SlurmJobs in namespace %s are spent for now", namespace)
        return allowed

    async def _look(self, namespace: str, name: str) -> Upstream | Unread | None:
        """A SlurmJob of `namespace` as the watch delivered it; read from the apiserver only
        when the watch has not, within the namespace's reads."""
        key = (namespace, name)
        known = self._known.get(key)
        if known is not None:
            return known
        now = self.clock()
        if self._absent.get(key, now) is not None:
            return None
        if not self._spend(namespace, now):
            return Unread.UNREAD
        body = await self._store.get(namespace, name)
        if body is not None:
            # Not kept: only the watch says when it changes.
            return self._upstream(ResourceView.of(body))
        delivered = self._known.get(key)  # by the watch, while the read was in flight
        if delivered is None:
            self._absent.put(key, True, now)
        return delivered

    async def upstreams(
        self, namespace: str, names: tuple[str, ...]
    ) -> tuple[dict[str, Upstream | None], dict[str, list[str]], frozenset[str]]:
        """The upstreams named, the dependency graph reachable from them (for cycles), and
        the names among `names` that could not be read now; in `namespace` only."""
        found: dict[str, Upstream | None] = {}
        graph: dict[str, list[str]] = {}
        unread: set[str] = set()
        queue = list(names)
        visited = 0
        while queue and visited < MAX_VISITED:
            name = queue.pop(0)
            if name in graph or name in unread:
                continue
            visited += 1
            upstream = await self._look(namespace, name)
            if upstream is Unread.UNREAD:
                # Searched no further, as past MAX_VISITED: a cycle through it is found
                # once it is read.
                unread.add(name)
                continue
            if upstream is None:
                graph[name] = []
                found.setdefault(name, None)
                continue
            graph[name] = list(upstream.depends_on)
            if name in names:
                found[name] = upstream
            queue.extend(n for n in upstream.depends_on if n not in graph)
        return found, graph, frozenset(unread.intersection(names))

    def _upstream(self, view: ResourceView) -> Upstream:
        status: SlurmJobStatus = view.status
        # Where it runs by its spec and tenant; an attempt naming another cluster is followed
        # by none, and its job id is no job here.
        here = placement(self._clusters, self._tenants, view).followed_on == self._cluster
        return upstream_of(view.ref.name, view.ref.uid, status, view.depends_on, here)

    async def resolve(
        self, view: ResourceView, spec: SlurmJobSpec, *, slurm_allowed: bool = True
    ) -> tuple[Resolution, bool]:
        """The resolution for a dependent with nothing submitted; True with it when the spec
        itself is wrong (a cycle, itself as a dependency)."""
        names = tuple(d.name for d in spec.depends_on)
        own = view.ref.name
        if own in names:
            return Resolution(Kind.FAIL, f"spec.dependsOn: {own} cannot depend on itself"), True
        upstreams, graph, unread = await self.upstreams(view.ref.namespace, names)
        graph[own] = list(names)
        cycle = find_cycle(own, graph)
        if cycle is not None:
            text = " -> ".join(cycle)
            return Resolution(Kind.FAIL, f"spec.dependsOn: a dependency cycle: {text}"), True
        resolution = resolve(spec.depends_on, upstreams, slurm_allowed=slurm_allowed, unread=unread)
        return resolution, False

    async def current(
        self, view: ResourceView, names: tuple[str, ...]
    ) -> Mapping[str, Upstream | None]:
        """The upstreams named, and nothing further (no cycle search: the job is queued). One
        not read now is as one gone: nothing is changed for it (`core.dependencies.repoint`),
        and its watch event wakes the dependent. When they ask for a change of the job in
        Slurm and the namespace's changes are spent, every one is as not read: nothing is
        changed now, and the dependent is woken again an interval later."""
        ref = view.ref
        found: dict[str, Upstream | None] = {}
        for name in dict.fromkeys(names):
            upstream = await self._look(ref.namespace, name)
            found[name] = None if upstream is Unread.UNREAD else upstream
        attempt = view.status.current_attempt
        records = attempt.dependencies if attempt is not None else None
        if not records or repoint(records, found).action is Action.NOTHING:
            return found
        now = self.clock()
        if self._changes.take(ref.namespace, now):
            return found
        log.info(
            "%s/%s: Slurm dependencies changed in namespace %s are spent for now; its change "
            "waits for the next interval",
            ref.namespace,
            ref.name,
            ref.namespace,
        )
        self._wake(ref, not_before=now + self.interval)
        return dict.fromkeys(found)
