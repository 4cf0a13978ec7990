"""Whether a submission can fit the cluster at all, decided before anything is staged.

Slurm accepts a job whose time limit is over its partition's MaxTime, or that asks for more
nodes, CPUs, memory or GPUs than any node of the partition has, and leaves it pending for
ever (`PartitionTimeLimit`, `ReqNodeNotAvail`...) unless the site enforces partition limits
at submit. The operator refuses such a request instead, and names the field and the limit.

Only what the cluster's answers show is refused: a limit that is unknown (unset, unlimited,
unreadable) or a node set that cannot be read refuses nothing. A partition that exists but is
down is not the spec's fault: `Verdict.unavailable` asks for a later try.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from slurmjob_operator.core.launch import JobComponent, LaunchRequest

#: A constraint that is one feature name; anything else (`a100|h100`, `[a&b]`) is an
#: expression whose node set is not worked out here, so no node is ruled out by it.
_FEATURE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class Partition:
    name: str
    up: bool | None = None
    """None: the state is not known."""
    state: str = ""
    default: bool = False
    max_time_minutes: int | None = None
    max_nodes: int | None = None
    max_cpus_per_node: int | None = None


@dataclass(frozen=True)
class Node:
    name: str
    partitions: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    cpus: int | None = None
    memory_mb: int | None = None
    gpus: int = 0


@dataclass(frozen=True)
class Snapshot:
    """One cluster's partitions and nodes (and, where accounting answers, its accounts and
    QOS), as read once per poll interval."""

    cluster: str
    partitions: Mapping[str, Partition]
    nodes: Sequence[Node] = ()
    accounts: frozenset[str] | None = None
    """Lower-cased; None: accounting does not answer, nothing is checked."""
    qos: frozenset[str] | None = None
    kills_invalid_dependencies: bool = False
    """DependencyParameters=kill_invalid_depend: Slurm cancels a job whose dependency can
    no longer be met, so `afterok` on a job that may be retried cannot be used."""


@dataclass(frozen=True)
class Refusal:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class Verdict:
    refusals: tuple[Refusal, ...] = ()
    """The request cannot fit; final until the spec changes."""
    unavailable: str | None = None
    """The partition exists but takes no jobs now; try again later."""
    checked: tuple[str, ...] = field(default=())
    """What was checked (for logs and tests): `partition`, `time`, `nodes`, `account`, `qos`."""

    @property
    def ok(self) -> bool:
        return not self.refusals and self.unavailable is None


def partition_of(name: str | None, snapshot: Snapshot) -> Partition | None:
    """The partition a job naming `name` goes to (None: the cluster's one default), if the
    snapshot has it."""
    if name is not None:
        return snapshot.partitions.get(name)
    defaults = [p for p in snapshot.partitions.values() if p.default]
    return defaults[0] if len(defaults) == 1 else None


def _named(text: str) -> str:
    """A name the spec wrote, as a message shows it: bounded (the spec's fields are not)."""
    return text if len(text) <= NAME_SHOWN else text[: NAME_SHOWN - 1] + "\u2026"


NAME_SHOWN = 200


def _gib(mb: int) -> str:
    return f"{mb / 1024:g} GiB"


def _fit(
    component: JobComponent, nodes: Sequence[Node], partition: str, excluded: Sequence[str] = ()
) -> str | None:
    """Why the component cannot be placed on the partition's nodes (less the `excluded`
    ones); None when it can, or when the nodes do not say enough to tell."""
    members = [n for n in nodes if partition in n.partitions]
    if not members or any(n.cpus is None or n.memory_mb is None for n in members):
        return None
    if excluded:
        members = [n for n in members if n.name not in excluded]
        if not members:
            return (
                f"every node of partition {partition} is excluded (nodes the collective "
                f"probe blamed: {', '.join(excluded)})"
            )
    feature = component.constraints
    plain = feature is not None and _FEATURE_RE.fullmatch(feature) is not None
    if plain:
        members = [n for n in members if feature in n.features]
        if not members:
            return f"no node of partition {partition} has feature {feature}"
    cpus = component.cpus_per_task * component.tasks_per_node
    fitting = [
        n
        for n in members
        if (n.cpus or 0) >= cpus
        and (n.memory_mb or 0) >= component.memory_mb
        and n.gpus >= component.gpus_per_node
    ]
    if len(fitting) >= component.nodes:
        return None
    largest = max(members, key=lambda n: (n.gpus, n.cpus or 0, n.memory_mb or 0))
    asked = f"{cpus} CPUs, {_gib(component.memory_mb)}"
    if component.gpus_per_node:
        asked += f", {component.gpus_per_node} GPUs"
    scope = f"partition {partition}" + (f" (feature {feature})" if plain else "")
    if excluded:
        scope += f" without the nodes the collective probe blamed ({', '.join(excluded)})"
    return (
        f"{component.nodes} node(s) with {asked} each requested; {scope} has "
        f"{len(fitting)} such node(s) of {len(members)} (largest: {largest.cpus} CPUs, "
        f"{_gib(largest.memory_mb or 0)}, {largest.gpus} GPUs)"
    )


def check(launch: LaunchRequest, snapshot: Snapshot, pools: Sequence[str] = ()) -> Verdict:
    """The verdict on one attempt's request. `pools`: the spec's pool names, in component
    order, so that a refusal names `spec.pools[i]`."""
    refusals: list[Refusal] = []
    checked: list[str] = []
    if launch.partition is not None and "," in launch.partition:
        # A list: Slurm takes the first that can run the job; only one that names no
        # partition at all is refused.
        names = [n.strip() for n in launch.partition.split(",") if n.strip()]
        if any(n in snapshot.partitions for n in names) or not snapshot.partitions:
            return Verdict(checked=("partition",))
        known = ", ".join(sorted(snapshot.partitions)[:20])
        message = (
            f"none of the partitions {_named(launch.partition)} exists on cluster "
            f"{snapshot.cluster}"
            f" (partitions: {known})"
        )
        return Verdict(refusals=(Refusal("spec.partition", message),), checked=("partition",))
    partition = partition_of(launch.partition, snapshot)
    if partition is None:
        if launch.partition is None or not snapshot.partitions:
            return Verdict(checked=("partition",))  # Slurm's default, or nothing read
        known = ", ".join(sorted(snapshot.partitions)[:20])
        return Verdict(
            refusals=(
                Refusal(
                    "spec.partition",
                    f"partition {_named(launch.partition)} does not exist on cluster "
                    f"{snapshot.cluster}"
                    f" (partitions: {known})",
                ),
            ),
            checked=("partition",),
        )
    checked.append("partition")
    limit = partition.max_time_minutes
    if launch.time_limit_minutes is not None and limit is not None:
        checked.append("time")
        if launch.time_limit_minutes > limit:
            refusals.append(
                Refusal(
                    "spec.timeLimit",
                    f"{launch.time_limit_minutes} minutes exceeds the MaxTime of partition "
                    f"{partition.name} ({limit} minutes)",
                )
            )
    for index, component in enumerate(launch.components):
        where = f"spec.pools[{index}]"
        name = pools[index] if index < len(pools) else component.pool
        checked.append("nodes")
        if partition.max_nodes is not None and component.nodes > partition.max_nodes:
            refusals.append(
                Refusal(
                    f"{where}.nodes",
                    f"pool {name}: {component.nodes} nodes exceeds the MaxNodes of partition "
                    f"{partition.name} ({partition.max_nodes})",
                )
            )
        cpus = component.cpus_per_task * component.tasks_per_node
        if partition.max_cpus_per_node is not None and cpus > partition.max_cpus_per_node:
            refusals.append(
                Refusal(
                    f"{where}.cpus",
                    f"pool {name}: {cpus} CPUs per node exceeds the MaxCPUsPerNode of "
                    f"partition {partition.name} ({partition.max_cpus_per_node})",
                )
            )
        problem = _fit(component, snapshot.nodes, partition.name, launch.excluded_nodes)
        if problem is not None:
            refusals.append(Refusal(where, f"pool {name}: {problem}"))
    if launch.account is not None and snapshot.accounts is not None:
        checked.append("account")
        if launch.account.lower() not in snapshot.accounts:
            refusals.append(
                Refusal(
                    "spec.account",
                    f"account {_named(launch.account)} does not exist in the accounting of "
                    "cluster "
                    f"{snapshot.cluster}",
                )
            )
    if launch.qos is not None and snapshot.qos is not None:
        checked.append("qos")
        if launch.qos.lower() not in snapshot.qos:
            refusals.append(
                Refusal(
                    "spec.qos",
                    f"QOS {_named(launch.qos)} does not exist in the accounting of cluster "
                    f"{snapshot.cluster}",
                )
            )
    unavailable = None
    if not refusals and partition.up is False:
        unavailable = (
            f"partition {partition.name} of cluster {snapshot.cluster} is "
            f"{partition.state or 'down'}: it takes no jobs now"
        )
    return Verdict(tuple(refusals), unavailable, tuple(checked))


class LimitExceeded(ValueError):
    """The request cannot fit the cluster (final until the spec changes)."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        self.messages = [str(r) for r in refusals]
        super().__init__("; ".join(self.messages))


class ProbeExhausted(LimitExceeded):
    """The request fits the cluster, but not without the nodes the collective probe blamed:
    the probe's new attempts are over (`Reason.PROBE_FAILED`)."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        super().__init__(refusals)
        self.messages = [
            "the collective probe failed on every rung and too few nodes remain without the "
            "ones it blamed",
            *self.messages,
        ]


class PartitionUnavailable(RuntimeError):
    """The partition takes no jobs now (down, drained, inactive)."""


def enforce(verdict: Verdict, without_exclusions: Verdict | None = None) -> None:
    """Raise what the verdict says stops the submission; `without_exclusions`: the same
    request judged without its excluded nodes (when it has some), which tells a request too
    big for the cluster from one the exclusions leave too few nodes."""
    if verdict.refusals:
        if without_exclusions is not None and not without_exclusions.refusals:
            raise ProbeExhausted(verdict.refusals)
        raise LimitExceeded(verdict.refusals)
    if verdict.unavailable is not None:
        raise PartitionUnavailable(verdict.unavailable)


#: The oldest a read may be for a refusal to be made on it (at most; the poll interval when
#: shorter). A refusal is final until the spec changes, so it is made on what the cluster
#: said a moment ago, yet no number of specs over the limits makes more reads than one per
#: this many seconds.
MAX_REFUSAL_AGE = 5.0


def refusal_age_for(poll_interval: float) -> float:
    return min(poll_interval, MAX_REFUSAL_AGE)


@dataclass(frozen=True)
class ReadTimes:
    """When the cluster's limits were read last (monotonic seconds)."""

    tried: float | None = None
    """The start of the last read, whether it succeeded or not."""
    good: float | None = None
    """The start of the last read that succeeded (the one kept)."""


class Source(Enum):
    KEPT = "kept"  # the kept answer (None when there is none)
    READ = "read"  # read the cluster now
    NOTHING = "nothing"  # None: nothing to refuse on until a read is allowed again


def limits_source(
    times: ReadTimes, now: float, *, fresh: bool, ttl: float, refusal_age: float
) -> Source:
    """Where the limits a submission is checked against come from. Not `fresh`: what was
    read within the poll interval (`ttl`), a failed read included (it is not tried again by
    every submission). `fresh` (what a refusal is made on): a successful read younger than
    `refusal_age`; else a new read, unless one was tried within `refusal_age` and failed:
    then nothing is refused before the next."""
    if not fresh:
        recent = times.tried is not None and now - times.tried < ttl
        return Source.KEPT if recent else Source.READ
    if times.good is not None and now - times.good < refusal_age:
        return Source.KEPT
    if times.tried is not None and now - times.tried < refusal_age:
        return Source.NOTHING
    return Source.READ
