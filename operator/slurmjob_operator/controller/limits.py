"""The cluster's partitions, nodes, accounts and QOS that submissions are checked against
(`core.limits`), read at most once per poll interval whatever the number of submissions.

One reader at a time: submissions that arrive while it reads wait for its answer instead of
asking too. A read that fails keeps the last answer (a stale limit is still a limit); with no
answer at all nothing is checked here and Slurm's own checks at submit remain.

A refusal is made only on a read younger than the refusal age (`core.limits.refusal_age_for`:
the poll interval, at most 5 s), so a partition made a moment ago is not refused on an older
answer. Every spec over the limits asks for such a read, and tenants choose how many specs
they send: the read is shared by all that ask within the refusal age or while it is in
flight, and one that failed is not tried again before the refusal age has passed (nothing is
refused meanwhile). Whatever the specs, the cluster is read at most once per refusal age
besides the poll interval's read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from slurmjob_operator.core.limits import (
    Node,
    Partition,
    ReadTimes,
    Snapshot,
    Source,
    limits_source,
    refusal_age_for,
)
from slurmjob_operator.slurm.auth import TokenError
from slurmjob_operator.slurm.client import SlurmClient
from slurmjob_operator.slurm.errors import SlurmError

log = logging.getLogger(__name__)

#: The AccountingStorageEnforce words under which a job's account must exist in slurmdbd.
ASSOCIATIONS_ENFORCED = frozenset({"associations", "limits", "qos", "safe"})


async def read_snapshot(client: SlurmClient, cluster: str) -> Snapshot:
    """One read of everything a submission is checked against; raises SlurmError when the
    partitions cannot be read (nodes, accounts and QOS are optional)."""
    partitions = {
        p.name: Partition(
            name=p.name,
            up=p.is_up,
            state=",".join(sorted(p.states)),
            default=p.is_default,
            max_time_minutes=p.max_time_minutes,
            max_nodes=p.max_nodes,
            max_cpus_per_node=p.max_cpus_per_node,
        )
        for p in await client.partitions()
    }
    try:
        nodes: tuple[Node, ...] = tuple(
            Node(
                name=n.name,
                partitions=n.partitions,
                features=n.features,
                cpus=n.cpus,
                memory_mb=n.memory_mb,
                gpus=n.gpus,
            )
            for n in await client.list_nodes()
        )
    except SlurmError as exc:
        log.info("limits of %s: nodes not read (%s); node sizes not checked", cluster, exc)
        nodes = ()
    accounts = qos = None
    kills_invalid = False
    try:
        conf = await client.conf()
        kills_invalid = conf is not None and "kill_invalid_depend" in conf.dependency_parameters
        # Only what slurmctld enforces: without AccountingStorageEnforce=associations it runs
        # a job whose account slurmdbd does not know, and the operator must not refuse it;
        # under PrivateData=accounts the operator's user may not see every account.
        enforced = conf.enforce if conf is not None else frozenset()
        if enforced and await client.has_accounting():
            private = conf.private_data if conf is not None else frozenset()
            if enforced & ASSOCIATIONS_ENFORCED and "accounts" not in private:
                accounts = await client.account_names()
            if "qos" in enforced:
                qos = await client.qos_names()
    except SlurmError as exc:
        log.info("limits of %s: accounts and QOS not read (%s); not checked", cluster, exc)
        accounts = qos = None
    return Snapshot(
        cluster, partitions, nodes, accounts, qos, kills_invalid_dependencies=kills_invalid
    )


class LimitsCache:
    def __init__(
        self,
        cluster: str,
        slurm: Callable[[], Awaitable[SlurmClient]],
        ttl: float,
        *,
        refusal_age: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`ttl`: the poll interval; `refusal_age`: the oldest read a refusal is made on
        (None: derived from the poll interval)."""
        self.cluster = cluster
        self._slurm = slurm
        self._ttl = ttl
        self.refusal_age = refusal_age_for(ttl) if refusal_age is None else refusal_age
        self._clock = clock
        self._lock = asyncio.Lock()
        self._snapshot: Snapshot | None = None
        self._times = ReadTimes()
        self._ended = 0  # reads ended so far: a caller that waited sees whether one did
        self._last_ok = False
        self.reads = 0

    async def snapshot(self, *, fresh: bool = False) -> Snapshot | None:
        """The cluster's limits, read anew when the last read is older than the ttl (a failed
        read counts: it is not retried by every waiting submission). `fresh`: what a refusal
        is made on, None unless there is a successful read younger than the refusal age, or
        one is made now (a partition made a moment ago, or an answer kept from before failed
        reads, never refuses a job)."""
        ended = self._ended
        async with self._lock:
            if self._ended != ended:
                # A read ended while this call waited for it: its answer is as new as one
                # this call would make, and a read made again at once would be a tenant's
                # second (`core.limits.limits_source`).
                return self._snapshot if self._last_ok or not fresh else None
            now = self._clock()
            source = limits_source(
                self._times, now, fresh=fresh, ttl=self._ttl, refusal_age=self.refusal_age
            )
            if source is Source.KEPT:
                return self._snapshot
            if source is Source.NOTHING:
                return None
            return await self._read(now, fresh)

    async def _read(self, now: float, fresh: bool) -> Snapshot | None:
        self._times = ReadTimes(tried=now, good=self._times.good)
        self._last_ok = False
        self.reads += 1
        try:
            snapshot = await read_snapshot(await self._slurm(), self.cluster)
        except (SlurmError, TokenError) as exc:
            log.warning(
                "limits of %s not read (%s): %s",
                self.cluster,
                exc,
                "the last ones are used" if self._snapshot else "nothing is checked",
            )
            return None if fresh else self._snapshot
        else:
            self._snapshot = snapshot
            self._times = ReadTimes(tried=now, good=now)
            self._last_ok = True
            return snapshot
        finally:
            # Also when cancelled: whoever waited gets no answer from it, not a read of its
            # own.
            self._ended += 1
