"""The cluster's partitions, nodes, accounts and QOS that submissions are checked against
(`core.limits`), read at most once per poll interval whatever the number of submissions.

One reader at a time: submissions that arrive while it reads wait for its answer instead of
asking too. A read that fails keeps the last answer (a stale limit is still a limit); with no
answer at all nothing is checked here and Slurm's own checks at submit remain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from slurmjob_operator.core.limits import Node, Partition, Snapshot
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self._slurm = slurm
        self._ttl = ttl
        self._clock = clock
        self._lock = asyncio.Lock()
        self._snapshot: Snapshot | None = None
        self._read_at: float | None = None
        self.reads = 0

    async def snapshot(self, *, fresh: bool = False) -> Snapshot | None:
        """The cluster's limits, read anew when the last read is older than the ttl (a failed
        read counts: it is not retried by every waiting submission). `fresh`: read now, and
        None unless that read succeeds (what a refusal is made on: a partition made a moment
        ago, or an answer kept from before failed reads, never refuses a job)."""
        async with self._lock:
            now = self._clock()
            if not fresh and self._read_at is not None and now - self._read_at < self._ttl:
                return self._snapshot
            self._read_at = now
            self.reads += 1
            try:
                self._snapshot = await read_snapshot(await self._slurm(), self.cluster)
            except (SlurmError, TokenError) as exc:
                log.warning(
                    "limits of %s not read (%s): %s",
                    self.cluster,
                    exc,
                    "the last ones are used" if self._snapshot else "nothing is checked",
                )
                return None if fresh else self._snapshot
            return self._snapshot
