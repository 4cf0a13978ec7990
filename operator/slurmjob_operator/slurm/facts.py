"""What the operator reads of the cluster itself: partitions, nodes, configuration, accounts, QOS
and slurmdbd's queue (the limits checked before a submit, the doctor)."""

from __future__ import annotations

from slurmjob_operator.slurm.nodes import (
    ConfFacts,
    NodeInfo,
    PartitionInfo,
    parse_conf,
    parse_dbd_queue,
    parse_names,
    parse_nodes,
    parse_partitions,
)
from slurmjob_operator.slurm.session import Session


class ClusterFacts(Session):
    """Reads of the cluster's configuration."""

    async def dbd_queue(self) -> int | None:
        """Job records slurmctld has yet to send to slurmdbd (`GET /diag`); None when the
        answer does not say."""
        template = self._routes.template("diag")
        answer = await self._routes.send("diag")
        return answer.parse(parse_dbd_queue, template)

    async def list_partitions(self) -> list[str]:
        """Names of the partitions the controller knows (those the submit checks see)."""
        return [p.name for p in await self.partitions()]

    async def partitions(self) -> list[PartitionInfo]:
        """Every partition with its state and limits, hidden ones included (`flags=ALL`,
        v0.0.40+; v0.0.38 shows those the operator's user may see)."""
        template = self._routes.template("partitions")
        params = None if self.version == "v0.0.38" else [("flags", "ALL")]
        answer = await self._routes.send("partitions", params=params)
        return answer.parse(parse_partitions, template)

    async def conf(self) -> ConfFacts | None:
        """What slurmctld's configuration says that submissions depend on (`GET /conf`,
        served from v0.0.45); None where this version does not serve it."""
        if self.version != "v0.0.45":
            return None
        template = self._routes.template("conf")
        answer = await self._routes.send("conf")
        return answer.parse(parse_conf, template)

    async def account_names(self) -> frozenset[str]:
        """The accounts slurmdbd knows (lower-cased); needs accounting."""
        template = self._routes.template("accounts")
        answer = await self._routes.send("accounts")
        return answer.parse(parse_names("accounts"), template)

    async def qos_names(self) -> frozenset[str]:
        """The QOS slurmdbd knows (lower-cased); needs accounting."""
        template = self._routes.template("qos")
        answer = await self._routes.send("qos")
        return answer.parse(parse_names("qos"), template)

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node with its features and state (for site checks, not for polling)."""
        template = self._routes.template("nodes")
        answer = await self._routes.send("nodes")
        return answer.parse(parse_nodes, template)
